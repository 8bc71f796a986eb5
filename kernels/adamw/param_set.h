// The parameter set the optimizer stages (`adamw`, `gradnorm`) work on: a model's parameters as
// separate tensors with a transformer's size mix, derived deterministically from a total and a
// count, and laid out in one padded arena per state so that every tensor starts aligned (as each
// allocation of PyTorch's caching allocator does).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "runtime/registry.h"

namespace tb::adamw {

enum class Dtype { fp32, bf16 };                   // of parameters and gradients; optimizer state is always fp32
Dtype dtype_from_string(const std::string& name);  // "fp32", "bf16"; throws UsageError
const char* to_string(Dtype dtype);
inline double element_bytes(Dtype dtype) { return dtype == Dtype::fp32 ? 4.0 : 2.0; }

// Every tensor starts at a multiple of this many elements of its arena (512 B for fp32, 256 B for
// bf16): 16-byte vector accesses are always aligned at a tensor's start.
inline constexpr int64_t arena_alignment = 128;

struct ParamSet {
  std::vector<int64_t> sizes;    // elements per tensor, in model order; zero-size tensors allowed
  std::vector<int64_t> starts;   // where each tensor starts in the concatenation of all tensors
  std::vector<int64_t> offsets;  // where each tensor starts in its padded arena
  int64_t total = 0;             // sum of sizes
  int64_t arena = 0;             // arena length in elements (total plus the padding)
  int64_t width = 0;             // the model width d the sizes came from (0 when the total is tiny)

  int64_t count() const { return static_cast<int64_t>(sizes.size()); }
  int64_t nonempty() const;  // tensors with at least one element
  int64_t largest() const;   // elements of the largest tensor
};

// `tensors` tensors holding `total` elements: a token embedding first and an untied output head last
// (between them at least 1/8 of the total), and in between the 12 tensors of a transformer layer,
// repeated (norm scales and biases of d, QKV 3d x d, attention projection d x d, MLP 4d x d and
// d x 4d, their biases), with the largest width d that fits. Small totals give d = 0, hence
// zero-size tensors. Throws UsageError when total < 1 or tensors < 1.
ParamSet make_param_set(int64_t total, int64_t tensors);

// A piece of one tensor: the unit a block (CUDA) or a loop iteration (CPU) of a multi-tensor pass
// works on. Chunks come in tensor order; zero-size tensors have none.
struct Chunk {
  int64_t tensor;
  int64_t begin;  // first element, within the tensor
  int64_t len;
};
std::vector<Chunk> make_chunks(const ParamSet& set, int64_t chunk_elements);

// PyTorch's multi_tensor_apply: the launches of one foreach op over all tensors, each launch
// carrying at most `max_tensors` tensors and `max_blocks` chunks in its kernel parameters (a tensor
// cut by the block limit continues in the next launch).
struct ListLaunch {
  std::vector<int64_t> tensors;                 // the tensors of this launch
  std::vector<std::pair<int, int64_t>> blocks;  // per block: (index into `tensors`, chunk number)
};
std::vector<ListLaunch> plan_list_launches(const ParamSet& set, int max_tensors, int max_blocks, int64_t chunk_elements);

// Deterministic contents: element i of the concatenation is uniform_at(seed, i) in [-1, 1), rounded
// to bf16 where the dtype is bf16, so a reference regenerates any element without a copy.
inline constexpr uint64_t seed_param = 41, seed_grad = 42;
float initial_value(uint64_t seed, int64_t index, Dtype dtype);

// bf16 bits of x, rounded to nearest even (what __float2bfloat16_rn stores).
inline uint16_t to_bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Element access for the CPU variants: fp32 as is, bf16 bits widened on load and rounded on store;
// plain integer and float operations, so that loops over them vectorise.
inline float load_float(const float* x, int64_t i) { return x[i]; }
inline float load_float(const uint16_t* x, int64_t i) {
  const uint32_t u = static_cast<uint32_t>(x[i]) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline void store_float(float* x, int64_t i, float v) { x[i] = v; }
inline void store_float(uint16_t* x, int64_t i, float v) { x[i] = to_bf16_bits(v); }

// Fill an arena (padding zeroed) with the deterministic contents, over `chunks` in the same
// OpenMP static schedule the CPU variants use (first touch by the thread that will stream it).
void fill_arena(const ParamSet& set, const std::vector<Chunk>& chunks, uint64_t seed, float* arena);
void fill_arena_bf16(const ParamSet& set, const std::vector<Chunk>& chunks, uint64_t seed, uint16_t* arena);
void zero_arena(const ParamSet& set, const std::vector<Chunk>& chunks, float* arena);

// The concatenation (no padding) of an arena, widened to float.
std::vector<float> gather(const ParamSet& set, const float* arena);
std::vector<float> gather_bf16(const ParamSet& set, const uint16_t* arena);

// Why `bytes` of host (cpu) or device (cuda) memory cannot be allocated here, or "".
std::string memory_reason(Backend backend, double bytes);

}  // namespace tb::adamw

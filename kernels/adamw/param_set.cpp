#include "param_set.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "runtime/device_info.h"
#include "runtime/error.h"
#include "runtime/random.h"

namespace tb::adamw {

Dtype dtype_from_string(const std::string& name) {
  if (name == "fp32") return Dtype::fp32;
  if (name == "bf16") return Dtype::bf16;
  throw UsageError("unknown dtype '" + name + "' (fp32, bf16)");
}

const char* to_string(Dtype dtype) { return dtype == Dtype::fp32 ? "fp32" : "bf16"; }

int64_t ParamSet::nonempty() const {
  return std::count_if(sizes.begin(), sizes.end(), [](int64_t n) { return n > 0; });
}

int64_t ParamSet::largest() const { return sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end()); }

namespace {

// One transformer layer's tensors, as multiples of d*d and d (GPT-2 order).
struct Role {
  int64_t per_d2, per_d;
};
constexpr Role layer_roles[] = {
    {0, 1},  // ln_1.weight
    {0, 1},  // ln_1.bias
    {3, 0},  // attn.c_attn.weight (QKV)
    {0, 3},  // attn.c_attn.bias
    {1, 0},  // attn.c_proj.weight
    {0, 1},  // attn.c_proj.bias
    {0, 1},  // ln_2.weight
    {0, 1},  // ln_2.bias
    {4, 0},  // mlp.c_fc.weight
    {0, 4},  // mlp.c_fc.bias
    {4, 0},  // mlp.c_proj.weight
    {0, 1},  // mlp.c_proj.bias
};
constexpr int64_t roles_per_layer = sizeof(layer_roles) / sizeof(layer_roles[0]);

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

}  // namespace

ParamSet make_param_set(int64_t total, int64_t tensors) {
  if (total < 1) throw UsageError("params must be at least 1 (got " + std::to_string(total) + ")");
  if (tensors < 1) throw UsageError("tensors must be at least 1 (got " + std::to_string(tensors) + ")");
  const int64_t layer_tensors = std::max<int64_t>(tensors - 2, 0);
  int64_t a = 0, b = 0;  // the layer tensors hold a*d*d + b*d elements
  for (int64_t k = 0; k < layer_tensors; ++k) {
    a += layer_roles[k % roles_per_layer].per_d2;
    b += layer_roles[k % roles_per_layer].per_d;
  }
  // The largest d whose layers leave at least 1/8 of the total to the embedding and the head.
  const int64_t budget = total - (total + 7) / 8;
  auto layers_size = [&](int64_t d) { return a * d * d + b * d; };
  int64_t d = 0;
  if (a > 0) d = static_cast<int64_t>((std::sqrt(double(b) * b + 4.0 * a * budget) - b) / (2.0 * a));
  else if (b > 0) d = budget / b;
  while (d > 0 && layers_size(d) > budget) --d;
  while ((a > 0 || b > 0) && layers_size(d + 1) <= budget) ++d;

  ParamSet set;
  set.total = total;
  set.width = d;
  const int64_t embedding = total - layers_size(d);
  set.sizes.push_back(tensors == 1 ? total : embedding / 2);  // token embedding
  for (int64_t k = 0; k < layer_tensors; ++k) {
    const Role r = layer_roles[k % roles_per_layer];
    set.sizes.push_back(r.per_d2 * d * d + r.per_d * d);
  }
  if (tensors > 1) set.sizes.push_back(embedding - embedding / 2);  // output head (untied)

  int64_t start = 0, offset = 0;
  for (const int64_t n : set.sizes) {
    set.starts.push_back(start);
    set.offsets.push_back(offset);
    start += n;
    offset = round_up(offset + n, arena_alignment);
  }
  set.arena = std::max<int64_t>(offset, 1);
  return set;
}

std::vector<Chunk> make_chunks(const ParamSet& set, int64_t chunk_elements) {
  std::vector<Chunk> chunks;
  for (int64_t t = 0; t < set.count(); ++t)
    for (int64_t begin = 0; begin < set.sizes[t]; begin += chunk_elements)
      chunks.push_back(Chunk{t, begin, std::min(chunk_elements, set.sizes[t] - begin)});
  return chunks;
}

std::vector<ListLaunch> plan_list_launches(const ParamSet& set, int max_tensors, int max_blocks, int64_t chunk_elements) {
  std::vector<ListLaunch> launches;
  ListLaunch current;
  for (int64_t t = 0; t < set.count(); ++t) {
    const int64_t n = set.sizes[t];
    if (n == 0) continue;
    current.tensors.push_back(t);
    const int64_t chunks = (n + chunk_elements - 1) / chunk_elements;
    for (int64_t c = 0; c < chunks; ++c) {
      current.blocks.emplace_back(static_cast<int>(current.tensors.size()) - 1, c);
      const bool tensors_full = static_cast<int>(current.tensors.size()) == max_tensors && c == chunks - 1;
      const bool blocks_full = static_cast<int>(current.blocks.size()) == max_blocks;
      if (tensors_full || blocks_full) {
        launches.push_back(std::move(current));
        current = ListLaunch{};
        if (c != chunks - 1) current.tensors.push_back(t);  // the rest of this tensor goes on
      }
    }
  }
  if (!current.blocks.empty()) launches.push_back(std::move(current));
  return launches;
}

float initial_value(uint64_t seed, int64_t index, Dtype dtype) {
  const float x = uniform_at(seed, static_cast<uint64_t>(index));
  return dtype == Dtype::bf16 ? round_to_bf16(x) : x;
}

namespace {

// Writes every chunk's elements and, with the last chunk of a tensor, the padding after it.
template <class T, class Value>
void fill(const ParamSet& set, const std::vector<Chunk>& chunks, T* arena, Value value) {
  const auto count = static_cast<int64_t>(chunks.size());
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < count; ++c) {
    const Chunk ch = chunks[c];
    T* out = arena + set.offsets[ch.tensor];
    const int64_t start = set.starts[ch.tensor];
    for (int64_t i = ch.begin; i < ch.begin + ch.len; ++i) out[i] = value(start + i);
    if (ch.begin + ch.len == set.sizes[ch.tensor]) {
      const int64_t end = round_up(set.offsets[ch.tensor] + set.sizes[ch.tensor], arena_alignment);
      for (int64_t i = set.sizes[ch.tensor]; set.offsets[ch.tensor] + i < end; ++i) out[i] = T{0};
    }
  }
}

}  // namespace

void fill_arena(const ParamSet& set, const std::vector<Chunk>& chunks, uint64_t seed, float* arena) {
  fill(set, chunks, arena, [seed](int64_t i) { return initial_value(seed, i, Dtype::fp32); });
}

void fill_arena_bf16(const ParamSet& set, const std::vector<Chunk>& chunks, uint64_t seed, uint16_t* arena) {
  fill(set, chunks, arena, [seed](int64_t i) { return to_bf16_bits(uniform_at(seed, static_cast<uint64_t>(i))); });
}

void zero_arena(const ParamSet& set, const std::vector<Chunk>& chunks, float* arena) {
  fill(set, chunks, arena, [](int64_t) { return 0.0f; });
}

std::vector<float> gather(const ParamSet& set, const float* arena) {
  std::vector<float> out(static_cast<std::size_t>(set.total));
  for (int64_t t = 0; t < set.count(); ++t)
    std::copy(arena + set.offsets[t], arena + set.offsets[t] + set.sizes[t], out.begin() + set.starts[t]);
  return out;
}

std::vector<float> gather_bf16(const ParamSet& set, const uint16_t* arena) {
  std::vector<float> out(static_cast<std::size_t>(set.total));
  for (int64_t t = 0; t < set.count(); ++t)
    for (int64_t i = 0; i < set.sizes[t]; ++i) out[set.starts[t] + i] = bf16_bits_to_float(arena[set.offsets[t] + i]);
  return out;
}

std::string memory_reason(Backend backend, double bytes) {
  return backend == Backend::cpu ? host_memory_reason(bytes) : device_memory_reason(bytes);
}

}  // namespace tb::adamw

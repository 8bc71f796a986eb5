// Stage `alloc`: what allocating a step's activations costs. Each step allocates a set of
// activation-sized buffers, has a kernel write each, reads them all back into a checksum and frees
// them: with cudaMalloc/cudaFree, with a stream-ordered pool (cudaMallocAsync), with buffers
// allocated once and reused, and with the pool emptied after the step (the `empty_cache` of
// docs/sources.md#002-trainer2, "10-100 ms stall"). GPU-only; this header and the reference are tested anywhere.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/random.h"
#include "runtime/registry.h"

namespace tb::alloc {

enum class Strategy {
  malloc_free,  // cudaMalloc and cudaFree per buffer per step (cudaFree synchronises the device)
  pool,         // cudaMallocFromPoolAsync / cudaFreeAsync on a pool that keeps what it has mapped
  reuse,        // allocated once, reused every step: the floor
  empty_cache,  // the pool, then a synchronise and cudaMemPoolTrimTo(0) after every step
};
const char* to_string(Strategy strategy);

// What one step (one call) asks of the allocator.
struct StepPlan {
  int64_t allocations = 0;  // and as many frees
  int64_t kernels = 0;      // a writer per buffer and one reader of them all
  int64_t releases = 0;     // empty_cache-style trims
};
StepPlan step_plan(Strategy strategy, int64_t buffers);
// Bytes a step's kernels move: each writer stores its probes, the reader loads them and adds each
// into the 8-byte checksum. Tiny by design: what the rows differ by is the allocator.
double step_bytes(int64_t buffers);

// A step writes these words (4 bytes each) of every buffer and reads them back: the first, the
// middle and the last, so a buffer that overlapped another live one would change the checksum.
inline constexpr int probes_per_buffer = 3;
inline constexpr int64_t min_buffer_bytes = 4 * probes_per_buffer;  // three distinct words

TB_HOST_DEVICE inline int64_t probe_word(int64_t words, int probe) {
  return probe == 0 ? 0 : probe == 1 ? words / 2 : words - 1;
}
TB_HOST_DEVICE inline uint32_t probe_value(int64_t step, int64_t buffer, int probe) {
  const uint64_t key = (static_cast<uint64_t>(step) << 20) ^ (static_cast<uint64_t>(buffer) << 4) ^
                       static_cast<uint64_t>(probe);
  return static_cast<uint32_t>(splitmix64(key) >> 32);
}

// ---- reference ----------------------------------------------------------------------------------
// The checksum (sum modulo 2^64 of every probe value) after steps [0, steps) of `buffers` buffers.
uint64_t reference_checksum(int64_t steps, int64_t buffers);
Verdict check_checksum(uint64_t got, uint64_t want, int64_t steps);

// Why a problem cannot run ("" when it can): buffer sizes and counts the kernels cannot take.
std::string shape_reason(int64_t buffers, int64_t buffer_bytes);

// ---- CUDA variants (alloc_cuda.cu) -----------------------------------------------------------------
std::unique_ptr<Instance> make_cuda(const Problem& problem, const RunContext& context, Strategy strategy);

}  // namespace tb::alloc

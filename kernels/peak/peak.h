// Stage `peak`: the machine's measured ceilings (STREAM copy and triad, host<->device transfers,
// GEMM per dtype). Every other stage reports its rate as a % of these, measured on the same machine
// in the same run, never a datasheet figure.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "runtime/random.h"
#include "runtime/registry.h"

namespace tb::peak {

inline constexpr double triad_scalar = 3.0;
inline constexpr uint64_t seed_a = 11, seed_b = 12, seed_c = 13;
// The memory ceiling's read-modify-write mix (AdamW's shape): m = d m + g, v = d v + g^2, p -= r m.
inline constexpr double rmw_decay = 0.5, rmw_rate = 1e-3;

enum class GemmType { fp32, tf32, bf16 };

// ---- reference: plain loops, the oracle -------------------------------------------------------
// Checks dst against src element by element (bit-exact).
Verdict check_copy(const double* dst, const double* src, int64_t n);
// Checks a = b + s * c for every element.
Verdict check_triad(const double* a, const double* b, const double* c, int64_t n);
// GEMM C = A * B (n x n, column-major, A and B from uniform_at(seed_a / seed_b), rounded to bf16 for
// GemmType::bf16) is checked at these entries (corners and a fixed random sample: a full double
// reference of a large GEMM would take longer than the benchmark) ...
// Checks the read mix's sum of x_i^2 over x_i = uniform_at(seed_a, i), i < n (summed in another order).
Verdict check_sum_of_squares(double sum, int64_t n);
// Checks one call of the read-modify-write mix from p, m, v drawn from seed_a, seed_c, seed_c + 1 and g
// from seed_b (uniform_at at each stream's own index).
Verdict check_rmw(const double* p, const double* g, const double* m, const double* v, int64_t n);
// The same with bf16 p and g (bits, truncated from uniform_at's floats) and float m, v; p is truncated
// to bf16 after its update.
Verdict check_rmw_bf16(const uint16_t* p, const uint16_t* g, const float* m, const float* v, int64_t n);
std::vector<std::pair<int64_t, int64_t>> gemm_check_positions(int64_t n);
// ... against a double dot product, the error normalised by sum_k |a_ik b_kj|.
Verdict check_gemm_entries(int64_t n, GemmType type, const std::vector<std::pair<int64_t, int64_t>>& where,
                           const std::vector<double>& got);

// ---- CPU variants (peak_cpu.cpp) -----------------------------------------------------------------
std::unique_ptr<Instance> make_cpu_copy(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cpu_triad(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cpu_memory(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cpu_triad_1thread(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cpu_gemm_fp32(const Problem&, const RunContext&);

// ---- where the CPU's caches end for a streaming kernel (cache_sweep.cpp) ------------------------------
// The reported last-level cache can mislead (a 2-vCPU VM reports a host's 300 MiB L3): whether a
// working set stays in a cache for these cores is what the copy's bandwidth over growing working sets
// shows. The sweep doubles the footprint (source + destination) from sweep_smallest_bytes to at
// least sweep_largest_bytes (or 4x the reported cache, if larger).
inline constexpr double sweep_smallest_bytes = 1 << 20;
inline constexpr double sweep_largest_bytes = 1 << 30;
inline constexpr double sweep_repeat_s = 0.02;  // each timed repeat of a size: calls of at least this long
inline constexpr int sweep_repeats = 3;         // the fastest of these repeats counts
// A size runs at DRAM's bandwidth when its rate is within this fraction of the largest sizes'.
inline constexpr double sweep_dram_tolerance = 0.15;

struct SweepPoint {
  double footprint_bytes = 0;  // bytes one copy touches: its source and its destination
  double bytes_per_s = 0;      // read + written per second (the fastest repeat)
};
// The copy's bandwidth at each footprint, with OpenMP's team, smallest first; each size takes about
// sweep_repeats x sweep_repeat_s whatever the machine's load. `go_on`, asked before each size, ends
// the sweep early when it says false (the sizes measured so far are returned).
std::vector<SweepPoint> copy_bandwidth_sweep(double largest_footprint_bytes, const std::function<bool()>& go_on = {});
// The footprint from which the copy runs at DRAM's bandwidth: the smallest swept size from which every
// larger one is within sweep_dram_tolerance of the plateau (the median rate of the two largest sizes).
// A row whose working set is below it may run from a cache. 0 when the curve shows no fall (every size
// at the plateau: the cache is below the smallest size or above the largest, the sweep cannot tell) or
// has fewer than 3 points.
double cache_threshold_from_sweep(const std::vector<SweepPoint>& curve);

// ---- CUDA variants (peak_cuda.cu) ----------------------------------------------------------------
std::unique_ptr<Instance> make_cuda_copy(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cuda_triad(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cuda_transfer(const Problem&, const RunContext&, bool to_device, bool pinned);
std::unique_ptr<Instance> make_cuda_gemm(const Problem&, const RunContext&, GemmType type);

}  // namespace tb::peak

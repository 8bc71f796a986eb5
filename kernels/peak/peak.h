// Stage `peak`: the machine's measured ceilings (STREAM copy and triad, host<->device transfers,
// GEMM per dtype). Every other stage reports its rate as a % of these, measured on the same machine
// in the same run, never a datasheet figure.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "runtime/random.h"
#include "runtime/registry.h"

namespace tb::peak {

inline constexpr double triad_scalar = 3.0;
inline constexpr uint64_t seed_a = 11, seed_b = 12, seed_c = 13;

enum class GemmType { fp32, tf32, bf16 };

// ---- reference: plain loops, the oracle -------------------------------------------------------
// Checks dst against src element by element (bit-exact).
Verdict check_copy(const double* dst, const double* src, int64_t n);
// Checks a = b + s * c for every element.
Verdict check_triad(const double* a, const double* b, const double* c, int64_t n);
// GEMM C = A * B (n x n, column-major, A and B from uniform_at(seed_a / seed_b), rounded to bf16 for
// GemmType::bf16) is checked at these entries (corners and a fixed random sample: a full double
// reference of a large GEMM would take longer than the benchmark) ...
std::vector<std::pair<int64_t, int64_t>> gemm_check_positions(int64_t n);
// ... against a double dot product, the error normalised by sum_k |a_ik b_kj|.
Verdict check_gemm_entries(int64_t n, GemmType type, const std::vector<std::pair<int64_t, int64_t>>& where,
                           const std::vector<double>& got);

// ---- CPU variants (peak_cpu.cpp) -----------------------------------------------------------------
std::unique_ptr<Instance> make_cpu_copy(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cpu_triad(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cpu_triad_1thread(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cpu_gemm_fp32(const Problem&, const RunContext&);

// ---- CUDA variants (peak_cuda.cu) ----------------------------------------------------------------
std::unique_ptr<Instance> make_cuda_copy(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cuda_triad(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cuda_transfer(const Problem&, const RunContext&, bool to_device, bool pinned);
std::unique_ptr<Instance> make_cuda_gemm(const Problem&, const RunContext&, GemmType type);

}  // namespace tb::peak

// The oracle for `peak`: plain loops, in double where it matters.
#include <cmath>
#include <sstream>
#include <vector>

#include "peak.h"
#include "runtime/defaults.h"
#include "runtime/random.h"
#include "runtime/tolerance.h"

namespace tb::peak {

static Verdict mismatch(const char* what, int64_t at, double got, double want, double max_error) {
  std::ostringstream msg;
  msg.precision(9);
  msg << what << "[" << at << "] = " << got << ", reference " << want;
  return Verdict{false, max_error, msg.str()};
}

Verdict check_copy(const double* dst, const double* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (dst[i] != src[i]) return mismatch("copy", i, dst[i], src[i], std::abs(dst[i] - src[i]));
  return Verdict{true, 0.0, ""};
}

Verdict check_triad(const double* a, const double* b, const double* c, int64_t n) {
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double want = b[i] + triad_scalar * c[i];
    worst = std::max(worst, std::abs(a[i] - want));
    if (!tolerance::fp64.accepts(a[i], want)) return mismatch("triad", i, a[i], want, worst);
  }
  return Verdict{true, worst, ""};
}

std::vector<std::pair<int64_t, int64_t>> gemm_check_positions(int64_t n) {
  std::vector<std::pair<int64_t, int64_t>> where{{0, 0}, {n - 1, n - 1}, {0, n - 1}, {n - 1, 0}};
  const auto un = static_cast<uint64_t>(n);
  for (int e = 0; e < defaults::gemm_checked_entries; ++e)
    where.emplace_back(static_cast<int64_t>(splitmix64(2 * e) % un), static_cast<int64_t>(splitmix64(2 * e + 1) % un));
  return where;
}

Verdict check_gemm_entries(int64_t n, GemmType type, const std::vector<std::pair<int64_t, int64_t>>& where,
                           const std::vector<double>& got) {
  const double tol = type == GemmType::fp32   ? tolerance::gemm_fp32
                     : type == GemmType::tf32 ? tolerance::gemm_tf32
                                              : tolerance::gemm_bf16;
  auto input = [type](uint64_t seed, uint64_t index) {
    const float x = uniform_at(seed, index);
    return static_cast<double>(type == GemmType::bf16 ? round_to_bf16(x) : x);
  };
  double worst = 0;
  for (std::size_t e = 0; e < where.size(); ++e) {
    const auto [i, j] = where[e];
    double dot = 0, scale = 0;
    for (int64_t k = 0; k < n; ++k) {
      const double p = input(seed_a, static_cast<uint64_t>(i + k * n)) * input(seed_b, static_cast<uint64_t>(k + j * n));
      dot += p;
      scale += std::abs(p);
    }
    const double err = std::abs(got[e] - dot) / std::max(scale, 1e-30);
    worst = std::max(worst, std::isfinite(got[e]) ? err : INFINITY);
    if (!(err <= tol)) {
      std::ostringstream msg;
      msg << "C(" << i << "," << j << ") = " << got[e] << ", reference " << dot << " (error " << err
          << " of sum|a*b|, tolerance " << tol << ")";
      return Verdict{false, worst, msg.str()};
    }
  }
  return Verdict{true, worst, ""};
}

}  // namespace tb::peak

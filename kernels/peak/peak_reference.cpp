// The oracle for `peak`: plain loops, in double where it matters.
#include <cmath>
#include <cstring>
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

Verdict check_sum_of_squares(double sum, int64_t n) {
  long double want = 0;  // each term exact in double (a float squared); the order differs from the row's
  for (int64_t i = 0; i < n; ++i) {
    const double x = uniform_at(seed_a, i);
    want += x * x;
  }
  const double error = std::abs(sum - static_cast<double>(want)) / static_cast<double>(want);
  if (error > 1e-10) return mismatch("read sum of squares", n, sum, static_cast<double>(want), error);
  return Verdict{true, error, ""};
}

Verdict check_rmw(const double* p, const double* g, const double* m, const double* v, int64_t n) {
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double gi = uniform_at(seed_b, i);
    const double want_m = rmw_decay * uniform_at(seed_c, i) + gi;
    const double want_v = rmw_decay * uniform_at(seed_c + 1, i) + gi * gi;
    const double want_p = uniform_at(seed_a, i) - rmw_rate * want_m;
    if (g[i] != gi) return mismatch("read-modify-write g (read only)", i, g[i], gi, std::abs(g[i] - gi));
    const double got[3] = {m[i], v[i], p[i]}, want[3] = {want_m, want_v, want_p};
    const char* names[3] = {"read-modify-write m", "read-modify-write v", "read-modify-write p"};
    for (int k = 0; k < 3; ++k) {
      worst = std::max(worst, std::abs(got[k] - want[k]));
      if (!tolerance::fp64.accepts(got[k], want[k])) return mismatch(names[k], i, got[k], want[k], worst);
    }
  }
  return Verdict{true, worst, ""};
}

static float bf16_truncated(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u &= 0xffff0000u;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

Verdict check_rmw_bf16(const uint16_t* p, const uint16_t* g, const float* m, const float* v, int64_t n) {
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double gi = bf16_truncated(uniform_at(seed_b, i));
    const double want_m = rmw_decay * uniform_at(seed_c, i) + gi;
    const double want_v = rmw_decay * uniform_at(seed_c + 1, i) + gi * gi;
    const double want_p = bf16_truncated(uniform_at(seed_a, i)) - rmw_rate * want_m;
    if (bf16_bits_to_float(g[i]) != gi)
      return mismatch("read-modify-write g (read only)", i, bf16_bits_to_float(g[i]), gi, 0);
    const double got[3] = {m[i], v[i], bf16_bits_to_float(p[i])}, want[3] = {want_m, want_v, want_p};
    const Tolerance* tol[3] = {&tolerance::fp32, &tolerance::fp32, &tolerance::bf16};
    const char* names[3] = {"read-modify-write m", "read-modify-write v", "read-modify-write p (bf16)"};
    for (int k = 0; k < 3; ++k) {
      worst = std::max(worst, std::abs(got[k] - want[k]));
      if (!tol[k]->accepts(got[k], want[k])) return mismatch(names[k], i, got[k], want[k], worst);
    }
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

// Where the CPU's caches end for a streaming kernel: the copy's bandwidth over working sets of growing
// size, and the size from which it is DRAM's.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "peak.h"
#include "runtime/host_buffer.h"

namespace tb::peak {

namespace {

void copy_prefix(double* __restrict dst, const double* __restrict src, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

double seconds_of(int64_t calls, double* dst, const double* src, int64_t n) {
  const auto start = std::chrono::steady_clock::now();
  for (int64_t k = 0; k < calls; ++k) copy_prefix(dst, src, n);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

std::vector<SweepPoint> copy_bandwidth_sweep(double largest_footprint_bytes) {
  const auto largest_n = static_cast<int64_t>(largest_footprint_bytes / (2 * sizeof(double)));
  HostBuffer<double> src(static_cast<std::size_t>(largest_n)), dst(static_cast<std::size_t>(largest_n));
  // Every page written once, by the threads that copy it (the copies' static schedule).
  double *s = src.data(), *d = dst.data();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < largest_n; ++i) {
    s[i] = static_cast<double>(i);
    d[i] = 0.0;
  }
  std::vector<SweepPoint> curve;
  for (double footprint = sweep_smallest_bytes; footprint <= largest_footprint_bytes * 1.0001; footprint *= 2) {
    const auto n = static_cast<int64_t>(footprint / (2 * sizeof(double)));
    // Calls per repeat: enough for sweep_repeat_s, from one call's time after a warm one.
    copy_prefix(d, s, n);
    const double one = std::max(seconds_of(1, d, s, n), 1e-7);
    const auto calls = static_cast<int64_t>(std::ceil(sweep_repeat_s / one));
    double best = 0;
    for (int r = 0; r < sweep_repeats; ++r) {
      const double per_call = seconds_of(calls, d, s, n) / static_cast<double>(calls);
      best = r == 0 ? per_call : std::min(best, per_call);
    }
    curve.push_back(SweepPoint{footprint, 2.0 * sizeof(double) * static_cast<double>(n) / best});
  }
  return curve;
}

double cache_threshold_from_sweep(const std::vector<SweepPoint>& curve) {
  if (curve.size() < 3) return 0;
  const std::size_t last = curve.size() - 1;
  const double plateau = 0.5 * (curve[last].bytes_per_s + curve[last - 1].bytes_per_s);
  const double at_dram = plateau * (1 + sweep_dram_tolerance);
  // From the largest size down, while the sizes still run at DRAM's bandwidth.
  std::size_t first_at_dram = curve.size();
  while (first_at_dram > 0 && curve[first_at_dram - 1].bytes_per_s <= at_dram) --first_at_dram;
  // No fall anywhere in the sweep, or not even its largest sizes agree on a plateau: it cannot tell.
  if (first_at_dram == 0 || first_at_dram == curve.size()) return 0;
  return curve[first_at_dram].footprint_bytes;
}

}  // namespace tb::peak

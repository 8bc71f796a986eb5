// Where the CPU's caches end for a streaming kernel: the copy's bandwidth over working sets of growing
// size, and the size from which it is DRAM's.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>

#include "peak.h"
#include "runtime/host_buffer.h"

namespace tb::peak {

namespace {

void copy_prefix(double* __restrict dst, const double* __restrict src, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

// Seconds per call, from calls repeated until `at_least_s` have passed (a call is never cut): on a
// loaded machine a call can take far longer than the first one did, so the repeat is bounded by time,
// not by a count.
double seconds_per_call(double* dst, const double* src, int64_t n, double at_least_s) {
  const auto start = std::chrono::steady_clock::now();
  int64_t calls = 0;
  double elapsed = 0;
  do {
    copy_prefix(dst, src, n);
    ++calls;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (elapsed < at_least_s);
  return elapsed / static_cast<double>(calls);
}

}  // namespace

std::vector<SweepPoint> copy_bandwidth_sweep(double largest_footprint_bytes, const std::function<bool()>& go_on) {
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
    if (go_on && !go_on()) break;
    const auto n = static_cast<int64_t>(footprint / (2 * sizeof(double)));
    copy_prefix(d, s, n);  // its lines in whichever cache holds them
    double best = 0;
    for (int r = 0; r < sweep_repeats; ++r) {
      const double per_call = seconds_per_call(d, s, n, sweep_repeat_s);
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

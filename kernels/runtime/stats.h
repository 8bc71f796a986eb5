// Statistics over repetition samples: the median with a distribution-free interval, a noise flag,
// and the ratio of two sample sets with its interval. No assumption of normality: timings are skewed.
#pragma once

#include <cstddef>
#include <vector>

namespace tb {

struct Summary {
  std::size_t n = 0;
  double median = 0;
  double ci_low = 0;
  double ci_high = 0;
  double ci_level = 0;        // the coverage the interval actually has
  double rel_half_width = 0;  // (ci_high - ci_low) / (2 * median)
  bool noisy = false;         // rel_half_width above the noise target
};

double median_of(std::vector<double> values);

// Median and the order-statistic interval [x_(k), x_(n+1-k)] with the largest k whose coverage is
// at least `level`; with too few samples for that, [min, max] and its (lower) coverage.
Summary summarize(const std::vector<double>& samples, double noise_target, double level = 0.95);

struct RatioEstimate {
  double ratio = 0;  // baseline / improved: > 1 means the improved variant is faster
  double ci_low = 0;
  double ci_high = 0;
  double ci_level = 0;
};

// Hodges-Lehmann estimate of the ratio of two timing distributions: the median of all pairwise
// ratios b_i / a_j, with the Mann-Whitney (normal approximation) interval on the log scale.
RatioEstimate ratio_estimate(const std::vector<double>& baseline, const std::vector<double>& improved,
                             double level = 0.95);

// The same ratio from paired rounds (baseline[r] and improved[r] taken one after the other in round r,
// as an A/B comparison takes them): the Hodges-Lehmann estimate of the per-round log ratios (the median
// of their Walsh averages) and its interval from the exact signed-rank distribution, as
// scripts/compare --interleave computes it. A drift that slows both sides of a round cancels in its
// ratio. Only the first min(sizes) rounds are paired; with too few for `level`, the interval is the
// smallest to the largest Walsh average and ci_level says its coverage (1 - 2 / 2^rounds).
RatioEstimate paired_ratio_estimate(const std::vector<double>& baseline, const std::vector<double>& improved,
                                    double level = 0.95);

}  // namespace tb

// Statistics over repetition samples: the median with a distribution-free interval, a noise flag,
// and the ratio of two sample sets with its interval. No assumption of normality where timings are
// judged one by one (they are skewed); Student's t only for means of per-round log ratios.
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

// The Hodges-Lehmann estimate of a location: the median of the Walsh averages (x_i + x_j) / 2, i <= j.
// Robust to one wild value (a slice that ran while something else took the cores) where a mean is not.
double hodges_lehmann(const std::vector<double>& values);

// Student's t distribution with `dof` degrees of freedom (dof > 0, not necessarily whole): P(T <= t),
// from the regularised incomplete beta function, and its p-quantile (p in (0, 1)) by bisection.
double student_t_cdf(double t, double dof);
double student_t_quantile(double p, double dof);

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
RatioEstimate ratio_estimate(const std::vector<double>& baseline, const std::vector<double>& improved, double level = 0.95);

// The same ratio from paired rounds (baseline[r] and improved[r] taken one after the other in round r,
// as an A/B comparison takes them): the Hodges-Lehmann estimate of the per-round log ratios (the median
// of their Walsh averages) and its interval from the exact signed-rank distribution, as
// scripts/compare --interleave computes it. A drift that slows both sides of a round cancels in its
// ratio. Only the first min(sizes) rounds are paired; with too few for `level`, the interval is the
// smallest to the largest Walsh average and ci_level says its coverage (1 - 2 / 2^rounds).
RatioEstimate paired_ratio_estimate(const std::vector<double>& baseline, const std::vector<double>& improved,
                                    double level = 0.95);

// The ratio of `a` to `b` from paired rounds (a[r] and b[r] taken in round r, r < min(sizes); values > 0)
// with the paired t test's interval, as the tuner's race judges its finalists: d_r = log(a_r / b_r), the
// ratio is exp of their Hodges-Lehmann estimate, the interval exp of the Student t interval of their mean
// at `level`. One wild round hardly moves the estimate and widens the interval: a verdict on it is more
// cautious, never bolder. One round: the interval is (0, inf) (ci_level 1), nothing being known of the
// spread.
RatioEstimate paired_t_ratio_estimate(const std::vector<double>& a, const std::vector<double>& b, double level = 0.95);

// One estimate with its interval's half-width: a measurement's centre and spread.
struct Estimate {
  double value = 0;
  double half_width = 0;
};

// Two measurements of one quantity as one: their inverse-variance weighted mean, taking each half-width
// as a standard error (a half-width of 0 counts as one part in a million of the value, so that one
// exact-looking measurement does not erase the other), and the pooled half-width 1 / sqrt(wa + wb),
// narrower than either.
Estimate pooled_estimate(const Estimate& a, const Estimate& b);

}  // namespace tb

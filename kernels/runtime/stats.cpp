#include "stats.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tb {

double median_of(std::vector<double> values) {
  if (values.empty()) throw std::invalid_argument("median of no values");
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// P(X <= k) for X ~ Binomial(n, 1/2).
static double binomial_half_cdf(std::size_t n, std::size_t k) {
  double term = std::pow(0.5, static_cast<double>(n));  // C(n,0) / 2^n
  double sum = term;
  for (std::size_t i = 1; i <= k; ++i) {
    term *= static_cast<double>(n - i + 1) / static_cast<double>(i);
    sum += term;
  }
  return sum;
}

Summary summarize(const std::vector<double>& samples, double noise_target, double level) {
  if (samples.empty()) throw std::invalid_argument("summary of no samples");
  std::vector<double> x = samples;
  std::sort(x.begin(), x.end());
  Summary s;
  s.n = x.size();
  s.median = median_of(x);
  // Coverage of [x_(k), x_(n+1-k)] is 1 - 2 P(Bin(n, 1/2) <= k - 1): widen k down until it holds.
  std::size_t k = 0;
  for (std::size_t cand = s.n / 2; cand >= 1; --cand) {
    if (1.0 - 2.0 * binomial_half_cdf(s.n, cand - 1) >= level) {
      k = cand;
      break;
    }
  }
  if (k == 0) {
    s.ci_low = x.front();
    s.ci_high = x.back();
    s.ci_level = s.n > 1 ? 1.0 - 2.0 * std::pow(0.5, static_cast<double>(s.n)) : 0.0;
  } else {
    s.ci_low = x[k - 1];
    s.ci_high = x[s.n - k];
    s.ci_level = 1.0 - 2.0 * binomial_half_cdf(s.n, k - 1);
  }
  s.rel_half_width = s.median > 0 ? (s.ci_high - s.ci_low) / (2.0 * s.median) : 0.0;
  s.noisy = s.rel_half_width > noise_target;
  return s;
}

// Standard normal quantile (Acklam's rational approximation; |error| < 1.2e-9 over (0, 1)).
static double normal_quantile(double p) {
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                             1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01, -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  const double plow = 0.02425;
  if (p < plow) {
    const double q = std::sqrt(-2 * std::log(p));
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  if (p > 1 - plow) return -normal_quantile(1 - p);
  const double q = p - 0.5, r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
         (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

RatioEstimate ratio_estimate(const std::vector<double>& baseline, const std::vector<double>& improved,
                             double level) {
  if (baseline.empty() || improved.empty()) throw std::invalid_argument("ratio of no samples");
  std::vector<double> d;
  d.reserve(baseline.size() * improved.size());
  for (double b : baseline)
    for (double a : improved) {
      if (!(b > 0) || !(a > 0)) throw std::invalid_argument("ratio of non-positive times");
      d.push_back(std::log(b) - std::log(a));
    }
  std::sort(d.begin(), d.end());
  RatioEstimate r;
  r.ratio = std::exp(median_of(d));
  const double m = static_cast<double>(baseline.size()), n = static_cast<double>(improved.size());
  const double z = normal_quantile(0.5 + level / 2);
  const double k = std::floor(m * n / 2 - z * std::sqrt(m * n * (m + n + 1) / 12));
  if (k >= 1) {
    const auto i = static_cast<std::size_t>(k);
    r.ci_low = std::exp(d[i - 1]);
    r.ci_high = std::exp(d[d.size() - i]);
    r.ci_level = level;
  } else {
    // Too few samples for the requested level: the full range, whose coverage under a pure shift
    // is 1 - 2 / C(m + n, m).
    r.ci_low = std::exp(d.front());
    r.ci_high = std::exp(d.back());
    double choose = 1;
    for (double i = 1; i <= m; ++i) choose *= (n + i) / i;
    r.ci_level = 1.0 - 2.0 / choose;
  }
  return r;
}

RatioEstimate paired_ratio_estimate(const std::vector<double>& baseline, const std::vector<double>& improved,
                                    double level) {
  const std::size_t rounds = std::min(baseline.size(), improved.size());
  if (rounds == 0) throw std::invalid_argument("ratio of no rounds");
  std::vector<double> d(rounds);
  for (std::size_t r = 0; r < rounds; ++r) {
    if (!(baseline[r] > 0) || !(improved[r] > 0)) throw std::invalid_argument("ratio of non-positive times");
    d[r] = std::log(baseline[r]) - std::log(improved[r]);
  }
  std::vector<double> walsh;
  walsh.reserve(rounds * (rounds + 1) / 2);
  for (std::size_t i = 0; i < rounds; ++i)
    for (std::size_t j = i; j < rounds; ++j) walsh.push_back(0.5 * (d[i] + d[j]));
  std::sort(walsh.begin(), walsh.end());
  // The signed-rank statistic's exact null distribution: counts over the 2^rounds sign patterns.
  std::vector<double> counts(walsh.size() + 1, 0.0);
  counts[0] = 1.0;
  for (std::size_t rank = 1; rank <= rounds; ++rank)
    for (std::size_t t = counts.size() - 1; t >= rank; --t) counts[t] += counts[t - rank];
  const double patterns = std::pow(2.0, static_cast<double>(rounds));
  // The largest k with P(T <= k - 1) <= (1 - level) / 2, at least 1 ([min, max]).
  std::size_t k = 1;
  double below = counts[0] / patterns;  // P(T <= k - 1)
  for (double next = below + counts[1] / patterns; k < (walsh.size() + 1) / 2 && next <= (1 - level) / 2;
       next += counts[k] / patterns) {
    below = next;
    ++k;
  }
  RatioEstimate r;
  r.ratio = std::exp(median_of(walsh));
  r.ci_low = std::exp(walsh[k - 1]);
  r.ci_high = std::exp(walsh[walsh.size() - k]);
  r.ci_level = 1.0 - 2.0 * below;
  return r;
}

}  // namespace tb

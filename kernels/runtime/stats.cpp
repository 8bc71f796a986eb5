#include "stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace tb {

double median_of(std::vector<double> values) {
  if (values.empty()) throw std::invalid_argument("median of no values");
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// The Walsh averages (x_i + x_j) / 2, i <= j, sorted.
static std::vector<double> sorted_walsh_averages(const std::vector<double>& x) {
  std::vector<double> walsh;
  walsh.reserve(x.size() * (x.size() + 1) / 2);
  for (std::size_t i = 0; i < x.size(); ++i)
    for (std::size_t j = i; j < x.size(); ++j) walsh.push_back(0.5 * (x[i] + x[j]));
  std::sort(walsh.begin(), walsh.end());
  return walsh;
}

double hodges_lehmann(const std::vector<double>& values) {
  if (values.empty()) throw std::invalid_argument("Hodges-Lehmann estimate of no values");
  return median_of(sorted_walsh_averages(values));
}

// The regularised incomplete beta function I_x(a, b), by its continued fraction (modified Lentz).
static double incomplete_beta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  if (x > (a + 1) / (a + b + 2)) return 1 - incomplete_beta(b, a, 1 - x);  // where the fraction converges fast
  const double front = std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) +
                                b * std::log1p(-x)) /
                       a;
  constexpr double tiny = 1e-300;
  double f = 1, c = 1, d = 0;
  for (int i = 0; i <= 400; ++i) {
    const auto m = static_cast<double>(i / 2);
    double numerator = 1;
    if (i > 0 && i % 2 == 0) numerator = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m));
    else if (i > 0) numerator = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1));
    d = 1 + numerator * d;
    d = 1 / (std::abs(d) < tiny ? tiny : d);
    c = 1 + numerator / c;
    if (std::abs(c) < tiny) c = tiny;
    f *= c * d;
    if (std::abs(1 - c * d) < 1e-15) break;
  }
  return front * (f - 1);
}

double student_t_cdf(double t, double dof) {
  if (!(dof > 0)) throw std::invalid_argument("student_t_cdf: dof > 0");
  const double tail = 0.5 * incomplete_beta(dof / 2, 0.5, dof / (dof + t * t));
  return t >= 0 ? 1 - tail : tail;
}

double student_t_quantile(double p, double dof) {
  if (!(p > 0 && p < 1) || !(dof > 0)) throw std::invalid_argument("student_t_quantile: p in (0, 1) and dof > 0");
  if (p < 0.5) return -student_t_quantile(1 - p, dof);
  if (p == 0.5) return 0;
  double low = 0, high = 1;
  while (student_t_cdf(high, dof) < p) high *= 2;
  for (int i = 0; i < 200 && high - low > 1e-12 * high; ++i) {
    const double mid = (low + high) / 2;
    (student_t_cdf(mid, dof) < p ? low : high) = mid;
  }
  return (low + high) / 2;
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
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                             1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01,
                             -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00};
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

RatioEstimate ratio_estimate(const std::vector<double>& baseline, const std::vector<double>& improved, double level) {
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

RatioEstimate paired_ratio_estimate(const std::vector<double>& baseline, const std::vector<double>& improved, double level) {
  const std::size_t rounds = std::min(baseline.size(), improved.size());
  if (rounds == 0) throw std::invalid_argument("ratio of no rounds");
  std::vector<double> d(rounds);
  for (std::size_t r = 0; r < rounds; ++r) {
    if (!(baseline[r] > 0) || !(improved[r] > 0)) throw std::invalid_argument("ratio of non-positive times");
    d[r] = std::log(baseline[r]) - std::log(improved[r]);
  }
  const std::vector<double> walsh = sorted_walsh_averages(d);
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

RatioEstimate paired_t_ratio_estimate(const std::vector<double>& a, const std::vector<double>& b, double level) {
  const std::size_t rounds = std::min(a.size(), b.size());
  if (rounds == 0) throw std::invalid_argument("ratio of no rounds");
  std::vector<double> d(rounds);
  for (std::size_t r = 0; r < rounds; ++r) {
    if (!(a[r] > 0) || !(b[r] > 0)) throw std::invalid_argument("ratio of non-positive values");
    d[r] = std::log(a[r] / b[r]);
  }
  RatioEstimate out;
  out.ratio = std::exp(hodges_lehmann(d));
  if (rounds == 1) {
    out.ci_high = std::numeric_limits<double>::infinity();
    out.ci_level = 1;
    return out;
  }
  const auto k = static_cast<double>(rounds);
  const double mean = std::accumulate(d.begin(), d.end(), 0.0) / k;
  double squares = 0;
  for (double x : d) squares += (x - mean) * (x - mean);
  const double half = student_t_quantile(0.5 + level / 2, k - 1) * std::sqrt(squares / (k - 1) / k);
  out.ci_low = std::exp(mean - half);
  out.ci_high = std::exp(mean + half);
  out.ci_level = level;
  return out;
}

Estimate pooled_estimate(const Estimate& a, const Estimate& b) {
  auto weight = [](const Estimate& e) {
    const double hw = std::max(e.half_width, 1e-6 * std::abs(e.value) + 1e-12);
    return 1 / (hw * hw);
  };
  const double wa = weight(a), wb = weight(b);
  return {(wa * a.value + wb * b.value) / (wa + wb), 1 / std::sqrt(wa + wb)};
}

}  // namespace tb

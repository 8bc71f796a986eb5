#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <numeric>

#include "runtime/gpu_monitor.h"
#include "runtime/schedule.h"
#include "runtime/stats.h"
#include "runtime/timing.h"

namespace tb {
namespace {

TEST(Stats, MedianOfOddAndEven) {
  EXPECT_DOUBLE_EQ(median_of({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median_of({4, 1, 3, 2}), 2.5);
  EXPECT_THROW(median_of({}), std::invalid_argument);
}

TEST(Stats, OrderStatisticIntervalAtTenSamples) {
  // n = 10: [x_(2), x_(9)] covers the median with 1 - 2 * P(Bin(10, 1/2) <= 1) = 1 - 22/1024.
  const Summary s = summarize({10, 1, 9, 2, 8, 3, 7, 4, 6, 5}, 0.05);
  EXPECT_EQ(s.n, 10u);
  EXPECT_DOUBLE_EQ(s.median, 5.5);
  EXPECT_DOUBLE_EQ(s.ci_low, 2);
  EXPECT_DOUBLE_EQ(s.ci_high, 9);
  EXPECT_NEAR(s.ci_level, 1.0 - 22.0 / 1024.0, 1e-12);
}

TEST(Stats, FewSamplesGiveFullRangeWithItsLowerCoverage) {
  const Summary s = summarize({3, 1, 2}, 0.05);
  EXPECT_DOUBLE_EQ(s.ci_low, 1);
  EXPECT_DOUBLE_EQ(s.ci_high, 3);
  EXPECT_DOUBLE_EQ(s.ci_level, 0.75);  // 1 - 2 / 2^3
}

TEST(Stats, NoiseFlagFollowsTheTarget) {
  const std::vector<double> tight{100, 100.5, 99.5, 100.2, 99.8, 100.1, 99.9, 100.3, 99.7, 100};
  EXPECT_FALSE(summarize(tight, 0.05).noisy);
  const std::vector<double> wide{100, 150, 60, 130, 70, 120, 80, 140, 90, 110};
  const Summary s = summarize(wide, 0.05);
  EXPECT_TRUE(s.noisy);
  EXPECT_GT(s.rel_half_width, 0.05);
  EXPECT_FALSE(summarize(wide, 0.9).noisy);
}

TEST(Stats, RatioOfScaledSamplesIsTheScale) {
  const std::vector<double> improved{10, 11, 9, 10.5, 9.5, 10.2, 9.8, 10.1};
  std::vector<double> baseline;
  for (double x : improved) baseline.push_back(3 * x);
  const RatioEstimate r = ratio_estimate(baseline, improved);
  EXPECT_NEAR(r.ratio, 3.0, 0.05);
  EXPECT_LE(r.ci_low, r.ratio);
  EXPECT_GE(r.ci_high, r.ratio);
  EXPECT_GT(r.ci_low, 2.5);
  EXPECT_LT(r.ci_high, 3.6);
  EXPECT_DOUBLE_EQ(r.ci_level, 0.95);
}

TEST(Stats, RatioIntervalOfIdenticalDistributionsContainsOne) {
  const std::vector<double> a{10, 12, 11, 9, 10.5, 11.5, 9.5, 10.2, 10.8, 11.1};
  const std::vector<double> b{11, 10, 9.8, 11.9, 10.1, 10.6, 9.4, 11.3, 10.7, 10.4};
  const RatioEstimate r = ratio_estimate(a, b);
  EXPECT_LT(r.ci_low, 1.0);
  EXPECT_GT(r.ci_high, 1.0);
}

TEST(Stats, RatioWithTooFewSamplesSaysItsCoverage) {
  const RatioEstimate r = ratio_estimate({2, 2.1}, {1, 1.1});
  EXPECT_DOUBLE_EQ(r.ci_level, 1.0 - 2.0 / 6.0);  // C(4, 2) = 6 orderings
  EXPECT_THROW(ratio_estimate({1}, {0}), std::invalid_argument);
}

TEST(Stats, PairedRatioIsTheMedianOfTheRoundsWithTheSignedRankInterval) {
  // Five rounds of 2x, one of 1x and one of 4x: the Walsh averages' median is 2x.
  const std::vector<double> improved{1, 1, 1, 1, 1, 1, 1};
  const std::vector<double> baseline{2, 2, 2, 1, 2, 4, 2};
  const RatioEstimate r = paired_ratio_estimate(baseline, improved);
  EXPECT_DOUBLE_EQ(r.ratio, 2.0);
  // Seven rounds reach 95%: k = 3 (P(T <= 2) = 3/128), coverage 1 - 6/128.
  EXPECT_NEAR(r.ci_level, 1.0 - 6.0 / 128.0, 1e-12);
  EXPECT_LE(r.ci_low, 2.0);
  EXPECT_GE(r.ci_high, 2.0);
  // Three rounds cannot reach 95%: [min, max] of the Walsh averages, at 1 - 2/8.
  const RatioEstimate few = paired_ratio_estimate({2, 3, 4}, {1, 1, 1});
  EXPECT_DOUBLE_EQ(few.ci_level, 0.75);
  EXPECT_DOUBLE_EQ(few.ci_low, 2.0);
  EXPECT_DOUBLE_EQ(few.ci_high, 4.0);
  // A drift that scales both sides of a round cancels: the same rounds at 3x the time read the same.
  const RatioEstimate drifted = paired_ratio_estimate({2, 6, 2, 6, 2}, {1, 3, 1, 3, 1});
  EXPECT_DOUBLE_EQ(drifted.ratio, 2.0);
  EXPECT_DOUBLE_EQ(drifted.ci_low, 2.0);
  EXPECT_DOUBLE_EQ(drifted.ci_high, 2.0);
  EXPECT_THROW(paired_ratio_estimate({1}, {0}), std::invalid_argument);
}

TEST(Stats, HodgesLehmannIsTheMedianOfTheWalshAverages) {
  // {1, 2, 3}: Walsh averages 1, 1.5, 2, 2, 2.5, 3.
  EXPECT_DOUBLE_EQ(hodges_lehmann({3, 1, 2}), 2.0);
  // {1, 2, 3, 100}: 1, 1.5, 2, 2, 2.5, 3, 50.5, 51, 51.5, 100: one wild value hardly moves it (the mean is 26.5).
  EXPECT_DOUBLE_EQ(hodges_lehmann({1, 2, 3, 100}), 2.75);
  EXPECT_DOUBLE_EQ(hodges_lehmann({7}), 7.0);
  EXPECT_THROW(hodges_lehmann({}), std::invalid_argument);
}

TEST(Stats, StudentTMatchesClosedFormsAndTables) {
  EXPECT_DOUBLE_EQ(student_t_cdf(0, 3), 0.5);
  EXPECT_NEAR(student_t_cdf(1, 1), 0.75, 1e-12);                            // Cauchy: 1/2 + atan(t) / pi
  EXPECT_NEAR(student_t_cdf(2, 2), 0.5 + 2 / (2 * std::sqrt(6.0)), 1e-12);  // 1/2 + t / (2 sqrt(2 + t^2))
  EXPECT_NEAR(student_t_cdf(-2, 2), 0.5 - 2 / (2 * std::sqrt(6.0)), 1e-12);
  EXPECT_NEAR(student_t_quantile(0.975, 1), 12.7062, 1e-4);
  EXPECT_NEAR(student_t_quantile(0.975, 4), 2.776445, 1e-6);
  EXPECT_NEAR(student_t_quantile(0.995, 10), 3.169273, 1e-6);
  EXPECT_NEAR(student_t_quantile(0.025, 4), -2.776445, 1e-6);
  EXPECT_NEAR(student_t_cdf(student_t_quantile(0.9, 2.5), 2.5), 0.9, 1e-10);  // fractional degrees of freedom
  EXPECT_THROW(student_t_quantile(0, 4), std::invalid_argument);
  EXPECT_THROW(student_t_cdf(1, 0), std::invalid_argument);
}

TEST(Stats, PairedTRatioIsTheHodgesLehmannRatioWithTheTInterval) {
  // Log ratios 0.1, -0.1, 0.05, -0.05, 0: estimate 0, mean 0, sd sqrt(0.025 / 4), t(0.975, 4) = 2.776445,
  // half-width 2.776445 * sqrt(0.025 / 4 / 5) = 0.0981614.
  const std::vector<double> b{100, 200, 50, 80, 120};
  const std::vector<double> d{0.1, -0.1, 0.05, -0.05, 0};
  std::vector<double> a;
  for (std::size_t r = 0; r < b.size(); ++r) a.push_back(b[r] * std::exp(d[r]));
  const RatioEstimate r = paired_t_ratio_estimate(a, b);
  EXPECT_NEAR(r.ratio, 1.0, 1e-12);
  EXPECT_NEAR(std::log(r.ci_low), -0.0981614, 1e-6);
  EXPECT_NEAR(std::log(r.ci_high), 0.0981614, 1e-6);
  EXPECT_DOUBLE_EQ(r.ci_level, 0.95);
  // The same ratio every round, whatever the level of the round: that ratio, no spread.
  const RatioEstimate same = paired_t_ratio_estimate({110, 220, 55}, {100, 200, 50});
  EXPECT_NEAR(same.ratio, 1.1, 1e-12);
  EXPECT_NEAR(same.ci_low, 1.1, 1e-9);
  EXPECT_NEAR(same.ci_high, 1.1, 1e-9);
  // One round (the rounds pair as far as both go): a ratio, nothing known of the spread.
  const RatioEstimate one = paired_t_ratio_estimate({120}, {100, 90});
  EXPECT_NEAR(one.ratio, 1.2, 1e-12);
  EXPECT_EQ(one.ci_low, 0.0);
  EXPECT_EQ(one.ci_high, std::numeric_limits<double>::infinity());
  EXPECT_EQ(one.ci_level, 1.0);
  EXPECT_THROW(paired_t_ratio_estimate({}, {1}), std::invalid_argument);
  EXPECT_THROW(paired_t_ratio_estimate({0, 1}, {1, 1}), std::invalid_argument);
}

// Round r of a schedule.
std::vector<std::size_t> round_of(const std::vector<std::size_t>& order, std::size_t entries, std::size_t r) {
  const auto begin = order.begin() + static_cast<std::ptrdiff_t>(r * entries);
  return std::vector<std::size_t>(begin, begin + static_cast<std::ptrdiff_t>(entries));
}

TEST(Schedule, EveryRoundIsAPermutationAndPairsOfRoundsAreMirrored) {
  for (std::size_t entries = 1; entries <= 7; ++entries) {
    const std::size_t rounds = 13;
    const std::vector<std::size_t> order = schedule(entries, rounds);
    ASSERT_EQ(order.size(), entries * rounds);
    std::vector<std::size_t> identity(entries);
    std::iota(identity.begin(), identity.end(), std::size_t{0});
    for (std::size_t r = 0; r < rounds; ++r) {
      std::vector<std::size_t> round = round_of(order, entries, r);
      if (r % 2) {  // a drift linear across the pair: every entry's two positions add up to entries - 1
        std::vector<std::size_t> before = round_of(order, entries, r - 1);
        EXPECT_EQ(std::vector<std::size_t>(round.rbegin(), round.rend()), before) << entries << " entries, round " << r;
      }
      std::sort(round.begin(), round.end());
      EXPECT_EQ(round, identity) << entries << " entries, round " << r;
    }
  }
}

TEST(Schedule, TwoEntriesAlternateABBA) {
  EXPECT_EQ(schedule(2, 6), (std::vector<std::size_t>{0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0}));
}

TEST(Schedule, EveryEntryRunsInEveryPositionAlikeOverACycle) {
  EXPECT_EQ(schedule(3, 6), (std::vector<std::size_t>{0, 1, 2, 2, 1, 0, 2, 0, 1, 1, 0, 2, 1, 2, 0, 0, 2, 1}));
  // A cycle is lcm(2, entries) rounds: entries when even, 2 x entries when odd.
  for (std::size_t entries = 1; entries <= 8; ++entries) {
    const std::size_t cycle = entries % 2 ? 2 * entries : entries;
    const std::vector<std::size_t> order = schedule(entries, cycle);
    std::vector<std::vector<int>> count(entries, std::vector<int>(entries, 0));  // [entry][position]
    for (std::size_t r = 0; r < cycle; ++r)
      for (std::size_t p = 0; p < entries; ++p) ++count[order[r * entries + p]][p];
    for (std::size_t e = 0; e < entries; ++e)
      for (std::size_t p = 0; p < entries; ++p)
        EXPECT_EQ(count[e][p], static_cast<int>(cycle / entries))
            << entries << " entries: entry " << e << ", position " << p;
  }
}

TEST(Schedule, NothingToScheduleGivesNoIndices) {
  EXPECT_TRUE(schedule(0, 5).empty());
  EXPECT_TRUE(schedule(4, 0).empty());
  EXPECT_TRUE(schedule(0, 0).empty());
  EXPECT_EQ(schedule(1, 3), (std::vector<std::size_t>{0, 0, 0}));
}

// A timer that returns scripted durations: the sampling loop and the statistics without a clock.
class FakeTimer final : public SampleTimer {
 public:
  explicit FakeTimer(std::deque<double> durations) : durations_(std::move(durations)) {}
  void start() override { ++starts; }
  double stop() override {
    const double d = durations_.front();
    durations_.pop_front();
    return d;
  }
  int starts = 0;

 private:
  std::deque<double> durations_;
};

class CountingFlusher final : public CacheFlusher {
 public:
  void flush() override { ++flushes; }
  int flushes = 0;
};

TEST(Timing, OneStartStopPerBatchAndFlushOutsideIt) {
  FakeTimer timer({0.004, 0.002});
  CountingFlusher flusher;
  int calls = 0;
  EXPECT_DOUBLE_EQ(time_sample(
                       timer, [&] { ++calls; }, 8, &flusher),
                   0.004);
  EXPECT_EQ(calls, 8);
  EXPECT_EQ(timer.starts, 1);
  EXPECT_EQ(flusher.flushes, 1);
  EXPECT_DOUBLE_EQ(time_sample(
                       timer, [&] { ++calls; }, 1),
                   0.002);
  EXPECT_EQ(flusher.flushes, 1);
}

// A stop request asked for by the 100th call of a batch of 10000.
int stop_calls = 0;
bool stop_after_100() { return stop_calls >= 100; }

TEST(Timing, AStopRequestEndsABatchAfterABoundedNumberOfCallsAndSaysHowMany) {
  FakeTimer timer({0.5, 0.25});
  int64_t made = -1;
  EXPECT_DOUBLE_EQ(time_sample(
                       timer, [] { ++stop_calls; }, 10000, nullptr, &stop_after_100, &made),
                   0.5);
  // Asked every 10000 / stop_checks_per_batch calls: it ends at the first check after the 100th call.
  const int64_t every = 10000 / stop_checks_per_batch;
  EXPECT_GE(made, 100);
  EXPECT_LE(made, 100 + every);
  EXPECT_EQ(made, stop_calls);
  EXPECT_EQ(timer.starts, 1);
  // Asked between calls only: a batch of one call is never cut, and no stop request means the whole batch.
  stop_calls = 1000;
  EXPECT_DOUBLE_EQ(time_sample(
                       timer, [] { ++stop_calls; }, 1, nullptr, &stop_after_100, &made),
                   0.25);
  EXPECT_EQ(made, 1);
}

TEST(Timing, FakeTimerSamplesSummarise) {
  // Ten samples of a batch of 4 calls: per-call times are sample / 4.
  std::deque<double> durations{4.0, 4.4, 3.6, 4.2, 3.8, 4.1, 3.9, 4.3, 3.7, 4.0};
  FakeTimer timer(durations);
  std::vector<double> per_call;
  for (int i = 0; i < 10; ++i)
    per_call.push_back(time_sample(
                           timer, [] {}, 4) /
                       4);
  const Summary s = summarize(per_call, 0.05);
  EXPECT_DOUBLE_EQ(s.median, 1.0);
  EXPECT_DOUBLE_EQ(s.ci_low, 0.925);
  EXPECT_DOUBLE_EQ(s.ci_high, 1.075);
  EXPECT_TRUE(s.noisy);  // 7.5% half-width is above a 5% target
}

TEST(Timing, BatchMakesASampleLongEnough) {
  EXPECT_EQ(batch_for(1e-3, 20e-6, 1 << 16), 1);
  EXPECT_EQ(batch_for(0.125, 6.25, 1 << 16), 50);  // exactly representable: 6.25 / 0.125 = 50
  EXPECT_EQ(batch_for(1e-9, 1.0, 1000), 1000);
  EXPECT_EQ(batch_for(0.0, 1.0, 77), 77);
}

TEST(GpuMonitor, ThermalViolationTimeIsTheThrottledShareOfTheWindow) {
  const GpuThrottleState before{true, 1'000'000, 0, 1980, 0};
  EXPECT_DOUBLE_EQ(throttled_share(before, GpuThrottleState{true, 1'000'000, 0, 1980, 5e6}), 0.0);
  EXPECT_DOUBLE_EQ(throttled_share(before, GpuThrottleState{true, 2'000'000, 0, 1755, 5e6}), 0.2);
  // the software power cap is how a heavy kernel always runs, not a disturbance
  EXPECT_DOUBLE_EQ(throttled_share(before, GpuThrottleState{true, 1'000'000, 0x4, 1650, 5e6}), 0.0);
  // a thermal or hardware slowdown active at either end: the whole window
  EXPECT_DOUBLE_EQ(throttled_share(before, GpuThrottleState{true, 1'000'000, 0x20, 1410, 5e6}), 1.0);
  EXPECT_DOUBLE_EQ(throttled_share(GpuThrottleState{true, 0, 0x80, 1980, 0}, GpuThrottleState{true, 0, 0, 1980, 5e6}), 1.0);
  EXPECT_EQ(throttled_share(GpuThrottleState{}, GpuThrottleState{true, 0, 0, 1980, 5e6}), -1.0);  // NVML silent
  EXPECT_EQ(throttled_share(before, GpuThrottleState{true, 0, 0, 1980, 0}), -1.0);                // no time passed
}

TEST(GpuMonitor, ReasonNames) {
  EXPECT_EQ(clock_reason_names(0x1 | 0x4 | 0x20), (std::vector<std::string>{"sw_power_cap", "sw_thermal_slowdown"}));
  EXPECT_TRUE(clock_reason_names(0).empty());
}

TEST(GpuMonitor, WithoutNvmlItSaysWhyAndReadsNothing) {
  GpuMonitor& monitor = GpuMonitor::instance();
  if (monitor.available()) GTEST_SKIP() << "NVML is here: the GPU node's tests read it through benchsuite";
  EXPECT_FALSE(monitor.unavailable_reason().empty());
  EXPECT_FALSE(monitor.read("GPU-00000000-0000-0000-0000-000000000000").valid);
}

}  // namespace
}  // namespace tb

// Two measurements of one quantity pooled: the inverse-variance weighted mean and a narrower interval.
TEST(Stats, PooledEstimateWeighsByInverseVariance) {
  // Half-widths 1 and 2: weights 1 and 1/4, so the mean is (10 + 20 / 4) / 1.25 = 12.
  const tb::Estimate pooled = tb::pooled_estimate({10, 1}, {20, 2});
  EXPECT_NEAR(pooled.value, 12.0, 1e-12);
  EXPECT_NEAR(pooled.half_width, 1 / std::sqrt(1.25), 1e-12);
  // Two equal measurements: the same value, the half-width shrunk by sqrt(2).
  const tb::Estimate same = tb::pooled_estimate({5, 0.5}, {5, 0.5});
  EXPECT_NEAR(same.value, 5.0, 1e-12);
  EXPECT_NEAR(same.half_width, 0.5 / std::sqrt(2.0), 1e-12);
  // An exact-looking measurement (half-width 0) dominates but stays finite.
  const tb::Estimate exact = tb::pooled_estimate({100, 0}, {200, 10});
  EXPECT_NEAR(exact.value, 100.0, 1e-3);
  EXPECT_GT(exact.half_width, 0.0);
}

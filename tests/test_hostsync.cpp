// Stage `hostsync`: the read plans, the N sweep, the reference sums and the async read ring on any
// machine; every CUDA pattern against the reference where there is a GPU (skipped with the reason
// elsewhere). The reference must catch a wrong sum.
#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <sstream>
#include <string>
#include <vector>

#include "harness.h"
#include "hostsync/hostsync.h"
#include "runtime/defaults.h"
#include "stage_testing.h"

namespace tb {
namespace {

using hostsync::Pattern;

const Stage& stage() { return *builtin_registry().find("hostsync"); }

double counter(const Work& w, const std::string& key) {
  for (const auto& [k, v] : w.counters)
    if (k == key) return v;
  ADD_FAILURE() << "no counter " << key;
  return -1;
}

TEST(HostsyncPlan, SweepsTheReportsIntervals) {
  EXPECT_EQ(hostsync::interval_sweep(), (std::vector<std::string>{"1", "5", "50", "500"}));
  const Axis* steps = stage().find_axis("steps");
  ASSERT_NE(steps, nullptr);
  EXPECT_EQ(steps->values, hostsync::interval_sweep());
  // Every pattern runs at every N, so every declared pair is compared at every N.
  for (const auto& v : stage().variants) {
    EXPECT_EQ(v.backend, Backend::cuda) << v.id;
    EXPECT_EQ(expand_problems(stage(), v, {}, false).size(), 4u) << v.id;
  }
}

TEST(HostsyncPlan, ReadsPerCall) {
  EXPECT_EQ(hostsync::read_plan(Pattern::no_reads, 500).syncs, 0);
  EXPECT_EQ(hostsync::read_plan(Pattern::item_every_step, 500).syncs, 500);
  EXPECT_EQ(hostsync::read_plan(Pattern::item_every_step, 500).bytes, 2000);  // 4 bytes a step
  EXPECT_EQ(hostsync::read_plan(Pattern::sync_every_n, 500).syncs, 1);
  EXPECT_EQ(hostsync::read_plan(Pattern::metrics_separate, 50).transfers, 3);
  EXPECT_EQ(hostsync::read_plan(Pattern::metrics_batched, 50).transfers, 1);
  EXPECT_EQ(hostsync::read_plan(Pattern::metrics_batched, 50).bytes,
            hostsync::read_plan(Pattern::metrics_separate, 50).bytes);
  EXPECT_EQ(hostsync::read_plan(Pattern::async_pinned, 5).syncs, 0);
  EXPECT_EQ(hostsync::read_plan(Pattern::async_pinned, 5).transfers, 5);

  // Per step: predictions written (4n), read with the targets (8n), three metrics written, read
  // and added into three double sums (12 + 12 + 48); plus what the host reads.
  EXPECT_DOUBLE_EQ(hostsync::bytes_per_call(Pattern::no_reads, 1, 4096), 12.0 * 4096 + 72);
  EXPECT_DOUBLE_EQ(hostsync::bytes_per_call(Pattern::item_every_step, 10, 4096), 10 * (12.0 * 4096 + 72) + 40);
  EXPECT_DOUBLE_EQ(hostsync::bytes_per_call(Pattern::metrics_batched, 10, 4096), 10 * (12.0 * 4096 + 72) + 24);

  const Problem p({{"steps", "50"}, {"elements", "4096"}});
  const Work w = stage().find_variant("item_every_step", Backend::cuda)->work(p);
  EXPECT_EQ(w.peak_key, "cuda.copy");
  EXPECT_DOUBLE_EQ(w.bytes, hostsync::bytes_per_call(Pattern::item_every_step, 50, 4096));
  EXPECT_EQ(counter(w, "steps"), 50);
  EXPECT_EQ(counter(w, "kernels"), 150);
  EXPECT_EQ(counter(w, "syncs"), 50);
  EXPECT_EQ(counter(stage().find_variant("sync_every_n", Backend::cuda)->work(p), "syncs"), 1);
}

TEST(HostsyncReference, StepMetricsByHand) {
  // Two predictions and two targets, the three means written out.
  const double p0 = hostsync::prediction(3, 0, 2), p1 = hostsync::prediction(3, 1, 2);
  const double e0 = p0 - hostsync::target(0), e1 = p1 - hostsync::target(1);
  const hostsync::Sums s = hostsync::step_metrics(3, 2);
  EXPECT_DOUBLE_EQ(s.v[0], (e0 * e0 + e1 * e1) / 2);
  EXPECT_DOUBLE_EQ(s.v[1], (std::abs(e0) + std::abs(e1)) / 2);
  EXPECT_DOUBLE_EQ(s.v[2], (p0 * p0 + p1 * p1) / 2);
  // Steps see different predictions against the same targets.
  EXPECT_NE(hostsync::prediction(0, 0, 2), hostsync::prediction(1, 0, 2));
  EXPECT_NE(hostsync::step_metrics(0, 64).v[0], hostsync::step_metrics(1, 64).v[0]);
}

TEST(HostsyncReference, SumsAreTheStepsAddedUp) {
  const hostsync::Sums three = hostsync::metric_sums(3, 100);
  for (int m = 0; m < hostsync::metric_count; ++m) {
    double by_step = 0;
    for (int64_t s = 0; s < 3; ++s) by_step += hostsync::step_metrics(s, 100).v[m];
    EXPECT_DOUBLE_EQ(three.v[m], by_step);
    EXPECT_GT(three.v[m], 0);
  }
}

TEST(HostsyncReference, CatchesAWrongSum) {
  const hostsync::Sums want = hostsync::metric_sums(5, 1000);
  hostsync::Sums got = want;
  got.v[1] *= 1 + 1e-7;  // fp32 rounding of a mean: accepted
  EXPECT_TRUE(hostsync::check_sums("t", got, want).passed);
  got.v[1] = want.v[1] * (1 + 1e-3);  // a step missed or counted twice is far more than this
  const Verdict v = hostsync::check_sums("device running sums", got, want);
  EXPECT_FALSE(v.passed);
  EXPECT_NE(v.detail.find("mean |error|"), std::string::npos) << v.detail;
  // A one-step-short sum fails too, and only the sums compared count.
  const hostsync::Sums short_by_one = hostsync::metric_sums(4, 1000);
  EXPECT_FALSE(hostsync::check_sums("t", short_by_one, want, 1).passed);
  got = want;
  got.v[2] = NAN;
  EXPECT_TRUE(hostsync::check_sums("t", got, want, 2).passed);
  EXPECT_FALSE(hostsync::check_sums("t", got, want, 3).passed);
}

TEST(HostsyncRing, ReadsInOrderAndWaitsOnlyWhenFull) {
  hostsync::ReadRing ring(3);
  EXPECT_THROW(ring.pop(0), std::logic_error);
  std::vector<int64_t> slot_step(3, -1), read;
  for (int64_t step = 0; step < 3; ++step) slot_step[static_cast<std::size_t>(ring.push(step))] = step;
  EXPECT_TRUE(ring.full());
  EXPECT_THROW(ring.push(3), std::logic_error);
  // Steps 0 and 1 finished, step 2 not: two reads, in order, and step 2 stays in flight.
  const int n = ring.harvest(
      3, [&](int slot) { return slot_step[static_cast<std::size_t>(slot)] < 2; },
      [&](int slot) { read.push_back(slot_step[static_cast<std::size_t>(slot)]); });
  EXPECT_EQ(n, 2);
  EXPECT_EQ(read, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(ring.in_flight(), 1);
  EXPECT_DOUBLE_EQ(ring.mean_lag_steps(), (3.0 + 2.0) / 2);
  // A slot still in flight blocks the ones behind it, even when those are done.
  slot_step[static_cast<std::size_t>(ring.push(3))] = 3;
  EXPECT_EQ(ring.harvest(
                4, [&](int slot) { return slot_step[static_cast<std::size_t>(slot)] == 3; }, [](int) {}),
            0);
}

// The loop as async_pinned runs it, against a device that finishes step k when the host is at step
// k + lag: every value is read exactly once, in order; the host waits only when lag >= slots.
int64_t simulate(int slots, int64_t lag, int64_t steps, double& sum, double& mean_lag) {
  hostsync::ReadRing ring(slots);
  std::vector<int64_t> slot_step(static_cast<std::size_t>(slots));
  int64_t stalls = 0, expected_next = 0;
  sum = 0;
  auto read = [&](int slot) {
    const int64_t s = slot_step[static_cast<std::size_t>(slot)];
    EXPECT_EQ(s, expected_next++);
    sum += static_cast<double>(s);
  };
  for (int64_t now = 0; now < steps; ++now) {
    ring.harvest(
        now, [&](int slot) { return slot_step[static_cast<std::size_t>(slot)] + lag <= now; }, read);
    if (ring.full()) {
      read(ring.oldest());
      ring.pop(now);
      ++stalls;
    }
    slot_step[static_cast<std::size_t>(ring.push(now))] = now;
  }
  ring.harvest(
      steps + lag, [](int) { return true; }, read);  // check(): after a synchronise
  mean_lag = ring.mean_lag_steps();
  EXPECT_EQ(ring.reads(), steps);
  return stalls;
}

TEST(HostsyncRing, NeverStallsWhileTheDeviceKeepsUp) {
  double sum = 0, lag = 0;
  EXPECT_EQ(simulate(defaults::hostsync_async_slots, 1, 1000, sum, lag), 0);
  EXPECT_DOUBLE_EQ(sum, 999.0 * 1000 / 2);
  EXPECT_NEAR(lag, 1.0, 0.01);  // read one step later
  EXPECT_EQ(simulate(4, 3, 1000, sum, lag), 0);
  EXPECT_GT(simulate(4, 6, 1000, sum, lag), 0);  // a device far behind fills the ring
  EXPECT_DOUBLE_EQ(sum, 999.0 * 1000 / 2);
}

// ---- CUDA: every pattern against the reference -------------------------------------------------

class HostsyncVariant : public ::testing::TestWithParam<std::size_t> {};

TEST_P(HostsyncVariant, MatchesReference) {
  const Variant& v = stage().variants.at(GetParam());
  if (const std::string why = testing::cannot_run_here(v); !why.empty()) GTEST_SKIP() << v.id << ": " << why;
  // One element, a batch that is not a multiple of the block, a large prime; calls repeated so
  // that values carried across calls (running sums, reads still in flight) are checked too.
  for (const auto& [steps, elements] : std::vector<std::pair<int, int>>{{1, 1}, {7, 7}, {5, 1000003}, {50, 4096}})
    for (int runs : {1, 3}) {
      const Problem p({{"steps", std::to_string(steps)}, {"elements", std::to_string(elements)}});
      const Verdict verdict = testing::run_and_check(v, p, runs);
      EXPECT_TRUE(verdict.passed) << v.id << " at " << p.label() << " x" << runs << ": " << verdict.detail;
    }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, HostsyncVariant, ::testing::Range<std::size_t>(0, stage().variants.size()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           const Variant& v = stage().variants.at(info.param);
                           return std::string(to_string(v.backend)) + "_" + v.id;
                         });

// On a machine that cannot run them, `--filter hostsync` lists the patterns with the reason.
TEST(HostsyncHarness, WithoutAGpuTheRowsSayWhy) {
  if (cuda_status().available()) GTEST_SKIP() << "a CUDA device is present";
  Settings settings;
  settings.filter = "^hostsync/";
  const auto entries = select_entries(builtin_registry(), settings);
  ASSERT_EQ(entries.size(), stage().variants.size() * 4);
  for (const auto& e : entries) EXPECT_FALSE(e.unsupported.empty()) << e.name;
}

}  // namespace
}  // namespace tb

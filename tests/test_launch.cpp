// Stage `launch`: the window's construction, its reference, the learning-rate schedule and the
// graph break-even arithmetic on any machine; every CUDA variant against the reference where there
// is a GPU (skipped with the reason elsewhere). The reference must catch a wrong state.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "harness.h"
#include "launch/launch.h"
#include "runtime/defaults.h"
#include "stage_testing.h"

namespace tb {
namespace {

const Stage& stage() { return *builtin_registry().find("launch"); }

TEST(LaunchWindow, IsTheTrainer2Window) {
  const auto window = launch::build_window(defaults::launch_window_steps, defaults::launch_kernels_per_step);
  ASSERT_EQ(window.size(), 64u * 12u);  // docs/sources.md#002-trainer2: 64 steps x ~12 kernels
  std::set<int64_t> steps_with_update;
  for (std::size_t i = 0; i < window.size(); ++i) {
    const launch::WindowKernel& k = window[i];
    EXPECT_EQ(k.step, static_cast<int64_t>(i) / 12);
    EXPECT_EQ(k.index, static_cast<int64_t>(i) % 12);
    EXPECT_NE(k.dst, k.src);
    EXPECT_GE(k.dst, 0);
    EXPECT_LT(k.src, launch::state_buffers);
    EXPECT_EQ(k.takes_lr, k.index == 11);
    if (k.takes_lr) steps_with_update.insert(k.step);
    // Bounded: |a| + |b| < 1 whatever the learning rate of the schedule.
    for (float lr : {launch::lr_for_window(0), launch::lr_for_window(1)})
      EXPECT_LT(std::abs(k.a) + std::abs(launch::coefficient_b(k, lr)), 1.0f);
  }
  EXPECT_EQ(steps_with_update.size(), 64u);  // one update node per step
  // Deterministic: a second build is the same program.
  const auto again = launch::build_window(64, 12);
  for (std::size_t i = 0; i < window.size(); ++i) {
    EXPECT_EQ(window[i].a, again[i].a);
    EXPECT_EQ(window[i].c, again[i].c);
  }
  // Kernels are not all alike: the coefficients vary.
  EXPECT_NE(window[0].a, window[1].a);
  // Every state buffer is written.
  std::set<int> written;
  for (const auto& k : window) written.insert(k.dst);
  EXPECT_EQ(written.size(), static_cast<std::size_t>(launch::state_buffers));
}

TEST(LaunchWindow, RegistryCountsTheKernels) {
  const Problem p({{"steps", "64"}, {"kernels_per_step", "12"}, {"elements", "4096"}});
  for (const char* id : {"eager", "graph", "graph_with_capture", "graph_update"}) {
    const Work w = stage().find_variant(id, Backend::cuda)->work(p);
    bool found = false;
    for (const auto& [k, v] : w.counters)
      if (k == "kernels") found = (v == 768);
    EXPECT_TRUE(found) << id;
  }
  // Each kernel reads dst and src and writes dst: 12 bytes an element.
  EXPECT_DOUBLE_EQ(stage().find_variant("graph", Backend::cuda)->work(p).bytes, 768.0 * 12 * 4096);
  EXPECT_FALSE(stage()
                   .find_variant("eager", Backend::cuda)
                   ->unsupported(Problem({{"steps", "2000"}, {"kernels_per_step", "1000"}, {"elements", "1"}}))
                   .empty());
}

TEST(LaunchWindow, LearningRateChangesEveryWindow) {
  EXPECT_EQ(launch::lr_for_window(0), launch::fixed_lr);
  for (int64_t w = 0; w < 10; ++w) EXPECT_NE(launch::lr_for_window(w), launch::lr_for_window(w + 1));
}

TEST(LaunchReference, OneKernelByHand) {
  const auto window = launch::build_window(1, 1);
  ASSERT_EQ(window.size(), 1u);
  const launch::WindowKernel& k = window[0];
  const int64_t n = 3;
  const std::vector<float> start = launch::initial_state(n);
  const std::vector<float> after = launch::reference_state(window, n, 1, false);
  for (int64_t i = 0; i < n; ++i) {
    const float dst = start[static_cast<std::size_t>(k.dst * n + i)], src = start[static_cast<std::size_t>(k.src * n + i)];
    EXPECT_EQ(after[static_cast<std::size_t>(k.dst * n + i)], std::fma(k.a, dst, std::fma(-launch::fixed_lr, src, k.c)));
    EXPECT_EQ(after[static_cast<std::size_t>(k.src * n + i)], src);  // only dst changes
  }
  EXPECT_EQ(launch::reference_state(window, n, 0, false), start);
}

TEST(LaunchReference, ScheduleMattersFromTheSecondWindow) {
  const auto window = launch::build_window(4, 3);
  EXPECT_EQ(launch::reference_state(window, 5, 1, true), launch::reference_state(window, 5, 1, false));
  EXPECT_NE(launch::reference_state(window, 5, 2, true), launch::reference_state(window, 5, 2, false));
}

TEST(LaunchReference, StateStaysBoundedOverManyWindows) {
  const auto window = launch::build_window(8, 12);
  const std::vector<float> state = launch::reference_state(window, 16, 500, true);
  for (float x : state) {
    EXPECT_TRUE(std::isfinite(x));
    EXPECT_LT(std::abs(x), 8.0f);  // |c| / (1 - max(|a| + |b|)) = 0.5 / 0.125 = 4, plus the start
  }
}

TEST(LaunchReference, CatchesOneUlp) {
  const auto window = launch::build_window(2, 12);
  const std::vector<float> want = launch::reference_state(window, 7, 2, false);
  std::vector<float> got = want;
  EXPECT_TRUE(launch::check_state(got, want, 7).passed);
  got[9] = std::nextafter(got[9], 10.0f);
  const Verdict v = launch::check_state(got, want, 7);
  EXPECT_FALSE(v.passed);
  EXPECT_NE(v.detail.find("state buffer 1[2]"), std::string::npos) << v.detail;
  // A window run one time too many (or with the wrong learning rate) is caught too.
  EXPECT_FALSE(launch::check_state(launch::reference_state(window, 7, 3, false), want, 7).passed);
  EXPECT_FALSE(launch::check_state(launch::reference_state(window, 7, 2, true), want, 7).passed);
  EXPECT_FALSE(launch::check_state(std::vector<float>(3), want, 7).passed);
}

TEST(LaunchEconomics, BreakEvenReplays) {
  // 2 ms to capture and instantiate, 1.5 ms eager vs 0.5 ms replayed: two replays pay for it.
  EXPECT_DOUBLE_EQ(launch::breakeven_replays(2e-3, 1.5e-3, 0.5e-3), 2);
  EXPECT_DOUBLE_EQ(launch::breakeven_replays(2.1e-3, 1.5e-3, 0.5e-3), 3);
  EXPECT_DOUBLE_EQ(launch::breakeven_replays(1e-6, 1.5e-3, 0.5e-3), 1);      // at least one replay
  EXPECT_TRUE(std::isinf(launch::breakeven_replays(1e-3, 0.5e-3, 0.5e-3)));  // no saving: never
  EXPECT_TRUE(std::isinf(launch::breakeven_replays(1e-3, 0.4e-3, 0.5e-3)));
  // docs/sources.md#002-trainer2's own estimate: 64 x 12 kernels at 7 us, a graph launch ~50 us.
  const double eager = 64 * 12 * 7e-6, replay = 50e-6;
  EXPECT_NEAR(launch::saving_per_kernel_s(eager, replay, 768), 7e-6 - 50e-6 / 768, 1e-12);
  EXPECT_DOUBLE_EQ(launch::saving_per_kernel_s(eager, replay, 0), 0);
}

// ---- CUDA: every variant against the reference -------------------------------------------------

std::vector<Problem> test_problems(const Variant& v) {
  if (v.axes.empty()) return {Problem{}};
  std::vector<Problem> problems;
  for (const auto& [steps, kernels, elements] :
       std::vector<std::tuple<int, int, int>>{{1, 1, 1}, {3, 12, 7}, {64, 12, 1000}, {2, 5, 1000003}})
    problems.push_back(Problem({{"steps", std::to_string(steps)},
                                {"kernels_per_step", std::to_string(kernels)},
                                {"elements", std::to_string(elements)}}));
  return problems;
}

class LaunchVariant : public ::testing::TestWithParam<std::size_t> {};

TEST_P(LaunchVariant, MatchesReference) {
  const Variant& v = stage().variants.at(GetParam());
  if (const std::string why = testing::cannot_run_here(v); !why.empty()) GTEST_SKIP() << v.id << ": " << why;
  for (const auto& p : test_problems(v))
    for (int runs : {1, 4}) {  // graph_update changes its nodes from the second window on
      const Verdict verdict = testing::run_and_check(v, p, runs);
      EXPECT_TRUE(verdict.passed) << v.id << " at " << p.label() << " x" << runs << ": " << verdict.detail;
    }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, LaunchVariant, ::testing::Range<std::size_t>(0, stage().variants.size()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           const Variant& v = stage().variants.at(info.param);
                           return std::string(to_string(v.backend)) + "_" + v.id;
                         });

// The graph instance times eager, replay and capture itself: the break-even comes with the row.
TEST(LaunchCuda, GraphReportsItsBreakEven) {
  const Variant& v = *stage().find_variant("graph", Backend::cuda);
  if (const std::string why = testing::cannot_run_here(v); !why.empty()) GTEST_SKIP() << why;
  auto session = make_session(Backend::cuda, 0);
  auto instance = v.make(Problem({{"steps", "8"}, {"kernels_per_step", "12"}, {"elements", "4096"}}), session->context());
  instance->run();
  ASSERT_TRUE(instance->check().passed);
  std::set<std::string> keys;
  for (const auto& [k, value] : instance->observed()) {
    keys.insert(k);
    EXPECT_TRUE(std::isfinite(value)) << k;
  }
  for (const char* k : {"eager_us_per_kernel", "graph_us_per_kernel", "saving_us_per_kernel", "capture_instantiate_us"})
    EXPECT_EQ(keys.count(k), 1u) << k;
  EXPECT_TRUE(instance->check().passed);  // the windows it ran to measure are counted
}

TEST(LaunchHarness, WithoutAGpuFilterLaunchSaysWhy) {
  if (cuda_status().available()) GTEST_SKIP() << "a CUDA device is present";
  Settings settings;  // backends: cpu, as --backend auto picks without a device
  settings.filter = "launch";
  const auto entries = select_entries(builtin_registry(), settings);
  ASSERT_EQ(entries.size(), stage().variants.size());
  for (const auto& e : entries) {
    EXPECT_EQ(e.stage->name, "launch");
    EXPECT_FALSE(e.unsupported.empty()) << e.name;
  }
}

}  // namespace
}  // namespace tb

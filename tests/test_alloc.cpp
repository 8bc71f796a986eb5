// Stage `alloc`: the step plans, the probes and the reference checksum on any machine; every CUDA
// strategy against the reference where there is a GPU (skipped with the reason elsewhere). The
// reference must catch a wrong checksum.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "alloc/alloc.h"
#include "harness.h"
#include "runtime/defaults.h"
#include "stage_testing.h"

namespace tb {
namespace {

using alloc::Strategy;

const Stage& stage() { return *builtin_registry().find("alloc"); }

TEST(AllocPlan, DefaultsComeFromTheReports) {
  EXPECT_EQ(stage().find_axis("buffers")->values, (std::vector<std::string>{"12"}));  // ~12 kernels/step
  EXPECT_EQ(stage().find_axis("buffer_bytes")->values,
            (std::vector<std::string>{std::to_string(128 * 768 * 4), std::to_string(4096 * 768 * 4)}));
}

TEST(AllocPlan, WhatAStepAsksOfTheAllocator) {
  EXPECT_EQ(alloc::step_plan(Strategy::malloc_free, 12).allocations, 12);
  EXPECT_EQ(alloc::step_plan(Strategy::pool, 12).allocations, 12);
  EXPECT_EQ(alloc::step_plan(Strategy::reuse, 12).allocations, 0);
  EXPECT_EQ(alloc::step_plan(Strategy::empty_cache, 12).releases, 1);
  EXPECT_EQ(alloc::step_plan(Strategy::pool, 12).releases, 0);
  for (Strategy s : {Strategy::malloc_free, Strategy::pool, Strategy::reuse, Strategy::empty_cache})
    EXPECT_EQ(alloc::step_plan(s, 12).kernels, 13) << alloc::to_string(s);  // same kernels in all four
  const Problem p({{"buffers", "12"}, {"buffer_bytes", "393216"}});
  const Work w = stage().find_variant("malloc_free", Backend::cuda)->work(p);
  bool found = false;
  for (const auto& [k, v] : w.counters)
    if (k == "bytes_allocated") found = v == 12.0 * 393216;
  EXPECT_TRUE(found);
  EXPECT_DOUBLE_EQ(w.bytes, 12 * 3 * (4 + 4 + 16));  // probes written, read, added into the checksum
  EXPECT_DOUBLE_EQ(stage().find_variant("reuse", Backend::cuda)->work(p).bytes, w.bytes);
}

TEST(AllocPlan, ShapesTheKernelsCannotTake) {
  EXPECT_EQ(alloc::shape_reason(12, 393216), "");
  EXPECT_EQ(alloc::shape_reason(1, 12), "");
  EXPECT_EQ(alloc::shape_reason(defaults::alloc_max_buffers, 12), "");
  EXPECT_NE(alloc::shape_reason(defaults::alloc_max_buffers + 1, 12), "");
  EXPECT_NE(alloc::shape_reason(1, 8), "");   // fewer than three words
  EXPECT_NE(alloc::shape_reason(1, 14), "");  // not whole words
  const Variant& v = *stage().find_variant("pool", Backend::cuda);
  EXPECT_NE(v.unsupported(Problem({{"buffers", "100"}, {"buffer_bytes", "4096"}})), "");
}

TEST(AllocReference, ProbesAreDistinctWordsInsideTheBuffer) {
  for (int64_t words : {3, 4, 7, 98304, 1000003}) {
    std::set<int64_t> at;
    for (int p = 0; p < alloc::probes_per_buffer; ++p) {
      const int64_t w = alloc::probe_word(words, p);
      EXPECT_GE(w, 0);
      EXPECT_LT(w, words);
      at.insert(w);
    }
    EXPECT_EQ(at.size(), 3u) << words;
  }
  // Values differ between steps, buffers and probes: a stale or swapped buffer shows.
  EXPECT_NE(alloc::probe_value(0, 0, 0), alloc::probe_value(1, 0, 0));
  EXPECT_NE(alloc::probe_value(0, 0, 0), alloc::probe_value(0, 1, 0));
  EXPECT_NE(alloc::probe_value(0, 0, 0), alloc::probe_value(0, 0, 1));
}

TEST(AllocReference, ChecksumByHand) {
  uint64_t one = 0;
  for (int p = 0; p < 3; ++p) one += alloc::probe_value(0, 0, p);
  EXPECT_EQ(alloc::reference_checksum(1, 1), one);
  EXPECT_EQ(alloc::reference_checksum(0, 12), 0u);
  uint64_t two_steps = alloc::reference_checksum(1, 5);
  for (int64_t b = 0; b < 5; ++b)
    for (int p = 0; p < 3; ++p) two_steps += alloc::probe_value(1, b, p);
  EXPECT_EQ(alloc::reference_checksum(2, 5), two_steps);
}

TEST(AllocReference, CatchesAWrongChecksum) {
  const uint64_t want = alloc::reference_checksum(3, 12);
  EXPECT_TRUE(alloc::check_checksum(want, want, 3).passed);
  EXPECT_FALSE(alloc::check_checksum(want + 1, want, 3).passed);
  // A step whose buffer 7 was overwritten by buffer 8 (the two overlapping).
  uint64_t aliased = want;
  for (int p = 0; p < 3; ++p) aliased += uint64_t{alloc::probe_value(2, 8, p)} - alloc::probe_value(2, 7, p);
  const Verdict v = alloc::check_checksum(aliased, want, 3);
  EXPECT_FALSE(v.passed);
  EXPECT_NE(v.detail.find("overlapped"), std::string::npos);
  // One step short.
  EXPECT_FALSE(alloc::check_checksum(alloc::reference_checksum(2, 12), want, 3).passed);
}

// ---- CUDA: every strategy against the reference ------------------------------------------------

class AllocVariant : public ::testing::TestWithParam<std::size_t> {};

TEST_P(AllocVariant, MatchesReference) {
  const Variant& v = stage().variants.at(GetParam());
  if (const std::string why = testing::cannot_run_here(v); !why.empty()) GTEST_SKIP() << v.id << ": " << why;
  for (const auto& [buffers, bytes] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 12}, {12, 393216}, {defaults::alloc_max_buffers, 4000012}, {3, 12582912}})
    for (int runs : {1, 5}) {
      const Problem p({{"buffers", std::to_string(buffers)}, {"buffer_bytes", std::to_string(bytes)}});
      ASSERT_EQ(v.unsupported(p), "") << p.label();
      const Verdict verdict = testing::run_and_check(v, p, runs);
      EXPECT_TRUE(verdict.passed) << v.id << " at " << p.label() << " x" << runs << ": " << verdict.detail;
    }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, AllocVariant, ::testing::Range<std::size_t>(0, stage().variants.size()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           const Variant& v = stage().variants.at(info.param);
                           return std::string(to_string(v.backend)) + "_" + v.id;
                         });

// Pairs are compared at equal problems: in all three GPU-only stages, both sides of every pair must
// be swept over the same axes, or the harness would never find them side by side.
TEST(RuntimeOverheadStages, PairsShareTheirAxes) {
  for (const char* name : {"hostsync", "launch", "alloc"}) {
    const Stage* s = builtin_registry().find(name);
    ASSERT_NE(s, nullptr) << name;
    EXPECT_FALSE(s->pairs.empty()) << name;
    for (const auto& pair : s->pairs) {
      const Variant* base = s->find_variant(pair.baseline, Backend::cuda);
      const Variant* improved = s->find_variant(pair.improved, Backend::cuda);
      ASSERT_TRUE(base && improved) << pair.label;
      EXPECT_EQ(base->axes, improved->axes) << pair.label;
    }
    for (const auto& v : s->variants) {
      EXPECT_EQ(v.backend, Backend::cuda) << name << "/" << v.id;  // GPU-only stages
      EXPECT_FALSE(v.rationale.empty());
    }
  }
}

TEST(AllocHarness, WithoutAGpuTheRowsSayWhy) {
  if (cuda_status().available()) GTEST_SKIP() << "a CUDA device is present";
  Settings settings;
  settings.filter = "^alloc/";
  const auto entries = select_entries(builtin_registry(), settings);
  ASSERT_EQ(entries.size(), stage().variants.size() * 2);  // two buffer sizes
  for (const auto& e : entries) EXPECT_FALSE(e.unsupported.empty()) << e.name;
}

}  // namespace
}  // namespace tb

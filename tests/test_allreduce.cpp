// Stage `allreduce`: DDP's bucket plan, the bus-bandwidth model, the reference catching a wrong sum,
// and every variant on one rank (MPI started as a singleton; the multi-rank runs are ranks_pytest's,
// under mpirun). Skips with the reason where MPI (CPU) or NCCL and a GPU (CUDA) are not here.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "allreduce/allreduce.h"
#include "harness.h"
#include "runtime/comm.h"
#include "stage_testing.h"

namespace tb {
namespace {

using allreduce::Bucket;
using allreduce::Kind;

const Stage& allreduce_stage() { return *builtin_registry().find("allreduce"); }

TEST(AllreduceBuckets, ReverseModelOrderEachAtLeastTheCapAndEveryTensorOnce) {
  const adamw::ParamSet set = adamw::make_param_set(29'900'000, 200);
  const double cap = 25.0 * (1 << 20);
  const auto buckets = allreduce::make_buckets(set, 4.0, cap);
  ASSERT_GT(buckets.size(), 3u);
  std::vector<int> seen(static_cast<std::size_t>(set.count()), 0);
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const Bucket& k = buckets[b];
    ASSERT_LE(k.first_tensor, k.last_tensor);
    for (int64_t t = k.first_tensor; t <= k.last_tensor; ++t) ++seen[static_cast<std::size_t>(t)];
    EXPECT_EQ(k.begin, set.offsets[k.first_tensor]);
    EXPECT_EQ(k.begin + k.length, set.offsets[k.last_tensor] + set.sizes[k.last_tensor]);
    double bytes = 0;
    for (int64_t t = k.first_tensor; t <= k.last_tensor; ++t) bytes += 4.0 * static_cast<double>(set.sizes[t]);
    if (b + 1 < buckets.size()) {
      EXPECT_GE(bytes, cap) << "bucket " << b << " closed early";
      // The next bucket holds the tensors just before this one: the backward's order.
      EXPECT_EQ(buckets[b + 1].last_tensor, k.first_tensor - 1);
      // DDP closes a bucket at the tensor that reaches the cap: without it the bucket is below the cap.
      EXPECT_LT(bytes - 4.0 * static_cast<double>(set.sizes[k.first_tensor]), cap);
    }
  }
  EXPECT_EQ(buckets.front().last_tensor, set.count() - 1);  // the output head's gradient goes first
  EXPECT_EQ(buckets.back().first_tensor, 0);
  for (int count : seen) EXPECT_EQ(count, 1);
}

TEST(AllreduceBuckets, CallsPerVariant) {
  const adamw::ParamSet set = adamw::make_param_set(1'000'003, 200);
  const auto per_tensor = allreduce::calls_for(Kind::per_tensor, set, 4.0, 0);
  EXPECT_EQ(static_cast<int64_t>(per_tensor.size()), set.nonempty());
  for (std::size_t i = 1; i < per_tensor.size(); ++i) EXPECT_LT(per_tensor[i].first_tensor, per_tensor[i - 1].first_tensor);
  const auto flat = allreduce::calls_for(Kind::flat, set, 4.0, 0);
  ASSERT_EQ(flat.size(), 1u);
  EXPECT_EQ(flat[0].length, set.arena);
  // A cap above the whole set: one bucket, the flat buffer's; a tiny cap: one bucket per tensor.
  EXPECT_EQ(allreduce::make_buckets(set, 4.0, 1e12).size(), 1u);
  EXPECT_EQ(static_cast<int64_t>(allreduce::make_buckets(set, 4.0, 1).size()), set.count());
}

TEST(AllreduceModel, BusBytesAsNcclTestsAndALocalCopyOnOneRank) {
  EXPECT_DOUBLE_EQ(allreduce::rated_bytes(100, 1), 200);  // read and write of the copy
  EXPECT_DOUBLE_EQ(allreduce::rated_bytes(100, 2), 100);
  EXPECT_DOUBLE_EQ(allreduce::rated_bytes(100, 8), 175);
  EXPECT_DOUBLE_EQ(comm::ring_bus_factor(1), 0);
  EXPECT_DOUBLE_EQ(comm::ring_bus_factor(4), 1.5);
}

TEST(AllreduceReference, AcceptsTheSumAndCatchesOneWrongElement) {
  const int64_t n = 5000;
  for (const auto dtype : {adamw::Dtype::fp32, adamw::Dtype::bf16}) {
    std::vector<float> got(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      got[static_cast<std::size_t>(i)] = static_cast<float>(allreduce::expected_sum(3, i, dtype));
    const Verdict ok = allreduce::check_sum(got, 3, dtype);
    EXPECT_TRUE(ok.passed) << ok.detail;
    got[1234] += 0.25f;  // what a rank missing from the sum, or a stale bucket, looks like
    const Verdict bad = allreduce::check_sum(got, 3, dtype);
    EXPECT_FALSE(bad.passed);
    EXPECT_NE(bad.detail.find("at 1234"), std::string::npos) << bad.detail;
    // One rank's values alone are not the sum of three.
    for (int64_t i = 0; i < n; ++i) got[static_cast<std::size_t>(i)] = allreduce::rank_value(0, i, dtype);
    EXPECT_FALSE(allreduce::check_sum(got, 3, dtype).passed);
  }
}

Problem small_problem(const Variant& v, const std::string& dtype) {
  std::vector<std::pair<std::string, std::string>> values{{"params", "100003"}, {"tensors", "20"}, {"dtype", dtype},
                                                          {"bucket_mb", "0.1"}, {"tokens", "2"},   {"link_mb", "1"}};
  std::vector<std::pair<std::string, std::string>> kept;
  for (const auto& kv : values)
    if (std::find(v.axes.begin(), v.axes.end(), kv.first) != v.axes.end()) kept.push_back(kv);
  return Problem(kept);
}

std::string cannot_run(const Variant& v, const Problem& p) {
  if (std::string why = testing::cannot_run_here(v); !why.empty()) return why;
  return v.unsupported ? v.unsupported(p) : "";
}

class AllreduceVariant : public ::testing::TestWithParam<std::size_t> {};

// One rank: every variant's sums are the rank's own values, after one call and after several.
TEST_P(AllreduceVariant, MatchesTheReferenceOnOneRank) {
  const Variant& v = allreduce_stage().variants.at(GetParam());
  for (const char* dtype : {"fp32", "bf16"}) {
    const Problem p = small_problem(v, dtype);
    if (const std::string why = cannot_run(v, p); !why.empty()) GTEST_SKIP() << why;
    for (int runs : {1, 3}) {
      const Verdict verdict = testing::run_and_check(v, p, runs);
      EXPECT_TRUE(verdict.passed) << v.id << " at " << p.label() << " after " << runs << ": " << verdict.detail;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, AllreduceVariant, ::testing::Range<std::size_t>(0, allreduce_stage().variants.size()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           const Variant& v = allreduce_stage().variants.at(info.param);
                           return std::string(to_string(v.backend)) + "_" + v.id;
                         });

// The overlap variant reports how much of the all-reduce the backward hid; the serial one only its parts.
TEST(AllreduceOverlap, ReportsItsPartsAndTheHiddenShare) {
  for (const char* id : {"serial", "overlap"}) {
    const Variant& v = *allreduce_stage().find_variant(id, Backend::cpu);
    const Problem p = small_problem(v, "fp32");
    if (const std::string why = cannot_run(v, p); !why.empty()) GTEST_SKIP() << why;
    auto session = make_session(v.backend, 0);
    auto instance = v.make(p, session->context());
    instance->run();
    ASSERT_TRUE(instance->check().passed);
    std::set<std::string> names;
    for (const auto& [name, value] : instance->observed()) {
      names.insert(name);
      if (name != "hidden_share") {
        EXPECT_GT(value, 0) << name;
      }
    }
    EXPECT_TRUE(names.count("backward_ms") && names.count("allreduce_ms")) << id;
    EXPECT_EQ(names.count("hidden_share"), std::string(id) == "overlap" ? 1u : 0u) << id;
  }
}

// A pair whose variants have different axes (bucket_mb is the bucketed variant's own) still compares
// them at the problem they share.
TEST(AllreduceHarness, PairsAcrossVariantsWithDifferentAxes) {
  const Variant& bucketed = *allreduce_stage().find_variant("bucketed", Backend::cpu);
  if (const std::string why = cannot_run(bucketed, small_problem(bucketed, "fp32")); !why.empty()) GTEST_SKIP() << why;
  Settings s;
  s.repetitions = 3;
  s.min_time_s = 0.01;
  s.filter = "allreduce/cpu/(per_tensor|bucketed)/";
  s.peak_prepass = false;
  s.overrides = {parse_axis_override(builtin_registry(), "allreduce.params=100003"),
                 parse_axis_override(builtin_registry(), "allreduce.tensors=20"),
                 parse_axis_override(builtin_registry(), "allreduce.dtype=fp32"),
                 parse_axis_override(builtin_registry(), "allreduce.bucket_mb=0.1")};
  std::ostringstream progress;
  const Results r = run_entries(builtin_registry(), select_entries(builtin_registry(), s), s, progress);
  ASSERT_EQ(r.rows.size(), 2u);
  for (const auto& row : r.rows) EXPECT_EQ(row.disposition, Disposition::passed) << row.name << ": " << row.reason;
  const bool paired = std::any_of(r.pairs.begin(), r.pairs.end(), [](const PairRow& p) {
    return p.label == "allreduce: DDP buckets vs one call per tensor";
  });
  const bool withheld = std::any_of(r.withheld_pairs.begin(), r.withheld_pairs.end(), [](const WithheldPair& p) {
    return p.label == "allreduce: DDP buckets vs one call per tensor";
  });
  EXPECT_TRUE(paired || withheld) << progress.str();
}

}  // namespace
}  // namespace tb

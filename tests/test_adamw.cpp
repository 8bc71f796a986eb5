// Stage `adamw`: every registered variant against the reference after several steps, at odd sizes
// and in both dtypes; per_tensor, foreach and fused against each other; the reference catches a
// wrong update; and the parameter-set layout the stage (and `gradnorm`) is built on.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <set>

#include "adamw/adamw.h"
#include "runtime/defaults.h"
#include "runtime/error.h"
#include "runtime/random.h"
#include "runtime/tolerance.h"
#include "stage_testing.h"

namespace tb {
namespace {

using adamw::Dtype;
using adamw::HostState;
using adamw::ParamSet;

const Stage& adamw_stage() { return *builtin_registry().find("adamw"); }

constexpr int steps = 3;

Problem problem(int64_t params, int64_t tensors, const std::string& dtype) {
  return Problem({{"params", std::to_string(params)}, {"tensors", std::to_string(tensors)}, {"dtype", dtype}});
}

// ---- every variant against the reference -------------------------------------------------------

class AdamwVariant : public ::testing::TestWithParam<std::size_t> {};

TEST_P(AdamwVariant, MatchesReferenceAfterSeveralStepsAtOddSizes) {
  const Variant& v = adamw_stage().variants.at(GetParam());
  for (const Problem& p : testing::odd_param_set_problems()) TB_EXPECT_MATCHES_REFERENCE_AFTER(v, p, steps);
}

INSTANTIATE_TEST_SUITE_P(AllVariants, AdamwVariant, ::testing::Range<std::size_t>(0, adamw_stage().variants.size()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           const Variant& v = adamw_stage().variants.at(info.param);
                           return std::string(to_string(v.backend)) + "_" + v.id;
                         });

// ---- the variants against each other -----------------------------------------------------------

HostState state_after(const Variant& v, const Problem& p, int runs) {
  auto session = make_session(v.backend, 0);
  auto instance = v.make(p, session->context());
  for (int i = 0; i < runs; ++i) instance->run();
  auto* source = dynamic_cast<adamw::StateSource*>(instance.get());
  EXPECT_NE(source, nullptr) << v.id << " does not expose its state";
  if (!source) return {};
  EXPECT_EQ(source->steps(), runs);
  return source->state();
}

// The same arithmetic, so a few ulps apart: the for-loop path rounds after each of its ops, the fused
// pass once per step (measured on the CPU: within a third of these bounds after 3 and 10 steps).
void expect_close(const std::vector<float>& a, const std::vector<float>& b, Tolerance tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!tol.accepts(a[i], b[i])) {
      ADD_FAILURE() << what << "[" << i << "]: " << a[i] << " vs " << b[i];
      return;
    }
}

constexpr double fp32_ulp = 1.0 / (1 << 23), bf16_ulp = 1.0 / (1 << 7);  // relative, at worst
// fp32: 4 ulps per step; near zero, where the update cancels the weight, 1e-9 per step.
constexpr Tolerance agree_fp32{steps * 1e-9, steps * 4 * fp32_ulp};
// bf16 parameters: the for-loop path rounds them twice per step (after mul_ and after addcdiv_), so
// one bf16 ulp per step; near zero, half a bf16 ulp of a step's update (about lr).
constexpr Tolerance agree_bf16_param{steps * defaults::adamw_lr * bf16_ulp / 2, steps* bf16_ulp};

void expect_variants_agree(Backend backend) {
  const Stage& stage = adamw_stage();
  const Variant* per_tensor = stage.find_variant("per_tensor", backend);
  const Variant* foreach = stage.find_variant("foreach", backend);
  const Variant* fused = stage.find_variant("fused", backend);
  ASSERT_TRUE(per_tensor && foreach && fused);
  if (const std::string why = testing::cannot_run_here(*fused); !why.empty()) GTEST_SKIP() << why;
  for (const char* dtype : {"fp32", "bf16"})
    for (const Problem& p : {problem(1000003, 200, dtype), problem(7, 200, dtype)}) {
      const HostState want = state_after(*fused, p, steps);
      for (const Variant* other : {per_tensor, foreach}) {
        const HostState got = state_after(*other, p, steps);
        const std::string where = std::string(to_string(backend)) + "/" + other->id + " vs fused at " + p.label();
        expect_close(got.param, want.param, std::string(dtype) == "fp32" ? agree_fp32 : agree_bf16_param, where + ": param");
        expect_close(got.exp_avg, want.exp_avg, agree_fp32, where + ": exp_avg");
        expect_close(got.exp_avg_sq, want.exp_avg_sq, agree_fp32, where + ": exp_avg_sq");
      }
    }
}

TEST(AdamwVariants, AgreeWithEachOtherOnCpu) { expect_variants_agree(Backend::cpu); }
TEST(AdamwVariants, AgreeWithEachOtherOnCuda) { expect_variants_agree(Backend::cuda); }

// The state changes step by step: a later check against an earlier step count fails.
TEST(AdamwVariants, KeepTheirStepCount) {
  const Variant* fused = adamw_stage().find_variant("fused", Backend::cpu);
  const Problem p = problem(1000, 7, "fp32");
  const ParamSet set = adamw::make_param_set(1000, 7);
  const HostState after3 = state_after(*fused, p, 3);
  EXPECT_TRUE(adamw::check_state(set, Dtype::fp32, 3, after3).passed);
  EXPECT_FALSE(adamw::check_state(set, Dtype::fp32, 2, after3).passed);
  EXPECT_FALSE(adamw::check_state(set, Dtype::fp32, 4, after3).passed);
}

// ---- the reference catches a wrong update ------------------------------------------------------

enum class Flavor { adamw, adam_l2_decay, no_bias_correction, no_weight_decay };

// An independent float implementation with one thing switched, to show the check has teeth.
HostState hand_rolled(const ParamSet& set, int64_t n_steps, Flavor flavor) {
  using namespace defaults;
  HostState s;
  for (int64_t i = 0; i < set.total; ++i) {
    float p = adamw::initial_value(adamw::seed_param, i, Dtype::fp32);
    const float g0 = adamw::initial_value(adamw::seed_grad, i, Dtype::fp32);
    float m = 0, v = 0;
    for (int64_t k = 1; k <= n_steps; ++k) {
      float g = g0;
      const double wd = flavor == Flavor::no_weight_decay ? 0.0 : adamw_weight_decay;
      if (flavor == Flavor::adam_l2_decay) g += static_cast<float>(wd) * p;
      else p -= static_cast<float>(adamw_lr * wd) * p;
      m = static_cast<float>(adamw_beta1) * m + static_cast<float>(1 - adamw_beta1) * g;
      v = static_cast<float>(adamw_beta2) * v + static_cast<float>(1 - adamw_beta2) * g * g;
      const bool correct = flavor != Flavor::no_bias_correction;
      const double bc1 = correct ? 1 - std::pow(adamw_beta1, k) : 1.0;
      const double bc2 = correct ? 1 - std::pow(adamw_beta2, k) : 1.0;
      const float denom = std::sqrt(v) / static_cast<float>(std::sqrt(bc2)) + static_cast<float>(adamw_eps);
      p -= static_cast<float>(adamw_lr / bc1) * m / denom;
    }
    s.param.push_back(p);
    s.exp_avg.push_back(m);
    s.exp_avg_sq.push_back(v);
  }
  return s;
}

TEST(AdamwReference, CatchesAWrongUpdate) {
  const ParamSet set = adamw::make_param_set(1000, 13);
  EXPECT_TRUE(adamw::check_state(set, Dtype::fp32, steps, hand_rolled(set, steps, Flavor::adamw)).passed);
  for (const Flavor wrong : {Flavor::adam_l2_decay, Flavor::no_bias_correction, Flavor::no_weight_decay}) {
    const Verdict v = adamw::check_state(set, Dtype::fp32, steps, hand_rolled(set, steps, wrong));
    EXPECT_FALSE(v.passed) << "flavor " << static_cast<int>(wrong);
  }
  HostState one_off = hand_rolled(set, steps, Flavor::adamw);
  one_off.param[777] += 1e-4f;
  const Verdict v = adamw::check_state(set, Dtype::fp32, steps, one_off);
  EXPECT_FALSE(v.passed);
  EXPECT_NE(v.detail.find("param of tensor"), std::string::npos) << v.detail;
  HostState short_state = hand_rolled(set, steps, Flavor::adamw);
  short_state.exp_avg.pop_back();
  EXPECT_FALSE(adamw::check_state(set, Dtype::fp32, steps, short_state).passed);
}

TEST(AdamwReference, Bf16StateIsRoundedEachStep) {
  const ParamSet set = adamw::make_param_set(257, 5);
  const HostState s = adamw::reference_state(set, Dtype::bf16, steps);
  for (const float p : s.param) EXPECT_EQ(p, round_to_bf16(p));
}

// ---- the parameter set -------------------------------------------------------------------------

TEST(ParamSet, SizesSumToTheTotalInTheRequestedCount) {
  for (const int64_t total : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{1000003}, defaults::adamw_params})
    for (const int64_t tensors : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{13}, int64_t{200}, int64_t{1000}}) {
      const ParamSet set = adamw::make_param_set(total, tensors);
      EXPECT_EQ(set.count(), tensors);
      EXPECT_EQ(std::accumulate(set.sizes.begin(), set.sizes.end(), int64_t{0}), total) << total << "/" << tensors;
      EXPECT_EQ(set.total, total);
      int64_t start = 0;
      for (int64_t t = 0; t < set.count(); ++t) {
        EXPECT_GE(set.sizes[t], 0);
        EXPECT_EQ(set.starts[t], start);
        start += set.sizes[t];
        EXPECT_EQ(set.offsets[t] % adamw::arena_alignment, 0);
        if (t + 1 < set.count()) {
          EXPECT_LE(set.offsets[t] + set.sizes[t], set.offsets[t + 1]);
        }
      }
      EXPECT_LE(set.offsets.back() + set.sizes.back(), set.arena);
    }
}

TEST(ParamSet, TinyTotalsGiveZeroSizeTensors) {
  const ParamSet set = adamw::make_param_set(7, 200);
  EXPECT_EQ(set.width, 0);
  EXPECT_EQ(set.nonempty(), 2);  // the embedding and the head; the 198 layer tensors are empty
  EXPECT_EQ(set.sizes.front() + set.sizes.back(), 7);
  EXPECT_TRUE(adamw::make_chunks(set, adamw::cpu_chunk).size() == 2);
  const ParamSet one = adamw::make_param_set(1, 200);
  EXPECT_EQ(one.nonempty(), 1);
  EXPECT_EQ(one.sizes.front(), 0);  // an empty tensor before the only element
}

TEST(ParamSet, DefaultIsShapedLikeATransformer) {
  const ParamSet set = adamw::make_param_set(defaults::adamw_params, defaults::adamw_tensors);
  EXPECT_EQ(set.nonempty(), defaults::adamw_tensors);
  ASSERT_GT(set.width, 100);
  int64_t vectors = 0, matrices = 0, matrix_elements = 0;
  for (const int64_t n : set.sizes) {
    if (n <= 4 * set.width) ++vectors;
    else {
      ++matrices;
      matrix_elements += n;
    }
  }
  EXPECT_GT(vectors, matrices);                                    // norm scales and biases outnumber the weights ...
  EXPECT_GT(matrix_elements, set.total * 8 / 10);                  // ... which hold most of the parameters
  EXPECT_GE(set.sizes.front() + set.sizes.back(), set.total / 8);  // embedding and head
  EXPECT_EQ(set.largest(), std::max(set.sizes.front(), 4 * set.width * set.width));
  EXPECT_EQ(adamw::make_param_set(defaults::adamw_params, defaults::adamw_tensors).sizes, set.sizes);  // deterministic
}

TEST(ParamSet, RejectsEmptySets) {
  EXPECT_THROW(adamw::make_param_set(0, 10), UsageError);
  EXPECT_THROW(adamw::make_param_set(10, 0), UsageError);
}

TEST(ParamSet, ChunksAndListLaunchesCoverEveryElementOnce) {
  const ParamSet set = adamw::make_param_set(1000003, 200);
  std::vector<int64_t> covered(static_cast<std::size_t>(set.count()), 0);
  for (const adamw::Chunk& c : adamw::make_chunks(set, 4096)) {
    EXPECT_EQ(c.begin, covered[c.tensor]);
    covered[c.tensor] += c.len;
  }
  EXPECT_EQ(covered, set.sizes);
  for (const int depth : {1, 2, 3}) {
    const int max_tensors = adamw::list_max_tensors[depth - 1];
    std::set<std::pair<int64_t, int64_t>> blocks;  // (tensor, chunk)
    for (const adamw::ListLaunch& l : adamw::plan_list_launches(set, max_tensors, 40, 4096)) {
      EXPECT_LE(static_cast<int>(l.tensors.size()), max_tensors);
      EXPECT_LE(l.blocks.size(), 40u);
      for (const auto& [local, chunk] : l.blocks) EXPECT_TRUE(blocks.insert({l.tensors.at(local), chunk}).second);
    }
    int64_t expected = 0;
    for (const int64_t n : set.sizes) expected += (n + 4095) / 4096;
    EXPECT_EQ(static_cast<int64_t>(blocks.size()), expected);
  }
}

// ---- the work model ----------------------------------------------------------------------------

TEST(AdamwWork, CreditsTheFusedTrafficAndCountsLaunches) {
  const Stage& stage = adamw_stage();
  const Problem p = problem(defaults::adamw_params, defaults::adamw_tensors, "fp32");
  auto counter = [](const Work& w, const std::string& key) {
    for (const auto& [k, v] : w.counters)
      if (k == key) return v;
    return -1.0;
  };
  for (const auto& v : stage.variants) {
    const Work w = v.work(p);
    EXPECT_DOUBLE_EQ(w.bytes, 28.0 * defaults::adamw_params) << v.id;
    EXPECT_EQ(w.peak_key, v.backend == Backend::cuda ? "cuda.copy" : "cpu.memory");
    EXPECT_EQ(counter(w, "tensors"), defaults::adamw_tensors);
  }
  EXPECT_DOUBLE_EQ(stage.find_variant("fused", Backend::cpu)->work(problem(1000, 3, "bf16")).bytes, 22.0 * 1000);
  EXPECT_EQ(counter(stage.find_variant("per_tensor", Backend::cuda)->work(p), "launches"), 8 * 200);
  EXPECT_EQ(counter(stage.find_variant("fused", Backend::cuda)->work(p), "launches"), 1);
  const double foreach_launches = counter(stage.find_variant("foreach", Backend::cuda)->work(p), "launches");
  EXPECT_GE(foreach_launches, 8 * 2);  // at least two launches per op: 200 tensors exceed every list
  EXPECT_LE(foreach_launches, 8 * 10);
  EXPECT_EQ(counter(stage.find_variant("foreach", Backend::cpu)->work(p), "launches"), 8);
}

}  // namespace
}  // namespace tb

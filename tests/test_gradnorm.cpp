// Stage `gradnorm`: every registered variant against the reference after several calls, at odd sizes
// and in both dtypes; the variants against each other; the reference catches a wrong norm or clip.
#include <gtest/gtest.h>

#include <cmath>

#include "gradnorm/gradnorm.h"
#include "runtime/defaults.h"
#include "runtime/tolerance.h"
#include "stage_testing.h"

namespace tb {
namespace {

using gradnorm::HostGrads;

const Stage& gradnorm_stage() { return *builtin_registry().find("gradnorm"); }

constexpr int calls = 3;

Problem problem(int64_t params, int64_t tensors, const std::string& dtype) {
  return Problem({{"params", std::to_string(params)}, {"tensors", std::to_string(tensors)}, {"dtype", dtype}});
}

class GradnormVariant : public ::testing::TestWithParam<std::size_t> {};

TEST_P(GradnormVariant, MatchesReferenceAfterSeveralCallsAtOddSizes) {
  const Variant& v = gradnorm_stage().variants.at(GetParam());
  for (const Problem& p : testing::odd_param_set_problems()) TB_EXPECT_MATCHES_REFERENCE_AFTER(v, p, calls);
}

INSTANTIATE_TEST_SUITE_P(AllVariants, GradnormVariant, ::testing::Range<std::size_t>(0, gradnorm_stage().variants.size()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           const Variant& v = gradnorm_stage().variants.at(info.param);
                           return std::string(to_string(v.backend)) + "_" + v.id;
                         });

HostGrads grads_after(const Variant& v, const Problem& p, int runs) {
  auto session = make_session(v.backend, 0);
  auto instance = v.make(p, session->context());
  for (int i = 0; i < runs; ++i) instance->run();
  auto* source = dynamic_cast<gradnorm::GradSource*>(instance.get());
  EXPECT_NE(source, nullptr) << v.id << " does not expose its gradients";
  if (!source) return {};
  EXPECT_EQ(source->calls(), runs);
  return source->grads();
}

// The same norm summed in other orders, the same factor applied: a few ulps apart.
void expect_variants_agree(Backend backend) {
  const Stage& stage = gradnorm_stage();
  const Variant* fused = stage.find_variant("fused", backend);
  ASSERT_NE(fused, nullptr);
  if (const std::string why = testing::cannot_run_here(*fused); !why.empty()) GTEST_SKIP() << why;
  for (const char* dtype : {"fp32", "bf16"}) {
    const Problem p = problem(1000003, 200, dtype);
    const HostGrads want = grads_after(*fused, p, calls);
    const Tolerance grad_tol = std::string(dtype) == "fp32" ? Tolerance{1e-12, 1e-6} : Tolerance{1e-12, 0.0078125};
    for (const char* id : {"per_tensor", "multi_tensor"}) {
      const HostGrads got = grads_after(*stage.find_variant(id, backend), p, calls);
      EXPECT_NEAR(got.norm, want.norm, 1e-5 * want.norm) << id << " at " << p.label();
      ASSERT_EQ(got.grad.size(), want.grad.size());
      for (std::size_t i = 0; i < got.grad.size(); ++i)
        if (!grad_tol.accepts(got.grad[i], want.grad[i])) {
          ADD_FAILURE() << id << " vs fused at " << p.label() << ": grad[" << i << "] " << got.grad[i] << " vs "
                        << want.grad[i];
          break;
        }
    }
  }
}

TEST(GradnormVariants, AgreeWithEachOtherOnCpu) { expect_variants_agree(Backend::cpu); }
TEST(GradnormVariants, AgreeWithEachOtherOnCuda) { expect_variants_agree(Backend::cuda); }

// ---- the reference catches a wrong norm or clip ------------------------------------------------

enum class Flavor { clip_grad_norm, sum_of_norms, unclamped, no_clip };

// An independent implementation with one thing switched. sum_of_norms is K-1's accumulation
// (total_norm += p.grad.norm().item()), which is not the 2-norm of all gradients.
HostGrads hand_rolled(const adamw::ParamSet& set, int64_t n_calls, Flavor flavor) {
  HostGrads out;
  for (int64_t i = 0; i < set.total; ++i) out.grad.push_back(adamw::initial_value(adamw::seed_grad, i, adamw::Dtype::fp32));
  for (int64_t c = 0; c < n_calls; ++c) {
    double total = 0;
    for (int64_t t = 0; t < set.count(); ++t) {
      double sq = 0;
      for (int64_t j = 0; j < set.sizes[t]; ++j) sq += double(out.grad[set.starts[t] + j]) * out.grad[set.starts[t] + j];
      total += flavor == Flavor::sum_of_norms ? std::sqrt(sq) : sq;
    }
    out.norm = flavor == Flavor::sum_of_norms ? total : std::sqrt(total);
    double coef = defaults::clip_max_norm / (out.norm + defaults::clip_norm_eps);
    if (flavor != Flavor::unclamped) coef = std::min(coef, 1.0);
    if (flavor == Flavor::no_clip) coef = 1.0;
    for (float& g : out.grad) g = static_cast<float>(g * coef);
  }
  return out;
}

TEST(GradnormReference, CatchesAWrongNormOrClip) {
  const adamw::ParamSet set = adamw::make_param_set(5000, 13);
  EXPECT_TRUE(gradnorm::check_grads(set, adamw::Dtype::fp32, calls, hand_rolled(set, calls, Flavor::clip_grad_norm)).passed);
  for (const Flavor wrong : {Flavor::sum_of_norms, Flavor::no_clip}) {
    const Verdict v = gradnorm::check_grads(set, adamw::Dtype::fp32, calls, hand_rolled(set, calls, wrong));
    EXPECT_FALSE(v.passed) << "flavor " << static_cast<int>(wrong);
  }
  // A norm below max_norm: clip_grad_norm_ leaves the gradients alone; without the clamp they grow.
  const adamw::ParamSet tiny = adamw::make_param_set(1, 1);
  EXPECT_TRUE(gradnorm::check_grads(tiny, adamw::Dtype::fp32, 1, hand_rolled(tiny, 1, Flavor::clip_grad_norm)).passed);
  EXPECT_FALSE(gradnorm::check_grads(tiny, adamw::Dtype::fp32, 1, hand_rolled(tiny, 1, Flavor::unclamped)).passed);
  // One clipped gradient off by 0.1%: caught although it is far below fp32's absolute tolerance.
  HostGrads one_off = hand_rolled(set, calls, Flavor::clip_grad_norm);
  one_off.grad[1234] *= 1.001f;
  const Verdict v = gradnorm::check_grads(set, adamw::Dtype::fp32, calls, one_off);
  EXPECT_FALSE(v.passed);
  EXPECT_NE(v.detail.find("grad of tensor"), std::string::npos) << v.detail;
}

TEST(GradnormWork, CountsLaunchesAndHostReads) {
  const Stage& stage = gradnorm_stage();
  const Problem p = problem(defaults::adamw_params, defaults::adamw_tensors, "fp32");
  auto counter = [](const Work& w, const std::string& key) {
    for (const auto& [k, v] : w.counters)
      if (k == key) return v;
    return -1.0;
  };
  for (const auto& v : stage.variants) EXPECT_DOUBLE_EQ(v.work(p).bytes, 12.0 * defaults::adamw_params) << v.id;
  EXPECT_EQ(counter(stage.find_variant("per_tensor", Backend::cuda)->work(p), "host_reads"), 200);
  EXPECT_EQ(counter(stage.find_variant("multi_tensor", Backend::cuda)->work(p), "host_reads"), 1);
  EXPECT_EQ(counter(stage.find_variant("fused", Backend::cuda)->work(p), "host_reads"), 0);
  EXPECT_EQ(counter(stage.find_variant("per_tensor", Backend::cuda)->work(p), "launches"), 400);
}

}  // namespace
}  // namespace tb

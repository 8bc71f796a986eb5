// Stage `attention`: every variant against the double reference at odd sizes (seq 1, 7, 257), causal
// and not, both dtypes on CUDA; the reference catches a wrong output; shapes are validated.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "attention/attention.h"
#include "runtime/device_info.h"
#include "runtime/error.h"
#include "cuda_testing.h"
#include "stage_testing.h"

namespace tb {
namespace {

using attention::DType;

const Stage& stage() { return *builtin_registry().find("attention"); }

std::vector<std::string> shapes_for(const std::string& axis, Backend backend) {
  if (axis == "block_shape") return {"1x2x1x8", "1x2x7x8", "2x2x33x16"};
  if (backend == Backend::cuda) return {"1x1x1x64", "1x2x7x64", "2x2x257x128", "1x3x100x32"};
  // The last two reach the register-blocked micro-kernels: head_dim 64 and 128, with tail rows.
  return {"1x1x1x8", "1x2x7x16", "2x3x257x32", "2x2x67x64", "1x1x130x128"};
}

std::vector<Problem> test_problems(const Variant& v) {
  std::vector<Problem> problems{Problem{}};
  for (const auto& axis : v.axes) {
    std::vector<std::string> values;
    if (axis == "causal") values = {"causal", "full"};
    else if (axis == "dtype") values = {"fp32", "bf16"};
    else values = shapes_for(axis, v.backend);
    std::vector<Problem> next;
    for (const auto& p : problems)
      for (const auto& value : values) {
        Problem q = p;
        q.set(axis, value);
        next.push_back(q);
      }
    problems = next;
  }
  return problems;
}

class AttentionVariant : public ::testing::TestWithParam<std::size_t> {};

TEST_P(AttentionVariant, MatchesReferenceAtOddSizes) {
  const Variant& v = stage().variants.at(GetParam());
  for (const auto& problem : test_problems(v)) {
    if (v.unsupported && !v.unsupported(problem).empty()) {  // e.g. bf16 tensor cores at head_dim 32
      EXPECT_EQ(v.backend, Backend::cuda) << problem.label() << ": " << v.unsupported(problem);
      continue;
    }
    TB_EXPECT_MATCHES_REFERENCE(v, problem);
  }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, AttentionVariant, ::testing::Range<std::size_t>(0, stage().variants.size()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           const Variant& v = stage().variants.at(info.param);
                           return std::string(to_string(v.backend)) + "_" + v.id;
                         });

TEST(AttentionReference, CatchesAWrongOutput) {
  const attention::Shape s = attention::parse_shape("1x2x9x4");
  std::vector<float> out(static_cast<std::size_t>(s.elements()));
  for (int64_t bh = 0; bh < 2; ++bh)
    for (int64_t i = 0; i < s.seq; ++i) {
      const auto row = attention::reference_row(s, true, DType::fp32, bh, i);
      for (int64_t d = 0; d < s.head_dim; ++d) out[(bh * s.seq + i) * s.head_dim + d] = static_cast<float>(row[d]);
    }
  EXPECT_TRUE(attention::check_output(s, true, DType::fp32, out).passed);
  // The same output is wrong for full attention: the causal mask matters.
  EXPECT_FALSE(attention::check_output(s, false, DType::fp32, out).passed);
  out[(1 * s.seq + s.seq - 1) * s.head_dim + 2] += 1e-3f;
  const Verdict v = attention::check_output(s, true, DType::fp32, out);
  EXPECT_FALSE(v.passed);
  EXPECT_NE(v.detail.find("out[1][8][2]"), std::string::npos) << v.detail;
}

// The reference backward is the definition's gradient: L = sum(O * dO), differentiated numerically in
// double, causal and full, at a size where every row sees a different number of keys.
TEST(AttentionReference, BackwardMatchesFiniteDifferences) {
  const attention::Shape s{1, 2, 5, 3};
  const auto n = static_cast<std::size_t>(s.elements());
  std::vector<double> q(n), k(n), v(n), o(n), dout(n), dq(n), dk(n), dv(n), lse(static_cast<std::size_t>(s.rows()));
  for (std::size_t i = 0; i < n; ++i) {
    q[i] = attention::input_q(static_cast<int64_t>(i), DType::fp32);
    k[i] = attention::input_k(static_cast<int64_t>(i), DType::fp32);
    v[i] = attention::input_v(static_cast<int64_t>(i), DType::fp32);
    dout[i] = attention::input_dout(static_cast<int64_t>(i));
  }
  for (bool causal : {true, false}) {
    const attention::Operands<double> x{q.data(), k.data(), v.data(), o.data(), attention::bhsd(s), attention::bhsd(s)};
    auto loss = [&] {
      attention::reference_forward(s, causal, x, lse.data());
      double sum = 0;
      for (std::size_t i = 0; i < n; ++i) sum += o[i] * dout[i];
      return sum;
    };
    attention::reference_backward(s, causal, x, attention::Gradients<double>{dq.data(), dk.data(), dv.data(), dout.data()});
    for (auto [input, grad, name] : {std::tuple{&q, &dq, "dq"}, std::tuple{&k, &dk, "dk"}, std::tuple{&v, &dv, "dv"}})
      for (std::size_t i = 0; i < n; ++i) {
        const double saved = (*input)[i], h = 1e-6;
        (*input)[i] = saved + h;
        const double up = loss();
        (*input)[i] = saved - h;
        const double down = loss();
        (*input)[i] = saved;
        EXPECT_NEAR((*grad)[i], (up - down) / (2 * h), 1e-8) << name << "[" << i << "] " << (causal ? "causal" : "full");
      }
  }
}

TEST(AttentionReference, CatchesAWrongGradient) {
  const attention::Shape s{1, 2, 9, 4};
  const auto n = static_cast<std::size_t>(s.elements());
  std::vector<double> q(n), k(n), v(n), o(n), dout(n), dq(n), dk(n), dv(n);
  for (std::size_t i = 0; i < n; ++i) {
    q[i] = attention::input_q(static_cast<int64_t>(i), DType::fp32);
    k[i] = attention::input_k(static_cast<int64_t>(i), DType::fp32);
    v[i] = attention::input_v(static_cast<int64_t>(i), DType::fp32);
    dout[i] = attention::input_dout(static_cast<int64_t>(i));
  }
  const attention::Operands<double> x{q.data(), k.data(), v.data(), o.data(), attention::bhsd(s), attention::bhsd(s)};
  attention::reference_backward(s, true, x, attention::Gradients<double>{dq.data(), dk.data(), dv.data(), dout.data()});
  std::vector<float> fq(dq.begin(), dq.end()), fk(dk.begin(), dk.end()), fv(dv.begin(), dv.end());
  EXPECT_TRUE(attention::check_gradients(s, true, attention::DType::fp32, fq, fk, fv).passed);
  EXPECT_FALSE(attention::check_gradients(s, false, attention::DType::fp32, fq, fk, fv).passed)
      << "the mask changes every gradient";
  fk[(1 * s.seq + 3) * s.head_dim + 1] += 1e-3f;
  const Verdict verdict = attention::check_gradients(s, true, attention::DType::fp32, fq, fk, fv);
  EXPECT_FALSE(verdict.passed);
  EXPECT_NE(verdict.detail.find("dk[1][3][1]"), std::string::npos) << verdict.detail;
}

// The training step's layout: Q, K, V read from packed rows [B, S, 3C], O and dO as [B, S, C]. The
// fused forward and backward there give what the naive ones give.
TEST(AttentionKernels, FusedMatchesNaiveOnThePackedRows) {
  const attention::Shape s{2, 3, 70, 16};
  const int64_t C = s.d_model(), N = s.batch * s.seq;
  std::vector<float> qkv(static_cast<std::size_t>(N * 3 * C)), dout(static_cast<std::size_t>(N * C));
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = attention::input_q(static_cast<int64_t>(i), DType::fp32);
  for (std::size_t i = 0; i < dout.size(); ++i) dout[i] = attention::input_dout(static_cast<int64_t>(i));
  const attention::Strides in = attention::bshd(s, 3 * C), out = attention::bshd(s, C);
  std::vector<std::vector<float>> o(2, std::vector<float>(dout.size())), dqkv(2, std::vector<float>(qkv.size(), 7.0f));
  std::vector<float> probs(static_cast<std::size_t>(s.batch * s.heads * s.seq * s.seq)), dprobs(probs.size());
  std::vector<float> lse(static_cast<std::size_t>(s.rows()));
  attention::FusedWorkspace ws(s.head_dim, s.seq);
  for (int fused = 0; fused < 2; ++fused) {
    const attention::Operands<float> x{qkv.data(), qkv.data() + C, qkv.data() + 2 * C, o[fused].data(), in, out};
    const attention::Gradients<float> g{dqkv[fused].data(), dqkv[fused].data() + C, dqkv[fused].data() + 2 * C, dout.data()};
    if (fused) {
      attention::cpu_fused_forward(s, true, x, lse.data(), ws);
      attention::cpu_fused_backward(s, true, x, lse.data(), g, ws);
    } else {
      attention::cpu_naive_forward(s, attention::Mask::implicit, x, probs.data());
      attention::cpu_naive_backward(s, x, probs.data(), g, dprobs.data());
    }
  }
  for (std::size_t i = 0; i < dout.size(); ++i) ASSERT_NEAR(o[1][i], o[0][i], 1e-5) << "out " << i;
  for (std::size_t i = 0; i < qkv.size(); ++i)
    ASSERT_NEAR(dqkv[1][i], dqkv[0][i], 1e-5) << "dqkv " << i << " (every element written)";
}

// Every fused CPU kernel this CPU runs (the blocked AVX-512 and AVX2 ones where it has them, the BLAS
// tiles everywhere), at head sizes of one vector to 128, sequences with tail tiles (not a multiple of
// the 64-query task or of the 6-row micro-kernel), causal and full: O and each row's log-sum-exp, then
// dQ, dK, dV from them, against the double reference.
TEST(AttentionKernels, EveryCpuFusedKernelMatchesTheReference) {
  for (const attention::Shape s :
       {attention::Shape{1, 1, 1, 8}, attention::Shape{1, 2, 5, 16}, attention::Shape{2, 1, 70, 32},
        attention::Shape{1, 3, 131, 64}, attention::Shape{1, 1, 66, 128}})
    for (const bool causal : {true, false}) {
      const auto n = static_cast<std::size_t>(s.elements());
      std::vector<float> q(n), k(n), v(n);
      std::vector<double> qd(n), kd(n), vd(n), od(n), lse_ref(static_cast<std::size_t>(s.rows()));
      for (std::size_t i = 0; i < n; ++i) {
        qd[i] = q[i] = attention::input_q(static_cast<int64_t>(i), DType::fp32);
        kd[i] = k[i] = attention::input_k(static_cast<int64_t>(i), DType::fp32);
        vd[i] = v[i] = attention::input_v(static_cast<int64_t>(i), DType::fp32);
      }
      attention::reference_forward(s, causal,
                                   attention::Operands<double>{qd.data(), kd.data(), vd.data(), od.data(),
                                                               attention::bhsd(s), attention::bhsd(s)},
                                   lse_ref.data());
      attention::FusedWorkspace ws(s.head_dim, s.seq);
      const auto kernels = attention::cpu_fused_kernels(s.head_dim);
      EXPECT_EQ(kernels.back(), attention::CpuKernel::blas_tiles) << "the library tiles run everywhere";
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)  // clang (14) names no x86-64-v4 level
      if (__builtin_cpu_supports("x86-64-v4") && s.head_dim % 16 == 0) {
        EXPECT_EQ(kernels.front(), attention::CpuKernel::avx512) << "this CPU has AVX-512: its kernel runs first";
      }
#endif
      for (const auto kernel : kernels) {
        std::vector<float> o(n, 7.0f), lse(static_cast<std::size_t>(s.rows()), 7.0f);
        attention::cpu_fused_forward(s, causal,
                                     attention::Operands<float>{q.data(), k.data(), v.data(), o.data(), attention::bhsd(s),
                                                                attention::bhsd(s)},
                                     lse.data(), ws, kernel);
        const std::string what = attention::to_string(kernel) + " at " + std::to_string(s.batch) + "x" +
                                 std::to_string(s.heads) + "x" + std::to_string(s.seq) + "x" + std::to_string(s.head_dim) +
                                 (causal ? " causal" : " full");
        for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(o[i], od[i], 2e-5 + 2e-4 * std::abs(od[i])) << what << ", out " << i;
        for (std::size_t r = 0; r < lse.size(); ++r)
          ASSERT_NEAR(lse[r], lse_ref[r], 1e-5 * (1 + std::abs(lse_ref[r]))) << what << ", lse " << r;
        // Its backward from its own O and lse, against the reference's gradients.
        std::vector<float> dout(n), dq(n, 7.0f), dk(n, 7.0f), dv(n, 7.0f);
        for (std::size_t i = 0; i < n; ++i) dout[i] = attention::input_dout(static_cast<int64_t>(i));
        attention::cpu_fused_backward(s, causal,
                                      attention::Operands<float>{q.data(), k.data(), v.data(), o.data(), attention::bhsd(s),
                                                                 attention::bhsd(s)},
                                      lse.data(), attention::Gradients<float>{dq.data(), dk.data(), dv.data(), dout.data()},
                                      ws, kernel);
        const Verdict grads = attention::check_gradients(s, causal, DType::fp32, dq, dk, dv);
        EXPECT_TRUE(grads.passed) << what << ": " << grads.detail;
      }
    }
}

TEST(AttentionShape, ParsesAndRejects) {
  const attention::Shape s = attention::parse_shape("4x16x4096x128");
  EXPECT_EQ(s.batch, 4);
  EXPECT_EQ(s.heads, 16);
  EXPECT_EQ(s.seq, 4096);
  EXPECT_EQ(s.head_dim, 128);
  EXPECT_EQ(s.d_model(), 2048);
  for (const char* bad : {"4x16x4096", "4x16x0x128", "4x16xax128", "4x16x4096x128x2", "", "-4x1x1x1"})
    EXPECT_NE(attention::shape_invalid_reason(bad), "") << bad;
  EXPECT_THROW(attention::parse_shape("1x1"), UsageError);
  EXPECT_DOUBLE_EQ(attention::attention_flops(attention::parse_shape("1x1x4x2"), false), 4.0 * 16 * 2);
  EXPECT_DOUBLE_EQ(attention::attention_flops(attention::parse_shape("1x1x4x2"), true), 2.0 * 16 * 2);
}

TEST(AttentionRegistry, FusedRunsWhereNaiveCannotAllocate) {
  // 200k tokens: Q, K, V, O are 25 MiB, the naive scores 149 GiB.
  Problem p({{"cpu_shape", "1x1x200000x8"}, {"causal", "causal"}});
  const Variant* naive = stage().find_variant("naive", Backend::cpu);
  const Variant* fused = stage().find_variant("fused", Backend::cpu);
  EXPECT_NE(naive->unsupported(p).find("MiB of host memory"), std::string::npos);
  EXPECT_EQ(fused->unsupported(p), "");
}

TEST(AttentionRegistry, FusedCudaRefusesAGridThatCannotLaunch) {
  // 2^20 x 2^12 heads of 64 queries: 2^32 blocks of 8 rows (fp32), beyond grid.x's 2^31 - 1.
  Problem p({{"shape", "1048576x4096x64x64"}, {"causal", "causal"}, {"dtype", "fp32"}});
  const Variant* fused = stage().find_variant("fused", Backend::cuda);
  ASSERT_NE(fused, nullptr);
  EXPECT_NE(fused->unsupported(p).find("above the grid's 2^31 - 1"), std::string::npos) << fused->unsupported(p);
}

TEST(AttentionRegistry, Bf16TensorCoresNeedSm80) {
  EXPECT_NE(capability_reason("7.5", 8, 0, "bf16 mma.sync").find("needs compute capability 8.0"), std::string::npos);
  EXPECT_EQ(capability_reason("8.0", 8, 0, "bf16 mma.sync"), "");
  EXPECT_EQ(capability_reason("9.0", 8, 0, "bf16 mma.sync"), "");
  EXPECT_EQ(capability_reason("10.0", 8, 0, "bf16 mma.sync"), "");
}

// More than 65535 batch x heads: the launch that once put them in grid.y (limit 65535) must run
// and match the reference, in both dtypes.
TEST(AttentionCuda, FusedRunsBeyond65535BatchTimesHeads) {
  const Variant* fused = stage().find_variant("fused", Backend::cuda);
  ASSERT_NE(fused, nullptr);
  for (const char* dtype : {"fp32", "bf16"}) {
    const Problem p({{"shape", "33000x2x9x64"}, {"causal", "causal"}, {"dtype", dtype}});
    if (fused->unsupported && !fused->unsupported(p).empty()) GTEST_SKIP() << fused->unsupported(p);
    TB_EXPECT_MATCHES_REFERENCE(*fused, p);
  }
}

// The rebuilt mask comes from a pool that keeps its memory across synchronisations, as PyTorch's
// caching allocator does: after a forward and a synchronise the mask's memory is still held, and
// later forwards take no more. (The device's default pool, release threshold 0, hands it back at
// every synchronise and maps it afresh on the next call: a cost PyTorch never pays.)
TEST(AttentionCuda, RebuiltMaskKeepsItsMemoryAcrossSynchronisations) {
  const Variant* rebuilt = stage().find_variant("naive_mask_rebuilt", Backend::cuda);
  ASSERT_NE(rebuilt, nullptr);
  if (const std::string why = testing::cannot_run_here(*rebuilt); !why.empty()) GTEST_SKIP() << why;
  const Problem p({{"shape", "1x1x4096x64"}, {"causal", "causal"}, {"dtype", "fp32"}});  // a 16 MiB mask
  auto session = make_session(Backend::cuda, 0);
  auto instance = rebuilt->make(p, session->context());
  // The pool's own mapped bytes, not the device's free memory, which other processes move too.
  auto reserved = [&] {
    for (const auto& [name, value] : instance->observed())
      if (name == "mask_pool_reserved_bytes") return value;
    ADD_FAILURE() << "no mask_pool_reserved_bytes counter";
    return -1.0;
  };
  EXPECT_EQ(reserved(), 0.0);
  instance->run();
  ASSERT_TRUE(instance->check().passed);  // check() synchronises the stream
  const double after_first = reserved();
  EXPECT_GE(after_first, 4096.0 * 4096) << "the mask's memory went back to the driver";
  for (int i = 0; i < 5; ++i) instance->run();
  ASSERT_TRUE(instance->check().passed);
  EXPECT_EQ(reserved(), after_first) << "later forwards mapped more memory";
}

}  // namespace
}  // namespace tb

// Stage `peak`: every variant against the reference at odd sizes, and the reference itself catches
// a wrong result.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "peak/peak.h"
#include "stage_testing.h"

namespace tb {
namespace {

const Stage& peak_stage() { return *builtin_registry().find("peak"); }

// Odd sizes: one element, a tail that is not a multiple of the vector width, a large prime.
std::vector<Problem> test_problems(const Variant& v) {
  std::vector<Problem> problems;
  const std::string axis = v.axes.at(0);
  std::vector<std::string> values;
  if (axis == "n") values = {"1", "7", "1000003"};
  else if (axis == "transfer_bytes") values = {"4", "28", "4000012"};
  else values = {"1", "7", "129"};  // GEMM sizes: the reference is O(n) per checked entry
  for (const auto& value : values) problems.push_back(Problem({{axis, value}}));
  return problems;
}

class PeakVariant : public ::testing::TestWithParam<std::size_t> {};

TEST_P(PeakVariant, MatchesReferenceAtOddSizes) {
  const Variant& v = peak_stage().variants.at(GetParam());
  for (const auto& problem : test_problems(v)) TB_EXPECT_MATCHES_REFERENCE(v, problem);
}

INSTANTIATE_TEST_SUITE_P(AllVariants, PeakVariant, ::testing::Range<std::size_t>(0, peak_stage().variants.size()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           const Variant& v = peak_stage().variants.at(info.param);
                           return std::string(to_string(v.backend)) + "_" + v.id;
                         });

// Where the caches end, from fake sweep curves (footprint in MiB, GB/s).
std::vector<peak::SweepPoint> curve_of(const std::vector<std::pair<double, double>>& points) {
  std::vector<peak::SweepPoint> curve;
  for (const auto& [mib, gb_per_s] : points) curve.push_back(peak::SweepPoint{mib * (1 << 20), gb_per_s * 1e9});
  return curve;
}

TEST(CacheSweep, TheThresholdIsWhereTheCopysBandwidthReachesDrams) {
  // A cache of about 8 MiB: fast up to 4, falling at 8, DRAM's 20 GB/s from 16 on.
  EXPECT_DOUBLE_EQ(peak::cache_threshold_from_sweep(
                       curve_of({{1, 100}, {2, 100}, {4, 95}, {8, 60}, {16, 21}, {32, 20}, {64, 20}, {128, 19.5}})),
                   16.0 * (1 << 20));
  // The 2-vCPU VM that reports a 300 MiB L3: its copy is at DRAM's bandwidth from 64 MiB on.
  EXPECT_DOUBLE_EQ(peak::cache_threshold_from_sweep(curve_of(
                       {{1, 60}, {4, 55}, {16, 30}, {32, 17}, {64, 12}, {128, 11.5}, {256, 11}, {512, 11.8}, {1024, 11.2}})),
                   64.0 * (1 << 20));
  // A slow middle point (a disturbed size) does not end the cache early: every size from the
  // threshold on must be at DRAM's bandwidth.
  EXPECT_DOUBLE_EQ(peak::cache_threshold_from_sweep(curve_of({{1, 100}, {2, 20}, {4, 95}, {8, 21}, {16, 20}, {32, 20}})),
                   8.0 * (1 << 20));
}

TEST(CacheSweep, ACurveWithoutAFallCannotTell) {
  // Flat: the cache is below the smallest size or above the largest.
  EXPECT_EQ(peak::cache_threshold_from_sweep(curve_of({{1, 20}, {2, 21}, {4, 20}, {8, 19}})), 0.0);
  // The two largest sizes disagree by far: no plateau to call DRAM's.
  EXPECT_EQ(peak::cache_threshold_from_sweep(curve_of({{1, 100}, {2, 100}, {4, 10}, {8, 40}})), 0.0);
  // Too few sizes.
  EXPECT_EQ(peak::cache_threshold_from_sweep(curve_of({{1, 100}, {2, 20}})), 0.0);
}

TEST(CacheSweep, TheRealSweepCoversTheSizesWithPositiveRates) {
  const auto curve = peak::copy_bandwidth_sweep(4.0 * (1 << 20));
  ASSERT_EQ(curve.size(), 3u);  // 1, 2 and 4 MiB
  for (std::size_t i = 0; i < curve.size(); ++i) {
    EXPECT_DOUBLE_EQ(curve[i].footprint_bytes, static_cast<double>(1 << 20) * (1 << i));
    EXPECT_GT(curve[i].bytes_per_s, 0.0);
  }
}

// The STREAM peak rows search before they are timed: they name the way they chose, and report the
// fastest call of their search as a figure of the same work.
TEST(PeakSearch, CpuStreamRowsNameTheirChoiceAndTheirSearchsBest) {
  for (const char* id : {"copy", "triad", "memory"}) {
    const Variant* v = peak_stage().find_variant(id, Backend::cpu);
    ASSERT_NE(v, nullptr);
    auto session = make_session(Backend::cpu, 0);
    auto instance = v->make(Problem(std::vector<std::pair<std::string, std::string>>{{"n", "100003"}}), session->context());
    instance->run();
    EXPECT_TRUE(instance->check().passed) << id;  // every candidate checked
    EXPECT_FALSE(instance->configuration().empty()) << id;
    double searched = 0, best_ns = 0;
    for (const auto& [key, value] : instance->observed()) {
      if (key == "candidates_searched") searched = value;
      if (key == "search_best_ns") best_ns = value;
    }
    EXPECT_GE(searched, 2.0) << id;
    EXPECT_GT(best_ns, 0.0) << id;
  }
}

TEST(PeakReference, CatchesAWrongCopy) {
  std::vector<double> src{1, 2, 3}, dst{1, 2, 3.0000001};
  const Verdict v = peak::check_copy(dst.data(), src.data(), 3);
  EXPECT_FALSE(v.passed);
  EXPECT_NE(v.detail.find("copy[2]"), std::string::npos);
}

TEST(PeakReference, CatchesAWrongTriad) {
  std::vector<double> b{1, 2}, c{1, 1}, a{4, 5};
  EXPECT_TRUE(peak::check_triad(a.data(), b.data(), c.data(), 2).passed);
  a[1] = 5.001;
  EXPECT_FALSE(peak::check_triad(a.data(), b.data(), c.data(), 2).passed);
}

// The memory ceiling's mixes: a read's sum, and one call of the read-modify-write in doubles and in
// AdamW's bf16 widths, from the states their checks start from.
TEST(PeakReference, CatchesAWrongMemoryMix) {
  const int64_t n = 3;
  double squares = 0;
  for (int64_t i = 0; i < n; ++i) squares += double{uniform_at(peak::seed_a, i)} * uniform_at(peak::seed_a, i);
  EXPECT_TRUE(peak::check_sum_of_squares(squares, n).passed);
  EXPECT_FALSE(peak::check_sum_of_squares(squares * (1 + 1e-6), n).passed);

  std::vector<double> p(n), g(n), m(n), v(n);
  for (int64_t i = 0; i < n; ++i) {
    g[i] = uniform_at(peak::seed_b, i);
    m[i] = peak::rmw_decay * uniform_at(peak::seed_c, i) + g[i];
    v[i] = peak::rmw_decay * uniform_at(peak::seed_c + 1, i) + g[i] * g[i];
    p[i] = uniform_at(peak::seed_a, i) - peak::rmw_rate * m[i];
  }
  EXPECT_TRUE(peak::check_rmw(p.data(), g.data(), m.data(), v.data(), n).passed);
  v[2] += 1e-9;
  const Verdict wrong = peak::check_rmw(p.data(), g.data(), m.data(), v.data(), n);
  EXPECT_FALSE(wrong.passed);
  EXPECT_NE(wrong.detail.find("read-modify-write v[2]"), std::string::npos) << wrong.detail;

  // bf16 p and g as the mix keeps them (the top 16 bits of a float), m and v in float.
  auto bits = [](float x) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return static_cast<uint16_t>(u >> 16);
  };
  std::vector<uint16_t> pb(n), gb(n);
  std::vector<float> mf(n), vf(n);
  for (int64_t i = 0; i < n; ++i) {
    gb[i] = bits(uniform_at(peak::seed_b, i));
    const float gi = bf16_bits_to_float(gb[i]);
    mf[i] = static_cast<float>(peak::rmw_decay) * uniform_at(peak::seed_c, i) + gi;
    vf[i] = static_cast<float>(peak::rmw_decay) * uniform_at(peak::seed_c + 1, i) + gi * gi;
    pb[i] = bits(bf16_bits_to_float(bits(uniform_at(peak::seed_a, i))) - static_cast<float>(peak::rmw_rate) * mf[i]);
  }
  EXPECT_TRUE(peak::check_rmw_bf16(pb.data(), gb.data(), mf.data(), vf.data(), n).passed);
  pb[1] ^= 0x40;  // a bf16 parameter two binades off
  EXPECT_FALSE(peak::check_rmw_bf16(pb.data(), gb.data(), mf.data(), vf.data(), n).passed);
}

TEST(PeakReference, CatchesAWrongGemmEntry) {
  const int64_t n = 5;
  const auto where = peak::gemm_check_positions(n);
  std::vector<double> exact;
  for (const auto& [i, j] : where) {
    double dot = 0;
    for (int64_t k = 0; k < n; ++k)
      dot += static_cast<double>(uniform_at(peak::seed_a, i + k * n)) * uniform_at(peak::seed_b, k + j * n);
    exact.push_back(dot);
  }
  EXPECT_TRUE(peak::check_gemm_entries(n, peak::GemmType::fp32, where, exact).passed);
  auto wrong = exact;
  wrong[7] += 0.01;
  const Verdict v = peak::check_gemm_entries(n, peak::GemmType::fp32, where, wrong);
  EXPECT_FALSE(v.passed);
  EXPECT_NE(v.detail.find("tolerance"), std::string::npos);
  // The same 1% error is inside bf16's tolerance: tolerances are per dtype.
  EXPECT_TRUE(peak::check_gemm_entries(n, peak::GemmType::bf16, where, exact).passed);
}

}  // namespace
}  // namespace tb

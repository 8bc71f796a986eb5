// Stage `peak`: every variant against the reference at odd sizes, and the reference itself catches
// a wrong result.
#include <gtest/gtest.h>

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

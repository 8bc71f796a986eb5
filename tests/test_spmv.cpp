// Stage `spmv`: the Laplacian generator against a dense matrix built from the graph, the oracle
// against the dense matvec, every registered variant against the oracle at odd sizes, and the check
// catches a wrong result.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/error.h"
#include "spmv/spmv.h"
#include "stage_testing.h"

namespace tb {
namespace {

using laplacian::Family;
using laplacian::Graph;
using laplacian::GraphSpec;

const Stage& spmv_stage() { return *builtin_registry().find("spmv"); }

std::vector<double> input(int64_t n) {
  std::vector<double> x(static_cast<std::size_t>(n));
  spmv::fill_input(x.data(), n);
  return x;
}

std::vector<double> dense_times(const std::vector<double>& a, const std::vector<double>& x) {
  const auto n = x.size();
  std::vector<double> y(n, 0.0);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j) y[i] += a[i * n + j] * x[j];
  return y;
}

TEST(Laplacian, ParsesEveryGraphNameAndRejectsOthers) {
  for (const auto& name : laplacian::graph_names()) EXPECT_EQ(laplacian::parse_graph(name).name(), name);
  EXPECT_EQ(laplacian::parse_graph("ring8").k, 8);
  EXPECT_EQ(laplacian::parse_graph("grid3d").k, 6);
  for (const char* bad : {"ring3", "ring9", "ring", "random", "grid4d", "Ring8", ""})
    EXPECT_THROW(laplacian::parse_graph(bad), UsageError) << bad;
}

// Every graph: symmetric, no self-loops, at most k neighbours, exactly k where nothing can collide.
TEST(Laplacian, GraphsAreSymmetricWithKNeighbours) {
  std::vector<int32_t> nb, back;
  for (const auto& name : laplacian::graph_names()) {
    const GraphSpec spec = laplacian::parse_graph(name);
    for (int64_t n : {1, 2, 7, 12, 100, 1001}) {
      const Graph g(spec, n);
      for (int64_t i = 0; i < n; ++i) {
        g.neighbours(i, nb);
        ASSERT_LE(static_cast<int>(nb.size()), spec.k) << name << " n=" << n << " i=" << i;
        ASSERT_TRUE(std::is_sorted(nb.begin(), nb.end()));
        ASSERT_EQ(std::adjacent_find(nb.begin(), nb.end()), nb.end());
        for (const int32_t j : nb) {
          ASSERT_NE(j, i);
          ASSERT_TRUE(j >= 0 && j < n);
          g.neighbours(j, back);
          ASSERT_TRUE(std::binary_search(back.begin(), back.end(), static_cast<int32_t>(i)))
              << name << " n=" << n << ": " << i << "-" << j << " is not symmetric";
        }
        if (spec.family == Family::ring && n >= spec.k + 3) {
          const bool unpaired = spec.k % 2 && n % 2 && i == n - 1;
          EXPECT_EQ(static_cast<int>(nb.size()), spec.k - (unpaired ? 1 : 0)) << name << " n=" << n << " i=" << i;
        }
      }
    }
  }
}

TEST(Laplacian, GridsHaveTheirStencilDegree) {
  std::vector<int32_t> nb;
  const Graph g2(laplacian::parse_graph("grid2d"), 100);  // 10 x 10
  g2.neighbours(55, nb);
  EXPECT_EQ(nb, (std::vector<int32_t>{45, 54, 56, 65}));
  g2.neighbours(0, nb);
  EXPECT_EQ(nb, (std::vector<int32_t>{1, 10}));
  const Graph g3(laplacian::parse_graph("grid3d"), 1000);  // 10 x 10 x 10
  g3.neighbours(555, nb);
  EXPECT_EQ(nb, (std::vector<int32_t>{455, 545, 554, 556, 565, 655}));
}

// The CSR assembly (counting, diagonal placement, values) against the dense matrix built from the
// graph; the matrix is symmetric and diagonally dominant with margin 1, so its eigenvalues are >= 1.
TEST(Laplacian, CsrMatchesTheDenseMatrixAndIsPositiveDefinite) {
  const double alpha = 0.7;
  for (const auto& name : laplacian::graph_names()) {
    for (int64_t n : {1, 7, 64, 301}) {
      const Graph g(laplacian::parse_graph(name), n);
      const laplacian::Csr a = laplacian::build_shifted_laplacian(g, alpha);
      const std::vector<double> dense = laplacian::dense_shifted_laplacian(g, alpha);
      std::vector<double> from_csr(static_cast<std::size_t>(n * n), 0.0);
      for (int64_t i = 0; i < n; ++i) {
        for (int32_t p = a.row_ptr[i]; p < a.row_ptr[i + 1]; ++p) {
          if (p > a.row_ptr[i]) {
            ASSERT_LT(a.col[p - 1], a.col[p]) << name << ": columns not sorted in row " << i;
          }
          from_csr[i * n + a.col[p]] = a.val[p];
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        double off = 0;
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_NEAR(from_csr[i * n + j], dense[i * n + j], 1e-14) << name << " n=" << n << " (" << i << "," << j << ")";
          ASSERT_EQ(dense[i * n + j], dense[j * n + i]) << name << ": not symmetric";
          if (j != i) off += std::abs(dense[i * n + j]);
        }
        EXPECT_NEAR(dense[i * n + i] - off, 1.0, 1e-12) << name << ": row " << i << " is not I + alpha L";
      }
      EXPECT_EQ(a.nnz, laplacian::nnz(g.spec(), n)) << name << " n=" << n;
    }
  }
}

// The closed-form nonzero counts the work model uses, at sizes past the small-graph cut-off and with
// partial last rows and planes.
TEST(Laplacian, WorkModelCountsNonzerosExactly) {
  for (const char* name : {"ring4", "ring5", "ring8", "grid2d", "grid3d"})
    for (int64_t n : {4099, 5000, 10007, 65536}) {
      const Graph g(laplacian::parse_graph(name), n);
      EXPECT_EQ(laplacian::build_shifted_laplacian(g, 0.5).nnz, laplacian::nnz(g.spec(), n)) << name << " n=" << n;
    }
  // Random graphs: n (k + 1) less the rare duplicate edges of the cycles.
  const Graph g(laplacian::parse_graph("random8"), 10007);
  const int64_t nnz = laplacian::build_shifted_laplacian(g, 0.5).nnz;
  EXPECT_LE(nnz, laplacian::nnz(g.spec(), 10007));
  EXPECT_GE(nnz, laplacian::nnz(g.spec(), 10007) - 40);
}

// The oracle (reference_apply) and the stencil arithmetic against the dense matvec.
TEST(Laplacian, OracleAndStencilMatchTheDenseMatvec) {
  const double alpha = 0.5;
  for (const auto& name : laplacian::graph_names()) {
    for (int64_t n : {1, 7, 13, 250}) {
      const Graph g(laplacian::parse_graph(name), n);
      const auto x = input(n);
      const auto want = dense_times(laplacian::dense_shifted_laplacian(g, alpha), x);
      std::vector<double> y(static_cast<std::size_t>(n));
      laplacian::reference_apply(g, alpha, x.data(), y.data());
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(y[i], want[i], 1e-13) << name << " n=" << n << " row " << i;
      if (!laplacian::stencil_unsupported(g.spec(), n).empty()) continue;
      const laplacian::Stencil s = g.stencil(alpha);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(laplacian::stencil_row(s, x.data(), i), want[i], 1e-13) << name << " stencil n=" << n << " row " << i;
    }
  }
}

TEST(Laplacian, SaysWhenAStencilOrCsrCannotBeUsed) {
  EXPECT_NE(laplacian::stencil_unsupported(laplacian::parse_graph("random8"), 1000), "");
  EXPECT_NE(laplacian::stencil_unsupported(laplacian::parse_graph("ring8"), 10), "");
  EXPECT_EQ(laplacian::stencil_unsupported(laplacian::parse_graph("ring8"), 11), "");
  EXPECT_EQ(laplacian::stencil_unsupported(laplacian::parse_graph("grid3d"), 1), "");
  EXPECT_NE(laplacian::csr_unsupported(laplacian::parse_graph("ring8"), int64_t{1} << 29), "");
  EXPECT_EQ(laplacian::csr_unsupported(laplacian::parse_graph("ring8"), 10000000), "");
}

TEST(SpmvReference, CatchesAWrongEntry) {
  const Graph g(laplacian::parse_graph("ring5"), 1000);
  const auto x = input(1000);
  std::vector<double> y(1000);
  laplacian::reference_apply(g, 0.5, x.data(), y.data());
  EXPECT_TRUE(spmv::check_spmv(g, 0.5, x.data(), y.data()).passed);
  y[417] += 1e-9 * std::abs(y[417]) + 1e-12;
  const Verdict v = spmv::check_spmv(g, 0.5, x.data(), y.data());
  EXPECT_FALSE(v.passed);
  EXPECT_NE(v.detail.find("y[417]"), std::string::npos) << v.detail;
  y[417] = NAN;
  EXPECT_FALSE(spmv::check_spmv(g, 0.5, x.data(), y.data()).passed);
}

TEST(SpmvReference, CatchesAWrongSpmmEntry) {
  const int64_t n = 300, m = 5;
  const Graph g(laplacian::parse_graph("grid2d"), n);
  std::vector<double> x(static_cast<std::size_t>(n * m)), y(static_cast<std::size_t>(n * m));
  spmv::fill_input(x.data(), n * m);
  const auto dense = laplacian::dense_shifted_laplacian(g, 0.5);
  for (int64_t c = 0; c < m; ++c) {  // Y = A X column by column with the dense matrix
    std::vector<double> col(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) col[i] = x[i * m + c];
    const auto out = dense_times(dense, col);
    for (int64_t i = 0; i < n; ++i) y[i * m + c] = out[i];
  }
  EXPECT_TRUE(spmv::check_spmm(g, 0.5, x.data(), y.data(), m).passed);
  y[123 * m + 4] *= 1.0 + 1e-8;
  const Verdict v = spmv::check_spmm(g, 0.5, x.data(), y.data(), m);
  EXPECT_FALSE(v.passed);
  EXPECT_NE(v.detail.find("y[123,4]"), std::string::npos) << v.detail;
}

// Odd sizes: one row, a tail shorter than a lane group, primes; every graph family.
class SpmvVariant : public ::testing::TestWithParam<std::size_t> {};

TEST_P(SpmvVariant, MatchesReferenceAtOddSizes) {
  const Variant& v = spmv_stage().variants.at(GetParam());
  std::vector<Problem> problems;
  for (const char* graph : {"ring8", "ring5", "random7", "grid2d", "grid3d"})
    for (const char* rows : {"1", "7", "1000", "100003"}) problems.push_back(Problem({{"graph", graph}, {"rows", rows}}));
  problems.push_back(Problem({{"graph", "ring8"}, {"rows", "1000003"}}));
  bool any = false;
  for (auto problem : problems) {
    if (std::find(v.axes.begin(), v.axes.end(), "rhs") != v.axes.end())
      problem.set("rhs", problem.get("rows") == "1000003" ? "2" : "3");
    const std::string why = v.unsupported ? v.unsupported(problem) : "";
    if (!why.empty()) {  // only the stencil may refuse, and only where there is no stencil
      EXPECT_EQ(v.id, "stencil") << problem.label() << ": " << why;
      continue;
    }
    any = true;
    TB_EXPECT_MATCHES_REFERENCE(v, problem);
  }
  EXPECT_TRUE(any);
}

INSTANTIATE_TEST_SUITE_P(AllVariants, SpmvVariant, ::testing::Range<std::size_t>(0, spmv_stage().variants.size()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           const Variant& v = spmv_stage().variants.at(info.param);
                           return std::string(to_string(v.backend)) + "_" + v.id;
                         });

TEST(SpmvRegistry, BytesModelIsTheStatedOne) {
  const Stage& s = spmv_stage();
  const Problem p({{"graph", "ring8"}, {"rows", "1048576"}, {"rhs", "32"}});
  const double n = 1048576, nnz = 9 * n;
  EXPECT_DOUBLE_EQ(s.find_variant("csr", Backend::cpu)->work(p).bytes, 12 * nnz + 4 * (n + 1) + 16 * n);
  EXPECT_DOUBLE_EQ(s.find_variant("stencil", Backend::cpu)->work(p).bytes, 16 * n);
  EXPECT_DOUBLE_EQ(s.find_variant("spmm_csr", Backend::cpu)->work(p).bytes, 12 * nnz + 4 * (n + 1) + 16 * n * 32);
  EXPECT_EQ(s.find_variant("csr", Backend::cpu)->work(p).peak_key, "cpu.memory");
  EXPECT_EQ(s.find_variant("csr", Backend::cuda)->work(p).peak_key, "cuda.copy");
}

}  // namespace
}  // namespace tb

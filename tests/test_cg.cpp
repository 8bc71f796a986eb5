// Stage `cg`: the drifting right-hand sides, the residual oracle (and that it catches a wrong
// solution), every registered strategy at odd sizes with every solve's true residual checked, the
// gate's skips following the drift, the warm start never skipping, the counters, CPU and CUDA
// solutions agreeing, and the pairs that take the gate apart from the warm start. The propagator's
// form (rows.h): the solver in double against a direct solve, its gate on an unchanged and a changed
// batch, and the rows variants at odd shapes, checked the same way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "cg/cg.h"
#include "cg/rows.h"
#include "runtime/defaults.h"
#include "runtime/random.h"
#include "runtime/tolerance.h"
#include "spmv/spmv.h"
#include "stage_testing.h"

namespace tb {
namespace {

const Stage& cg_stage() { return *builtin_registry().find("cg"); }

Problem problem(const char* graph, const char* rows, const char* drift, const char* alpha = "0.5") {
  return Problem({{"graph", graph}, {"rows", rows}, {"alpha", alpha}, {"drift", drift}});
}

// An instance and the session it runs in, which must outlive it: a CUDA instance runs on the
// session's stream. (Declared first, the session is destroyed last.)
struct Made {
  std::unique_ptr<BackendSession> session;
  std::unique_ptr<Instance> instance;
  Instance* operator->() const { return instance.get(); }
  Instance& operator*() const { return *instance; }
  Instance* get() const { return instance.get(); }
};

Made make(const char* id, Backend backend, const Problem& p) {
  const Variant* v = cg_stage().find_variant(id, backend);
  EXPECT_NE(v, nullptr) << id;
  Made made{make_session(backend, 0), nullptr};
  made.instance = v->make(p, made.session->context());
  return made;
}

std::map<std::string, double> counters(const Instance& instance) {
  std::map<std::string, double> out;
  for (const auto& [k, v] : instance.observed()) out[k] = v;
  return out;
}

double norm(const double* v, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += v[i] * v[i];
  return std::sqrt(s);
}

TEST(CgRhs, DriftsByTheStratifiedAmounts) {
  const int64_t n = 5000;
  const int steps = 16;
  const cg::RhsSequence rhs(n, 1e-3, steps);
  std::vector<double> drawn;
  for (int t = 1; t <= steps; ++t) {
    std::vector<double> diff(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) diff[i] = rhs.b(t)[i] - rhs.b(t - 1)[i];
    EXPECT_NEAR(norm(diff.data(), n) / norm(rhs.b(t - 1), n), rhs.drift_of(t), 1e-12) << "step " << t;
    drawn.push_back(rhs.drift_of(t));
  }
  std::sort(drawn.begin(), drawn.end());
  for (int j = 0; j < steps; ++j) EXPECT_NEAR(drawn[j], 1e-3 * (0.5 + (j + 0.5) / steps), 1e-15);
  // Deterministic: the same sequence every time.
  const cg::RhsSequence again(n, 1e-3, steps);
  EXPECT_TRUE(std::equal(rhs.b(steps), rhs.b(steps) + n, again.b(steps)));
}

// Dense Gaussian elimination (A is SPD: no pivoting needed): the exact solution has a residual at
// rounding level, and a slightly wrong one is caught.
TEST(CgReference, TrueResidualCatchesAWrongSolution) {
  const int64_t n = 60;
  const laplacian::Graph g(laplacian::parse_graph("ring6"), n);
  auto a = laplacian::dense_shifted_laplacian(g, 0.5);
  const cg::RhsSequence rhs(n, 0.0, 1);
  std::vector<double> x(rhs.b(0), rhs.b(0) + n);
  for (int64_t k = 0; k < n; ++k)
    for (int64_t i = k + 1; i < n; ++i) {
      const double f = a[i * n + k] / a[k * n + k];
      for (int64_t j = k; j < n; ++j) a[i * n + j] -= f * a[k * n + j];
      x[i] -= f * x[k];
    }
  for (int64_t i = n - 1; i >= 0; --i) {
    for (int64_t j = i + 1; j < n; ++j) x[i] -= a[i * n + j] * x[j];
    x[i] /= a[i * n + i];
  }
  EXPECT_LT(cg::true_relative_residual(g, 0.5, rhs.b(0), x.data()), 1e-14);
  EXPECT_TRUE(cg::check_solve(g, 0.5, rhs.b(0), x.data(), 1e-7, 1, false).passed);
  x[17] += 1e-5;
  const Verdict v = cg::check_solve(g, 0.5, rhs.b(0), x.data(), 1e-7, 3, true);
  EXPECT_FALSE(v.passed);
  EXPECT_NE(v.detail.find("step 3 (skipped by the gate)"), std::string::npos) << v.detail;
}

// A solver that trusts a stale cache (skips every solve without looking) must fail the check: the
// check recomputes each residual itself. Declared warm, the same solver must fail for skipping at all.
class StaleCache final : public cg::WindowSolver {
 public:
  explicit StaleCache(const Problem& p, cg::Start start = cg::Start::lazy)
      : WindowSolver(p, start), x_(rhs_.b(0), rhs_.b(0) + settings_.rows) {}
  std::vector<double> solution() override { return x_; }
  cg::Tally tally() override { return tally_; }

 protected:
  void begin_window() override {}
  void start(int) override {
    ++tally_.solves;
    ++tally_.skips;
  }
  bool started_done() override { return true; }
  void finish(int) override {}
  double time_part(const std::function<void()>& part) override {
    part();
    return 0;
  }

 private:
  std::vector<double> x_;
  cg::Tally tally_;
};

TEST(CgReference, CheckCatchesASolverThatSkipsBlindly) {
  StaleCache solver(problem("ring8", "1000", "1e-6"));
  solver.run();
  const Verdict v = solver.check();
  EXPECT_FALSE(v.passed);
  EXPECT_NE(v.detail.find("step 1 (skipped by the gate)"), std::string::npos) << v.detail;
}

// No drift: b never changes, so every skip of the stale cache is right for the gate; a warm start
// has no gate and must not skip even then.
TEST(CgReference, CheckFailsAWarmStartThatSkips) {
  StaleCache lazy(problem("ring8", "1000", "0"), cg::Start::lazy);
  StaleCache warm(problem("ring8", "1000", "0"), cg::Start::warm);
  lazy.run();
  warm.run();
  EXPECT_FALSE(lazy.check().passed);  // the cache is b_0 itself, not its solution
  const Verdict v = warm.check();
  EXPECT_FALSE(v.passed);
  EXPECT_NE(v.detail.find("skipped by a solver without the gate"), std::string::npos) << v.detail;
}

// The registered variants of one system (axis graph) and of the propagator's rows (axis rows_shape).
bool solves_rows(const Variant& v) { return std::find(v.axes.begin(), v.axes.end(), "rows_shape") != v.axes.end(); }
std::vector<std::size_t> variant_indices(bool rows) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < cg_stage().variants.size(); ++i)
    if (solves_rows(cg_stage().variants[i]) == rows) out.push_back(i);
  return out;
}
std::string variant_name(const ::testing::TestParamInfo<std::size_t>& info) {
  const Variant& v = cg_stage().variants.at(info.param);
  return std::string(to_string(v.backend)) + "_" + v.id;
}

// Every strategy, every solve's true residual: one row, tiny and odd sizes, each graph family.
class CgVariant : public ::testing::TestWithParam<std::size_t> {};

TEST_P(CgVariant, EverySolveMeetsTheTolerance) {
  const Variant& v = cg_stage().variants.at(GetParam());
  const std::vector<Problem> problems{
      problem("ring8", "1", "1e-6"),      problem("ring8", "7", "1e-6"),      problem("ring5", "1000", "5e-7"),
      problem("grid3d", "10007", "1e-6"), problem("random7", "4099", "2e-6"), problem("grid2d", "3001", "0", "2"),
  };
  for (const auto& p : problems) TB_EXPECT_MATCHES_REFERENCE(v, p);
}

INSTANTIATE_TEST_SUITE_P(AllVariants, CgVariant, ::testing::ValuesIn(variant_indices(false)), variant_name);

// The gate follows the drift: no drift, every solve skipped; a drift far above the gate's
// tolerance, none; about the tolerance, some. Without the gate nothing is skipped, and every solve
// takes the iterations of a cold start.
TEST(CgGate, SkipRateFollowsTheDrift) {
  std::map<std::string, double> skip;
  for (const char* drift : {"0", "1e-6", "1e-4"}) {
    auto lazy = make("host_checked_lazy", Backend::cpu, problem("ring8", "5000", drift));
    lazy->run();
    const auto c = counters(*lazy);
    skip[drift] = c.at("skip_rate");
    // Lazy: the gate's matvec plus the iterations.
    EXPECT_NEAR(c.at("matvecs_per_solve"), 1.0 + c.at("iterations_per_solve"), 1e-12);
    EXPECT_LE(c.at("final_rel_residual_ppm"), 1.0);  // below lazy_cg_tol = 1e-6
    EXPECT_GT(c.at("gate_ns"), 0);
    EXPECT_GT(c.at("predicted_ns"), 0);
  }
  EXPECT_EQ(skip["0"], 1.0);
  EXPECT_EQ(skip["1e-4"], 0.0);
  EXPECT_GT(skip["1e-6"], 0.1);
  EXPECT_LT(skip["1e-6"], 0.9);

  auto full = make("host_checked", Backend::cpu, problem("ring8", "5000", "0"));
  full->run();
  const auto c = counters(*full);
  EXPECT_EQ(c.at("skip_rate"), 0.0);
  EXPECT_EQ(c.at("matvecs_per_solve"), c.at("iterations_per_solve"));
  EXPECT_GT(c.at("iterations_per_solve"), 5);
  EXPECT_LE(c.at("final_rel_residual_ppm"), 0.1);  // below cg_tol = 1e-7
  EXPECT_EQ(c.count("predicted_ns"), 0u);
}

// The warm start alone: from the cache like the gate, but every solve goes on to tol (its check
// passes with tol, not lazy_tol), nothing is skipped, and one matvec per solve goes to its residual.
// Where the gate skips some solves the warm start iterates on them, and where the drift is large it
// needs fewer iterations than a cold start.
TEST(CgWarm, NeverSkipsAndSolvesEveryStepToTol) {
  for (const char* drift : {"0", "1e-6", "1e-4"}) {
    const Problem p = problem("ring8", "5000", drift);
    auto warm = make("host_checked_warm", Backend::cpu, p);
    warm->run();
    const Verdict verdict = warm->check();
    EXPECT_TRUE(verdict.passed) << drift << ": " << verdict.detail;
    const auto c = counters(*warm);
    EXPECT_EQ(c.at("skip_rate"), 0.0) << drift;
    EXPECT_NEAR(c.at("matvecs_per_solve"), 1.0 + c.at("iterations_per_solve"), 1e-12) << drift;
    EXPECT_LE(c.at("final_rel_residual_ppm"), 0.1) << drift;  // below cg_tol = 1e-7, not lazy_cg_tol
    EXPECT_GT(c.at("full_solve_ns"), 0) << drift;
    EXPECT_EQ(c.count("predicted_ns"), 0u) << drift;

    auto lazy = make("host_checked_lazy", Backend::cpu, p);
    auto cold = make("host_checked", Backend::cpu, p);
    lazy->run();
    cold->run();
    const auto l = counters(*lazy), k = counters(*cold);
    if (std::string(drift) == "0") {
      // b never moves: the cache meets tol already, a solve of no iterations (the gate skips them all).
      EXPECT_EQ(c.at("iterations_per_solve"), 0.0);
      EXPECT_EQ(l.at("skip_rate"), 1.0);
    } else if (l.at("skip_rate") > 0) {
      EXPECT_GT(c.at("iterations_per_solve"), l.at("iterations_per_solve")) << drift;
    }
    if (std::string(drift) == "1e-4") {
      EXPECT_LT(c.at("iterations_per_solve"), k.at("iterations_per_solve"));
    }
  }
}

// A window replays from the same cache, so every call takes the same decisions and ends at the same x.
TEST(CgGate, WindowsAreIdentical) {
  auto lazy = make("host_checked_lazy", Backend::cpu, problem("grid2d", "10000", "1e-6"));
  auto* solver = dynamic_cast<cg::WindowSolver*>(lazy.get());
  ASSERT_NE(solver, nullptr);
  lazy->run();
  const auto first = solver->solution();
  const cg::Tally once = solver->tally();
  lazy->run();
  EXPECT_EQ(solver->solution(), first);
  const cg::Tally twice = solver->tally();
  EXPECT_EQ(twice.solves, 2 * once.solves);
  EXPECT_EQ(twice.skips, 2 * once.skips);
  EXPECT_EQ(twice.iterations, 2 * once.iterations);
}

// CPU and CUDA solve the same window; both residuals are below the tolerance and A's eigenvalues are
// at least 1, so the solutions differ by at most tol_a + tol_b relative to ||b||; the gate decides
// the same.
TEST(CgAgreement, CpuAndCudaSolutionsAgree) {
  const Stage& s = cg_stage();
  for (const char* start : {"_lazy", "_warm", ""}) {
    const std::string id = std::string("host_checked") + start;
    for (const char* cuda_id : {"host_checked", "graph", "persistent"}) {
      const std::string cuda_name = std::string(cuda_id) + start;
      const Variant* cuda = s.find_variant(cuda_name, Backend::cuda);
      ASSERT_NE(cuda, nullptr);
      if (const std::string why = testing::cannot_run_here(*cuda); !why.empty()) GTEST_SKIP() << cuda_name << ": " << why;
      const Problem p = problem("ring8", "30011", "1e-6");
      auto a = make(id.c_str(), Backend::cpu, p);
      auto b = make(cuda_name.c_str(), Backend::cuda, p);
      a->run();
      b->run();
      auto* sa = dynamic_cast<cg::WindowSolver*>(a.get());
      auto* sb = dynamic_cast<cg::WindowSolver*>(b.get());
      const auto xa = sa->solution(), xb = sb->solution();
      const cg::RhsSequence rhs(30011, 1e-6, defaults::cg_window);
      double diff = 0;
      for (std::size_t i = 0; i < xa.size(); ++i) diff += (xa[i] - xb[i]) * (xa[i] - xb[i]);
      const double limit = 2 * defaults::lazy_cg_tol * norm(rhs.b(defaults::cg_window), 30011);
      EXPECT_LE(std::sqrt(diff), limit) << id << " vs cuda/" << cuda_name;
      EXPECT_EQ(sa->tally().skips, sb->tally().skips) << id << " vs cuda/" << cuda_name;
    }
  }
}

// Per strategy: the warm start against the cold one, and the gate against the warm start alone,
// with the gate model's prediction (a counter the lazy variant reports). The pair that mixed both
// effects (cold start vs gate) is gone. The device-resident pairs stay.
TEST(CgRegistry, DeclaresThePairsOfTheIssue) {
  const Stage& s = cg_stage();
  auto find = [&](const std::string& base, const std::string& improved) -> const Pair* {
    for (const auto& p : s.pairs)
      if (p.baseline == base && p.improved == improved) return &p;
    return nullptr;
  };
  for (const std::string strategy : {"host_checked", "graph", "persistent"}) {
    for (const char* start : {"", "_warm", "_lazy"})
      EXPECT_NE(s.find_variant(strategy + start, Backend::cuda), nullptr) << strategy << start;
    const Pair* warm = find(strategy, strategy + "_warm");
    ASSERT_NE(warm, nullptr) << strategy;
    EXPECT_NE(warm->label.find("warm start vs cold start"), std::string::npos) << warm->label;
    const Pair* gate = find(strategy + "_warm", strategy + "_lazy");
    ASSERT_NE(gate, nullptr) << strategy;
    EXPECT_NE(gate->label.find("gate vs warm start alone"), std::string::npos) << gate->label;
    EXPECT_EQ(gate->predicted_ns, "predicted_ns");
    EXPECT_EQ(find(strategy, strategy + "_lazy"), nullptr) << strategy << ": cold vs lazy mixes two effects";
  }
  for (const char* start : {"", "_warm", "_lazy"})
    EXPECT_NE(s.find_variant(std::string("host_checked") + start, Backend::cpu), nullptr) << start;
  EXPECT_NE(find("host_checked", "graph"), nullptr);
  EXPECT_NE(find("host_checked", "persistent"), nullptr);
  EXPECT_NE(find("host_checked_lazy", "graph_lazy"), nullptr);
  EXPECT_NE(find("host_checked_lazy", "persistent_lazy"), nullptr);
  // The prediction the gate pairs name is one the lazy variant reports.
  auto lazy = make("host_checked_lazy", Backend::cpu, problem("ring8", "1000", "1e-6"));
  lazy->run();
  EXPECT_EQ(counters(*lazy).count("predicted_ns"), 1u);
  const Variant* v = s.find_variant("host_checked", Backend::cpu);
  EXPECT_NE(v->unsupported(problem("ring8", "1000", "1e-6", "-1")), "");
  EXPECT_NE(v->unsupported(problem("ring8", "1000", "-1e-6")), "");
  EXPECT_EQ(v->unsupported(problem("ring8", "1000", "1e-6")), "");
}

// ---- the propagator's form (rows.h) -----------------------------------------------------------------

Problem rows_problem(const char* shape, const char* drift) { return Problem({{"rows_shape", shape}, {"drift", drift}}); }

cg::RowSystems small_rows(int64_t rows, int64_t width, int64_t k, double tol) {
  return cg::RowSystems{rows, width, k, 0.3, tol, 1e-6, 200};
}

// x = A^-1 b for one row by dense Gaussian elimination (A is SPD: no pivoting), A from the ring's
// definition.
std::vector<double> direct_row_solve(const cg::RowSystems& s, const double* b) {
  const int64_t C = s.width;
  std::vector<double> a(static_cast<std::size_t>(C * C), 0.0), x(b, b + C);
  for (int64_t i = 0; i < C; ++i) {
    a[i * C + i] += 1 + s.alpha * static_cast<double>(s.neighbours);
    for (int64_t d = 1; d <= s.neighbours / 2; ++d) {
      a[i * C + (i - d + C) % C] -= s.alpha;
      a[i * C + (i + d) % C] -= s.alpha;
    }
  }
  for (int64_t k = 0; k < C; ++k)
    for (int64_t i = k + 1; i < C; ++i) {
      const double f = a[i * C + k] / a[k * C + k];
      for (int64_t j = k; j < C; ++j) a[i * C + j] -= f * a[k * C + j];
      x[i] -= f * x[k];
    }
  for (int64_t i = C - 1; i >= 0; --i) {
    for (int64_t j = i + 1; j < C; ++j) x[i] -= a[i * C + j] * x[j];
    x[i] /= a[i * C + i];
  }
  return x;
}

std::vector<double> random_rows(const cg::RowSystems& s, uint64_t seed) {
  std::vector<double> b(static_cast<std::size_t>(s.rows * s.width));
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = uniform_at(seed, i);
  return b;
}

// In double, solved to 1e-12: every row matches its direct solve; a zero row stays zero (its step
// length is 0) while the others iterate; the counts are one solve, a matvec per iteration plus the
// start's.
TEST(CgRows, DoubleSolveMatchesADirectSolve) {
  for (const auto& [k, width] : std::vector<std::pair<int64_t, int64_t>>{{2, 3}, {4, 13}, {8, 9}, {8, 384}}) {
    const cg::RowSystems s = small_rows(7, width, k, 1e-12);
    std::vector<double> b = random_rows(s, 5);
    std::fill(b.begin() + 2 * width, b.begin() + 3 * width, 0.0);  // row 2: b = 0
    std::vector<double> x(b.size(), 1.0), work(static_cast<std::size_t>(cg::rows_workspace(s.rows, s.width)));
    cg::CpuRows<double> rows;
    const cg::RowStats stats = cg::solve_rows(rows, s, x.data(), b.data(), nullptr, false, work.data());
    EXPECT_EQ(stats.solves, 1);
    EXPECT_EQ(stats.skipped, 0);
    EXPECT_GT(stats.iterations, 0);
    EXPECT_EQ(stats.matvecs, stats.iterations + 1);
    EXPECT_LE(stats.worst_residual, 1e-12);
    for (int64_t n = 0; n < s.rows; ++n) {
      const std::vector<double> want = direct_row_solve(s, b.data() + n * width);
      for (int64_t c = 0; c < width; ++c)
        EXPECT_NEAR(x[n * width + c], want[c], 1e-11) << "k " << k << ", width " << width << ", row " << n << ", col " << c;
      EXPECT_LE(cg::true_row_residual(s, b.data() + n * width, x.data() + n * width), 1e-12 + tolerance::cg_residual_atol)
          << "row " << n;
    }
  }
}

// The step's StepPropagator.LazyGateSkipsAnUnchangedInputAndSolvesAChangedOne, on the solver itself:
// the first call solves (from a zero cache), the same batch again is skipped with one matvec and the
// cache handed on untouched, a changed batch is solved again and cached.
TEST(CgRows, GateSkipsAnUnchangedBatchAndSolvesAChangedOne) {
  const cg::RowSystems s = small_rows(5, 64, 8, 1e-8);
  std::vector<double> b = random_rows(s, 9), x(b.size()), cache(b.size(), 0.0);
  std::vector<double> work(static_cast<std::size_t>(cg::rows_workspace(s.rows, s.width)));
  cg::CpuRows<double> rows;
  const cg::RowStats first = cg::solve_rows(rows, s, x.data(), b.data(), cache.data(), true, work.data());
  EXPECT_EQ(first.skipped, 0);
  EXPECT_GT(first.iterations, 0);
  EXPECT_EQ(cache, x);
  const std::vector<double> solved = x;

  const cg::RowStats again = cg::solve_rows(rows, s, x.data(), b.data(), cache.data(), true, work.data());
  EXPECT_EQ(again.solves, 1);
  EXPECT_EQ(again.skipped, 1);
  EXPECT_EQ(again.iterations, 0);
  EXPECT_EQ(again.matvecs, 1);
  EXPECT_EQ(x, solved);
  EXPECT_EQ(cache, solved);
  EXPECT_LT(again.worst_residual, 1e-8);

  b[3] += 0.5;  // a changed batch: solved again
  const cg::RowStats changed = cg::solve_rows(rows, s, x.data(), b.data(), cache.data(), true, work.data());
  EXPECT_EQ(changed.skipped, 0);
  EXPECT_GT(changed.iterations, 0);
  EXPECT_LT(changed.worst_residual, 1e-8);
  EXPECT_EQ(cache, x);
  for (int64_t n = 0; n < s.rows; ++n)
    EXPECT_LE(cg::true_row_residual(s, b.data() + n * s.width, x.data() + n * s.width), 1e-8 + tolerance::cg_residual_atol);

  // Without the gate the same batch is never skipped: the cache already meets tol, so no iteration.
  const cg::RowStats warm = cg::solve_rows(rows, s, x.data(), b.data(), cache.data(), false, work.data());
  EXPECT_EQ(warm.skipped, 0);
  EXPECT_EQ(warm.iterations, 0);

  cg::RowStats total;
  for (const cg::RowStats& one : {first, again, changed, warm}) total += one;
  EXPECT_EQ(total.solves, 4);
  EXPECT_EQ(total.skipped, 1);
  EXPECT_EQ(total.iterations, first.iterations + changed.iterations);
  EXPECT_EQ(total.worst_residual,
            std::max({first.worst_residual, again.worst_residual, changed.worst_residual, warm.worst_residual}));
}

// The gate tests the total relative residual, not every row's: one row of 100 moved by 5e-6 of its
// norm leaves the total near 5e-7, below lazy_tol = 1e-6, and the stale row is handed on.
TEST(CgRows, GateTestsTheTotalResidualNotEachRow) {
  const cg::RowSystems s = small_rows(100, 32, 8, 1e-10);
  std::vector<double> b = random_rows(s, 11), x(b.size()), cache(b.size(), 0.0);
  std::vector<double> work(static_cast<std::size_t>(cg::rows_workspace(s.rows, s.width)));
  cg::CpuRows<double> rows;
  cg::solve_rows(rows, s, x.data(), b.data(), cache.data(), true, work.data());
  double row_norm = 0;
  for (int64_t c = 0; c < s.width; ++c) row_norm += b[c] * b[c];
  b[0] += 5e-6 * std::sqrt(row_norm);
  const cg::RowStats stale = cg::solve_rows(rows, s, x.data(), b.data(), cache.data(), true, work.data());
  EXPECT_EQ(stale.skipped, 1);
  EXPECT_GT(cg::true_row_residual(s, b.data(), x.data()), s.lazy_tol);
  EXPECT_LT(cg::true_total_residual(s, b.data(), x.data()), s.lazy_tol);
  EXPECT_TRUE(cg::check_rows(s, b.data(), x.data(), true, 1, 0.0).passed);
  const Verdict as_solved = cg::check_rows(s, b.data(), x.data(), false, 1, 0.0);
  EXPECT_FALSE(as_solved.passed);
  EXPECT_NE(as_solved.detail.find("row 0 has true relative residual"), std::string::npos) << as_solved.detail;
}

TEST(CgRows, RhsRowsDriftByTheStratifiedAmounts) {
  const int64_t rows = 9, width = 1001;
  const int steps = 16;
  const cg::RowsRhs rhs(rows, width, 1e-3, steps);
  const std::vector<double> drifts = cg::window_drifts(1e-3, steps);
  const cg::RhsSequence single(10, 1e-3, steps);
  for (int t = 1; t <= steps; ++t) {
    EXPECT_EQ(rhs.drift_of(t), single.drift_of(t)) << "the same stratified drifts as one system's";
    EXPECT_EQ(rhs.drift_of(t), drifts[t]);
    for (int64_t n = 0; n < rows; ++n) {
      double diff = 0, prev = 0;
      for (int64_t c = 0; c < width; ++c) {
        const double d = static_cast<double>(rhs.b(t)[n * width + c]) - rhs.b(t - 1)[n * width + c];
        diff += d * d;
        prev += static_cast<double>(rhs.b(t - 1)[n * width + c]) * rhs.b(t - 1)[n * width + c];
      }
      // Rounded to float: each entry moves by about 1e-3 of its size, 1e-4 of that is the rounding.
      EXPECT_NEAR(std::sqrt(diff / prev), rhs.drift_of(t), 1e-3 * rhs.drift_of(t)) << "step " << t << ", row " << n;
    }
  }
}

// Every rows variant, every batch's true residual: one token, odd widths (the smallest ring, 9
// features, is complete), no drift (every lazy solve skipped), a drift far above the gate (none).
class CgRowsVariant : public ::testing::TestWithParam<std::size_t> {};

TEST_P(CgRowsVariant, EveryBatchMeetsItsTolerance) {
  const Variant& v = cg_stage().variants.at(GetParam());
  const std::vector<Problem> problems{
      rows_problem("1x9", "1e-6"),  rows_problem("7x13", "1e-6"),     rows_problem("3x100003", "5e-7"),
      rows_problem("257x384", "0"), rows_problem("1000x384", "2e-6"), rows_problem("33x100", "1e-4"),
  };
  for (const auto& p : problems) TB_EXPECT_MATCHES_REFERENCE(v, p);
}

INSTANTIATE_TEST_SUITE_P(RowsVariants, CgRowsVariant, ::testing::ValuesIn(variant_indices(true)), variant_name);

TEST(CgRowsGate, SkipRateFollowsTheDriftAndWindowsRepeat) {
  std::map<std::string, double> skip;
  for (const char* drift : {"0", "1e-6", "1e-4"}) {
    auto lazy = make("rows_lazy", Backend::cpu, rows_problem("512x384", drift));
    lazy->run();
    const auto c = counters(*lazy);
    skip[drift] = c.at("skip_rate");
    EXPECT_NEAR(c.at("matvecs_per_solve"), 1.0 + c.at("iterations_per_solve"), 1e-12) << drift;
    // (No bound on the worst row here: a skipped batch hands on rows above lazy_tol when the total is below.)
    const Verdict v = lazy->check();
    EXPECT_TRUE(v.passed) << drift << ": " << v.detail;
  }
  EXPECT_EQ(skip["0"], 1.0);
  EXPECT_EQ(skip["1e-4"], 0.0);

  auto cold = make("rows_cold", Backend::cpu, rows_problem("512x384", "1e-6"));
  auto warm = make("rows_warm", Backend::cpu, rows_problem("512x384", "1e-4"));
  cold->run();
  warm->run();
  const auto k = counters(*cold), w = counters(*warm);
  EXPECT_EQ(k.at("skip_rate"), 0.0);
  EXPECT_EQ(w.at("skip_rate"), 0.0);
  EXPECT_GT(k.at("iterations_per_solve"), 3);
  EXPECT_LE(k.at("final_rel_residual_ppm"), 1.0);  // solved: every row to tol = 1e-6 (the solver's estimate)
  EXPECT_LE(w.at("final_rel_residual_ppm"), 1.0);
  EXPECT_LT(w.at("iterations_per_solve"), k.at("iterations_per_solve")) << "a warm start needs fewer iterations";

  // Every call replays the same window from the same cache: the same decisions, the same x.
  auto made = make("rows_lazy", Backend::cpu, rows_problem("300x100", "1e-6"));
  auto* owned = dynamic_cast<cg::RowsWindow*>(made.get());
  ASSERT_NE(owned, nullptr);
  owned->run();
  const std::vector<float> first = owned->solution();
  const cg::RowStats once = owned->stats();
  owned->run();
  EXPECT_EQ(owned->solution(), first);
  EXPECT_EQ(owned->stats().skipped, 2 * once.skipped);
  EXPECT_EQ(owned->stats().iterations, 2 * once.iterations);
}

// CPU and CUDA solve the same window in float: where the gate's decisions are clear (no drift: all
// skipped; 1e-4: none) they take the same ones, and both solutions are within tol of the truth.
TEST(CgAgreement, RowsCpuAndCudaSolutionsAgree) {
  const Stage& s = cg_stage();
  for (const char* id : {"rows_cold", "rows_warm", "rows_lazy"}) {
    const Variant* cuda = s.find_variant(id, Backend::cuda);
    ASSERT_NE(cuda, nullptr) << id;
    if (const std::string why = testing::cannot_run_here(*cuda); !why.empty()) GTEST_SKIP() << id << ": " << why;
    for (const char* drift : {"0", "1e-4"}) {
      const Problem p = rows_problem("1001x384", drift);
      auto a = make(id, Backend::cpu, p);
      auto b = make(id, Backend::cuda, p);
      a->run();
      b->run();
      auto* wa = dynamic_cast<cg::RowsWindow*>(a.get());
      auto* wb = dynamic_cast<cg::RowsWindow*>(b.get());
      EXPECT_EQ(wa->stats().skipped, wb->stats().skipped) << id << " at drift " << drift;
      const std::vector<float> xa = wa->solution(), xb = wb->solution();
      const cg::RowsRhs rhs(1001, 384, std::stod(drift), defaults::cg_window);
      double diff = 0, bb = 0;
      for (std::size_t i = 0; i < xa.size(); ++i) {
        diff += (static_cast<double>(xa[i]) - xb[i]) * (static_cast<double>(xa[i]) - xb[i]);
        bb += static_cast<double>(rhs.b(defaults::cg_window)[i]) * rhs.b(defaults::cg_window)[i];
      }
      const double limit = 2 * (defaults::cg_rows_lazy_tol + tolerance::cg_rows_residual_fp32_atol);
      EXPECT_LE(std::sqrt(diff / bb), limit) << id << " at drift " << drift;
    }
  }
}

TEST(CgRegistry, DeclaresTheRowsVariantsAndTheirPairs) {
  const Stage& s = cg_stage();
  for (Backend b : {Backend::cpu, Backend::cuda})
    for (const char* id : {"rows_cold", "rows_warm", "rows_lazy"}) {
      const Variant* v = s.find_variant(id, b);
      ASSERT_NE(v, nullptr) << id;
      EXPECT_EQ(v->axes, (std::vector<std::string>{"rows_shape", "drift"})) << id;
      // sem_v55: micro-batch 128 x 256 tokens of d_model 384.
      EXPECT_EQ(expand_problems(s, *v, {}, false).front().get("rows_shape"), "32768x384");
      EXPECT_EQ(v->unsupported(rows_problem("64x8", "1e-6")).find("width must be above 8") != std::string::npos, true)
          << v->unsupported(rows_problem("64x8", "1e-6"));
      EXPECT_NE(v->unsupported(rows_problem("64x9", "-1e-6")), "");
      EXPECT_EQ(v->unsupported(rows_problem("64x9", "1e-6")), "") << id;
    }
  const Axis* shape = s.find_axis("rows_shape");
  ASSERT_NE(shape, nullptr);
  EXPECT_NE(shape->invalid_reason("32768"), "");
  EXPECT_NE(shape->invalid_reason("0x384"), "");
  EXPECT_NE(shape->invalid_reason("12x-3"), "");
  EXPECT_EQ(shape->invalid_reason("7x13"), "");
  auto has_pair = [&](const char* base, const char* improved) {
    for (const auto& p : s.pairs)
      if (p.baseline == base && p.improved == improved) return true;
    return false;
  };
  EXPECT_TRUE(has_pair("rows_cold", "rows_lazy"));
  EXPECT_TRUE(has_pair("rows_cold", "rows_warm"));
  EXPECT_TRUE(has_pair("rows_warm", "rows_lazy"));
}

}  // namespace
}  // namespace tb

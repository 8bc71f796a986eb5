// The oracle for `cg`: a solve is right when its true residual b - A x, computed from the graph's
// definition in double with plain loops, is below the tolerance; A's eigenvalues are at least 1, so
// ||x - x*|| <= ||b - A x|| and a small residual is a small error. Also the problem and the window's
// right-hand sides, shared by every backend.
#include <cmath>
#include <sstream>

#include "cg/cg.h"
#include "runtime/defaults.h"
#include "runtime/random.h"
#include "runtime/tolerance.h"

namespace tb::cg {

Settings settings_of(const Problem& p) {
  Settings s;
  s.graph = laplacian::parse_graph(p.get("graph"));
  s.rows = p.get_int("rows");
  s.alpha = p.get_double("alpha");
  s.drift = p.get_double("drift");
  s.window = defaults::cg_window;
  s.tol = defaults::cg_tol;
  s.lazy_tol = defaults::lazy_cg_tol;
  s.max_iterations = defaults::cg_max_iterations;
  return s;
}

namespace {

double norm(const double* v, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += v[i] * v[i];
  return std::sqrt(sum);
}

}  // namespace

RhsSequence::RhsSequence(int64_t n, double drift, int steps)
    : n_(n), steps_(steps), data_(static_cast<std::size_t>(n) * static_cast<std::size_t>(steps + 1)),
      drift_(static_cast<std::size_t>(steps + 1), 0.0) {
  double* b0 = data_.data();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) b0[i] = uniform_at(seed_rhs, static_cast<uint64_t>(i));
  // Step sizes drift x (0.5 + (j + 1/2) / S), j = 0..S-1, in a seeded order: the whole range in every
  // window, so the skip rate moves smoothly with `drift` instead of with the luck of a few draws.
  std::vector<int> order(static_cast<std::size_t>(steps));
  for (int j = 0; j < steps; ++j) order[j] = j;
  for (int j = steps - 1; j > 0; --j)
    std::swap(order[j], order[splitmix64(seed_rhs * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(j)) % static_cast<uint64_t>(j + 1)]);
  std::vector<double> direction(static_cast<std::size_t>(n));
  for (int t = 1; t <= steps; ++t) {
    drift_[t] = drift * (0.5 + (order[t - 1] + 0.5) / steps);
    const uint64_t seed = seed_rhs + 1000 + static_cast<uint64_t>(t);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) direction[i] = uniform_at(seed, static_cast<uint64_t>(i));
    const double* prev = b(t - 1);
    double* next = data_.data() + static_cast<std::size_t>(t) * static_cast<std::size_t>(n);
    const double u = norm(direction.data(), n);
    const double scale = u > 0 ? drift_[t] * norm(prev, n) / u : 0.0;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) next[i] = prev[i] + scale * direction[i];
  }
}

double true_relative_residual(const laplacian::Graph& graph, double alpha, const double* b, const double* x) {
  const int64_t n = graph.rows();
  std::vector<double> ax(static_cast<std::size_t>(n));
  laplacian::reference_apply(graph, alpha, x, ax.data());
  double rr = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double r = b[i] - ax[i];
    rr += r * r;
    bb += b[i] * b[i];
  }
  if (bb == 0) return std::sqrt(rr);
  return std::sqrt(rr / bb);
}

Verdict check_solve(const laplacian::Graph& graph, double alpha, const double* b, const double* x, double tol,
                    int step, bool skipped) {
  const double residual = true_relative_residual(graph, alpha, b, x);
  const double limit = tol + tolerance::cg_residual_atol;
  if (residual <= limit) return Verdict{true, residual, ""};
  std::ostringstream msg;
  msg.precision(3);
  msg << "step " << step << (skipped ? " (skipped by the gate)" : " (solved)") << ": true relative residual "
      << residual << " above " << limit;
  return Verdict{false, std::isfinite(residual) ? residual : INFINITY, msg.str()};
}

}  // namespace tb::cg

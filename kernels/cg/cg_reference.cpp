// The oracle for `cg`: a solve is right when its true residual b - A x, computed from the graph's
// definition in double with plain loops, is below the tolerance; A's eigenvalues are at least 1, so
// ||x - x*|| <= ||b - A x|| and a small residual is a small error. Also the problems and the windows'
// right-hand sides, shared by every backend: one system (graph) and the propagator's rows (ring).
#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>
#include <vector>

#include "cg/cg.h"
#include "runtime/defaults.h"
#include "runtime/error.h"
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

std::vector<double> window_drifts(double drift, int steps) {
  // Step sizes drift x (0.5 + (j + 1/2) / S), j = 0..S-1, in a seeded order: the whole range in every
  // window, so the skip rate moves smoothly with `drift` instead of with the luck of a few draws.
  std::vector<int> order(static_cast<std::size_t>(steps));
  for (int j = 0; j < steps; ++j) order[j] = j;
  for (int j = steps - 1; j > 0; --j)
    std::swap(order[j],
              order[splitmix64(seed_rhs * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(j)) % static_cast<uint64_t>(j + 1)]);
  std::vector<double> out(static_cast<std::size_t>(steps + 1), 0.0);
  for (int t = 1; t <= steps; ++t) out[t] = drift * (0.5 + (order[t - 1] + 0.5) / steps);
  return out;
}

RhsSequence::RhsSequence(int64_t n, double drift, int steps)
    : n_(n),
      steps_(steps),
      data_(static_cast<std::size_t>(n) * static_cast<std::size_t>(steps + 1)),
      drift_(static_cast<std::size_t>(steps + 1), 0.0) {
  double* b0 = data_.data();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) b0[i] = uniform_at(seed_rhs, static_cast<uint64_t>(i));
  drift_ = window_drifts(drift, steps);
  std::vector<double> direction(static_cast<std::size_t>(n));
  for (int t = 1; t <= steps; ++t) {
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

Verdict check_solve(const laplacian::Graph& graph, double alpha, const double* b, const double* x, double tol, int step,
                    bool skipped) {
  const double residual = true_relative_residual(graph, alpha, b, x);
  const double limit = tol + tolerance::cg_residual_atol;
  if (residual <= limit) return Verdict{true, residual, ""};
  std::ostringstream msg;
  msg.precision(3);
  msg << "step " << step << (skipped ? " (skipped by the gate)" : " (solved)") << ": true relative residual " << residual
      << " above " << limit;
  return Verdict{false, std::isfinite(residual) ? residual : INFINITY, msg.str()};
}

// ---- the propagator's rows ------------------------------------------------------------------------

std::string rows_shape_invalid_reason(const std::string& text) {
  const std::size_t x = text.find('x');
  if (x == std::string::npos) return "expected TOKENSxWIDTH, e.g. 32768x384";
  for (const std::string& part : {text.substr(0, x), text.substr(x + 1)}) {
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos || part.size() > 12)
      return "expected TOKENSxWIDTH with positive integers, e.g. 32768x384";
    if (std::stoll(part) < 1) return "tokens and width must be at least 1";
  }
  return "";
}

RowsShape parse_rows_shape(const std::string& text) {
  if (const std::string why = rows_shape_invalid_reason(text); !why.empty())
    throw UsageError("rows_shape '" + text + "': " + why);
  const std::size_t x = text.find('x');
  return RowsShape{std::stoll(text.substr(0, x)), std::stoll(text.substr(x + 1))};
}

RowsSettings rows_settings_of(const Problem& p) {
  const RowsShape shape = parse_rows_shape(p.get("rows_shape"));
  RowsSettings s;
  s.system = RowSystems{shape.tokens,
                        shape.width,
                        defaults::cg_rows_neighbours,
                        defaults::cg_rows_alpha,
                        defaults::cg_rows_tol,
                        defaults::cg_rows_lazy_tol,
                        defaults::cg_rows_max_iterations};
  s.drift = p.get_double("drift");
  s.window = defaults::cg_window;
  return s;
}

RowsRhs::RowsRhs(int64_t rows, int64_t width, double drift, int steps)
    : n_(rows * width),
      steps_(steps),
      data_(static_cast<std::size_t>(n_) * static_cast<std::size_t>(steps + 1)),
      drift_(window_drifts(drift, steps)) {
  float* b0 = data_.data();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n_; ++i) b0[i] = uniform_at(defaults::cg_rows_seed_rhs, static_cast<uint64_t>(i));
  for (int t = 1; t <= steps; ++t) {
    const uint64_t seed = defaults::cg_rows_seed_rhs + 1000 + static_cast<uint64_t>(t);
    const float* prev = b(t - 1);
    float* next = data_.data() + static_cast<std::size_t>(t) * static_cast<std::size_t>(n_);
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t at = row * width;
      double uu = 0, bb = 0;
      for (int64_t c = 0; c < width; ++c) {
        const double u = uniform_at(seed, static_cast<uint64_t>(at + c));
        uu += u * u;
        bb += static_cast<double>(prev[at + c]) * prev[at + c];
      }
      const double scale = uu > 0 ? drift_[t] * std::sqrt(bb / uu) : 0.0;
      for (int64_t c = 0; c < width; ++c)
        next[at + c] = static_cast<float>(prev[at + c] + scale * uniform_at(seed, static_cast<uint64_t>(at + c)));
    }
  }
}

namespace {

// ||b_n - A x_n||^2 and ||b_n||^2 of one row, A = I + alpha L from the ring's definition.
template <class T>
std::pair<double, double> row_squares(const RowSystems& s, const T* b, const T* x) {
  const int64_t C = s.width, k = s.neighbours;
  double rr = 0, bb = 0;
  for (int64_t i = 0; i < C; ++i) {
    double neighbours = 0;
    for (int64_t d = 1; d <= k / 2; ++d)
      neighbours += static_cast<double>(x[((i - d) % C + C) % C]) + static_cast<double>(x[(i + d) % C]);
    const double ax = x[i] + s.alpha * (static_cast<double>(k) * x[i] - neighbours);
    const double r = b[i] - ax;
    rr += r * r;
    bb += static_cast<double>(b[i]) * b[i];
  }
  return {rr, bb};
}

}  // namespace

template <class T>
double true_row_residual(const RowSystems& s, const T* b_row, const T* x_row) {
  const auto [rr, bb] = row_squares(s, b_row, x_row);
  return bb > 0 ? std::sqrt(rr / bb) : std::sqrt(rr);
}

template <class T>
double true_total_residual(const RowSystems& s, const T* b, const T* x) {
  double rr = 0, bb = 0;
  for (int64_t n = 0; n < s.rows; ++n) {
    const auto [r, q] = row_squares(s, b + n * s.width, x + n * s.width);
    rr += r;
    bb += q;
  }
  return bb > 0 ? std::sqrt(rr / bb) : std::sqrt(rr);
}

template <class T>
Verdict check_rows(const RowSystems& s, const T* b, const T* x, bool skipped, int step, double atol) {
  std::ostringstream msg;
  msg.precision(3);
  if (skipped) {
    const double total = true_total_residual(s, b, x), limit = s.lazy_tol + atol;
    if (total <= limit) return Verdict{true, total, ""};
    msg << "batch " << step << " (skipped by the gate): true total relative residual " << total << " above " << limit;
    return Verdict{false, std::isfinite(total) ? total : INFINITY, msg.str()};
  }
  const double limit = s.tol + atol;
  std::vector<double> residual(static_cast<std::size_t>(s.rows));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < s.rows; ++n) residual[n] = true_row_residual(s, b + n * s.width, x + n * s.width);
  double worst = 0;
  for (int64_t n = 0; n < s.rows; ++n) {
    const double r = residual[n];
    if (!(r <= limit)) {
      msg << "batch " << step << " (solved): row " << n << " has true relative residual " << r << " above " << limit;
      return Verdict{false, std::isfinite(r) ? r : INFINITY, msg.str()};
    }
    worst = std::max(worst, r);
  }
  return Verdict{true, worst, ""};
}

template double true_row_residual(const RowSystems&, const float*, const float*);
template double true_row_residual(const RowSystems&, const double*, const double*);
template double true_total_residual(const RowSystems&, const float*, const float*);
template double true_total_residual(const RowSystems&, const double*, const double*);
template Verdict check_rows(const RowSystems&, const float*, const float*, bool, int, double);
template Verdict check_rows(const RowSystems&, const double*, const double*, bool, int, double);

}  // namespace tb::cg

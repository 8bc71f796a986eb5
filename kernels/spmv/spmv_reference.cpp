// The oracle for `spmv`: A x from the graph's definition (laplacian::reference_apply), never from the
// CSR the variants use, compared entry by entry relative to the rounding scale sum_j |a_ij x_j|.
#include <cmath>
#include <sstream>
#include <vector>

#include "runtime/random.h"
#include "runtime/tolerance.h"
#include "spmv/spmv.h"

namespace tb::spmv {

Shape shape_of(const Problem& p) {
  Shape s;
  s.graph = laplacian::parse_graph(p.get("graph"));
  s.rows = p.get_int("rows");
  s.rhs = p.has("rhs") ? p.get_int("rhs") : 1;
  return s;
}

void fill_input(double* x, int64_t count) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) x[i] = uniform_at(seed_x, static_cast<uint64_t>(i));
}

namespace {

// Normalised error of one entry; infinite when `got` is not finite.
double entry_error(double got, double want, double scale) {
  if (!std::isfinite(got)) return INFINITY;
  const double diff = std::abs(got - want);
  return diff == 0 ? 0 : diff / (scale > 0 ? scale : 1e-300);
}

Verdict verdict_from(const std::vector<double>& error, const double* got, const std::vector<double>& want, int64_t rhs) {
  double worst = 0;
  for (std::size_t e = 0; e < error.size(); ++e) {
    worst = std::max(worst, error[e]);
    if (!(error[e] <= tolerance::spmv_fp64)) {
      std::ostringstream msg;
      msg.precision(17);
      msg << "y[" << static_cast<int64_t>(e) / rhs;
      if (rhs > 1) msg << "," << static_cast<int64_t>(e) % rhs;
      msg << "] = " << got[e] << ", reference " << want[e] << " (error " << error[e] << " of sum|a_ij x_j|, tolerance "
          << tolerance::spmv_fp64 << ")";
      return Verdict{false, worst, msg.str()};
    }
  }
  return Verdict{true, worst, ""};
}

}  // namespace

Verdict check_spmv(const laplacian::Graph& graph, double alpha, const double* x, const double* y) {
  const int64_t n = graph.rows();
  std::vector<double> want(static_cast<std::size_t>(n)), scale(static_cast<std::size_t>(n)),
      error(static_cast<std::size_t>(n));
  laplacian::reference_apply(graph, alpha, x, want.data(), scale.data());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) error[i] = entry_error(y[i], want[i], scale[i]);
  return verdict_from(error, y, want, 1);
}

Verdict check_spmm(const laplacian::Graph& graph, double alpha, const double* x, const double* y, int64_t rhs) {
  const int64_t n = graph.rows();
  const auto entries = static_cast<std::size_t>(n * rhs);
  std::vector<double> want(entries), error(entries);
#pragma omp parallel
  {
    std::vector<int32_t> nb;
    std::vector<double> sum(static_cast<std::size_t>(rhs)), magnitude(static_cast<std::size_t>(rhs));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      graph.neighbours(i, nb);
      const double diagonal = 1.0 + alpha * static_cast<double>(nb.size());
      std::fill(sum.begin(), sum.end(), 0.0);
      std::fill(magnitude.begin(), magnitude.end(), 0.0);
      for (const int32_t j : nb)
        for (int64_t c = 0; c < rhs; ++c) {
          sum[c] += x[j * rhs + c];
          magnitude[c] += std::abs(x[j * rhs + c]);
        }
      for (int64_t c = 0; c < rhs; ++c) {
        const int64_t e = i * rhs + c;
        want[e] = diagonal * x[e] - alpha * sum[c];
        error[e] = entry_error(y[e], want[e], diagonal * std::abs(x[e]) + alpha * magnitude[c]);
      }
    }
  }
  return verdict_from(error, y, want, rhs);
}

}  // namespace tb::spmv

// CPU `spmv`: an OpenMP CSR loop (the general case), the matrix-free stencil (ring and grid graphs:
// 16 B per row instead of about 128), and a CSR SpMM over row-major blocks of right-hand sides.
#include <algorithm>

#include "runtime/defaults.h"
#include "runtime/host_buffer.h"
#include "spmv/spmv.h"

namespace tb::spmv {

namespace {

using laplacian::Family;

// Inputs and outputs, first touched by the static schedule the timed loops use.
HostBuffer<double> input_buffer(int64_t count) {
  HostBuffer<double> b(static_cast<std::size_t>(count));
  fill_input(b.data(), count);
  return b;
}
HostBuffer<double> zero_buffer(int64_t count) {
  HostBuffer<double> b(static_cast<std::size_t>(count));
  double* y = b.data();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) y[i] = 0.0;
  return b;
}

class CpuCsr final : public Instance {
 public:
  explicit CpuCsr(const Shape& s)
      : graph_(s.graph, s.rows),
        a_(laplacian::build_shifted_laplacian(graph_, defaults::laplacian_alpha)),
        x_(input_buffer(s.rows)),
        y_(zero_buffer(s.rows)) {}
  void run() override {
    const int32_t* __restrict row_ptr = a_.row_ptr.data();
    const int32_t* __restrict col = a_.col.data();
    const double* __restrict val = a_.val.data();
    const double* __restrict x = x_.data();
    double* __restrict y = y_.data();
    const int64_t n = a_.n;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = csr_row_dot(row_ptr[i], row_ptr[i + 1], col, val, x);
  }
  Verdict check() override { return check_spmv(graph_, defaults::laplacian_alpha, x_.data(), y_.data()); }

 private:
  laplacian::Graph graph_;
  laplacian::Csr a_;
  HostBuffer<double> x_, y_;
};

// Ring rows in [lo, hi) whose band does not wrap, with the opposite partner at i + partner (or none):
// straight-line code the compiler vectorises.
template <int Half>
void ring_rows(const double* __restrict x, double* __restrict y, int64_t lo, int64_t hi, bool has_partner, int64_t partner,
               double alpha) {
  const double diagonal = 1.0 + alpha * (2 * Half + (has_partner ? 1 : 0));
  if (has_partner) {
#pragma omp for schedule(static) nowait
    for (int64_t i = lo; i < hi; ++i) {
      double sum = x[i + partner];
      for (int d = 1; d <= Half; ++d) sum += x[i + d] + x[i - d];
      y[i] = diagonal * x[i] - alpha * sum;
    }
  } else {
#pragma omp for schedule(static) nowait
    for (int64_t i = lo; i < hi; ++i) {
      double sum = 0;
      for (int d = 1; d <= Half; ++d) sum += x[i + d] + x[i - d];
      y[i] = diagonal * x[i] - alpha * sum;
    }
  }
}

class CpuStencil final : public Instance {
 public:
  explicit CpuStencil(const Shape& s)
      : graph_(s.graph, s.rows),
        stencil_(graph_.stencil(defaults::laplacian_alpha)),
        x_(input_buffer(s.rows)),
        y_(zero_buffer(s.rows)) {}
  void run() override {
    if (stencil_.family == Family::ring) run_ring();
    else run_grid();
  }
  Verdict check() override { return check_spmv(graph_, defaults::laplacian_alpha, x_.data(), y_.data()); }

 private:
  // Rows whose band wraps take the general stencil_row; the rest, the straight-line loops.
  void run_ring() {
    const laplacian::Stencil s = stencil_;
    const double* x = x_.data();
    double* y = y_.data();
    const int64_t h = s.half, n = s.n, m = s.opposite;
    const int64_t lo = h, hi = n - h;
#pragma omp parallel
    {
      if (m == 0) {
        ring_dispatch(x, y, lo, hi, false, 0);
      } else {
        ring_dispatch(x, y, lo, std::min(m, hi), true, m);
        ring_dispatch(x, y, std::max(m, lo), std::min(2 * m, hi), true, -m);
      }
      // n >= k + 3 puts the partnerless node (2m, odd n) among the wrapping rows.
#pragma omp single nowait
      {
        for (int64_t i = 0; i < lo; ++i) y[i] = laplacian::stencil_row(s, x, i);
        for (int64_t i = hi; i < n; ++i) y[i] = laplacian::stencil_row(s, x, i);
      }
    }
  }
  void ring_dispatch(const double* x, double* y, int64_t lo, int64_t hi, bool has_partner, int64_t partner) {
    if (hi <= lo) return;
    const double a = stencil_.alpha;
    switch (stencil_.half) {
      case 2:
        ring_rows<2>(x, y, lo, hi, has_partner, partner, a);
        break;
      case 3:
        ring_rows<3>(x, y, lo, hi, has_partner, partner, a);
        break;
      default:
        ring_rows<4>(x, y, lo, hi, has_partner, partner, a);
        break;
    }
  }

  // Grid lines (nx consecutive nodes): a line whose every neighbour exists takes the fixed-degree
  // interior loop for its inner nodes; the rest take the general stencil_row.
  void run_grid() {
    const laplacian::Stencil s = stencil_;
    const double* __restrict x = x_.data();
    double* __restrict y = y_.data();
    const int64_t n = s.n, nx = s.nx, lines = (n + nx - 1) / nx;
    const bool three_d = s.family == Family::grid3d;
    const int64_t plane = three_d ? nx * s.ny : 0;
    const double alpha = s.alpha, diagonal = 1.0 + alpha * (three_d ? 6 : 4);
#pragma omp parallel for schedule(static)
    for (int64_t l = 0; l < lines; ++l) {
      const int64_t begin = l * nx, end = std::min(n, begin + nx);
      bool interior = nx >= 3 && end - begin == nx;
      if (three_d) {
        const int64_t py = l % s.ny;
        interior = interior && py > 0 && py < s.ny - 1 && begin - plane >= 0 && end + plane <= n;
      } else {
        interior = interior && l > 0 && end + nx <= n;
      }
      if (!interior) {
        for (int64_t i = begin; i < end; ++i) y[i] = laplacian::stencil_row(s, x, i);
        continue;
      }
      y[begin] = laplacian::stencil_row(s, x, begin);
      if (three_d) {
        for (int64_t i = begin + 1; i < end - 1; ++i)
          y[i] = diagonal * x[i] - alpha * (x[i - 1] + x[i + 1] + x[i - nx] + x[i + nx] + x[i - plane] + x[i + plane]);
      } else {
        for (int64_t i = begin + 1; i < end - 1; ++i)
          y[i] = diagonal * x[i] - alpha * (x[i - 1] + x[i + 1] + x[i - nx] + x[i + nx]);
      }
      y[end - 1] = laplacian::stencil_row(s, x, end - 1);
    }
  }

  laplacian::Graph graph_;
  laplacian::Stencil stencil_;
  HostBuffer<double> x_, y_;
};

// Y = A X with X and Y row-major (n x rhs): each nonzero scales one contiguous row of X.
class CpuSpmmCsr final : public Instance {
 public:
  explicit CpuSpmmCsr(const Shape& s)
      : rhs_(s.rhs),
        graph_(s.graph, s.rows),
        a_(laplacian::build_shifted_laplacian(graph_, defaults::laplacian_alpha)),
        x_(input_buffer(s.rows * s.rhs)),
        y_(zero_buffer(s.rows * s.rhs)) {}
  void run() override {
    const int32_t* __restrict row_ptr = a_.row_ptr.data();
    const int32_t* __restrict col = a_.col.data();
    const double* __restrict val = a_.val.data();
    const double* __restrict x = x_.data();
    double* __restrict y = y_.data();
    const int64_t n = a_.n, m = rhs_;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      double* __restrict yi = y + i * m;
      for (int64_t c = 0; c < m; ++c) yi[c] = 0.0;
      for (int32_t p = row_ptr[i]; p < row_ptr[i + 1]; ++p) {
        const double a = val[p];
        const double* __restrict xj = x + static_cast<int64_t>(col[p]) * m;
        for (int64_t c = 0; c < m; ++c) yi[c] += a * xj[c];
      }
    }
  }
  Verdict check() override { return check_spmm(graph_, defaults::laplacian_alpha, x_.data(), y_.data(), rhs_); }

 private:
  int64_t rhs_;
  laplacian::Graph graph_;
  laplacian::Csr a_;
  HostBuffer<double> x_, y_;
};

}  // namespace

std::unique_ptr<Instance> make_cpu_csr(const Problem& p, const RunContext&) { return std::make_unique<CpuCsr>(shape_of(p)); }
std::unique_ptr<Instance> make_cpu_stencil(const Problem& p, const RunContext&) {
  return std::make_unique<CpuStencil>(shape_of(p));
}
std::unique_ptr<Instance> make_cpu_spmm_csr(const Problem& p, const RunContext&) {
  return std::make_unique<CpuSpmmCsr>(shape_of(p));
}

}  // namespace tb::spmv

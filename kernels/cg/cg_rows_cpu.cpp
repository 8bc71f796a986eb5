// CPU `cg`, the propagator's form (rows.h): the primitives solve_rows runs on, OpenMP over rows in
// float (what the step measures) or double (the step's gradient oracle), and the variants rows_cold,
// rows_warm and rows_lazy over them in float.
#include <algorithm>
#include <cmath>

#include "cg/cg.h"
#include "cg/rows.h"
#include "runtime/cpu_elementwise.h"
#include "runtime/host_buffer.h"

namespace tb::cg {

using cpu::parallel_worth;

template <class T>
void CpuRows<T>::zero(T* x, int64_t n) {
  cpu::zero(x, n);
}

template <class T>
void CpuRows<T>::copy(T* dst, const T* src, int64_t n) {
  cpu::copy(dst, src, n);
}

template <class T>
void CpuRows<T>::subtract(T* out, const T* a, const T* b, int64_t n) {
  cpu::subtract(out, a, b, n);
}

// Features whose k/2 neighbours on both sides lie inside the row skip the index wrap (two integer
// divisions per neighbour, most of the time of a plain loop); the sums are the same, in the same
// order, as the wrapped form the edges keep.
template <class T>
void CpuRows<T>::laplacian_apply(T* y, const T* x, int64_t N, int64_t C, int64_t k, T alpha) {
  const int64_t half = k / 2;
  const int64_t inner_begin = std::min(half, C), inner_end = std::max(inner_begin, C - half);
#pragma omp parallel for schedule(static) if (parallel_worth(N * C * k))
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    T* yr = y + n * C;
    auto wrapped = [&](int64_t i) {
      T neighbours = 0;
      for (int64_t d = 1; d <= half; ++d) neighbours += xr[(i - d + C) % C] + xr[(i + d) % C];
      yr[i] = xr[i] + alpha * (static_cast<T>(k) * xr[i] - neighbours);
    };
    for (int64_t i = 0; i < inner_begin; ++i) wrapped(i);
    for (int64_t i = inner_begin; i < inner_end; ++i) {
      T neighbours = 0;
      for (int64_t d = 1; d <= half; ++d) neighbours += xr[i - d] + xr[i + d];
      yr[i] = xr[i] + alpha * (static_cast<T>(k) * xr[i] - neighbours);
    }
    for (int64_t i = inner_end; i < C; ++i) wrapped(i);
  }
}

template <class T>
void CpuRows<T>::row_dots(T* out, const T* a, const T* b, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (parallel_worth(N * C))
  for (int64_t n = 0; n < N; ++n) {
    T s = 0;
    for (int64_t c = 0; c < C; ++c) s += a[n * C + c] * b[n * C + c];
    out[n] = s;
  }
}

template <class T>
void CpuRows<T>::cg_step(T* x, T* r, T* p, const T* ap, T* rs, const T* pap, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (parallel_worth(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T a = pap[n] > T(0) ? rs[n] / pap[n] : T(0);  // a converged row (r = 0) stays put
    T s = 0;
    for (int64_t c = 0; c < C; ++c) {
      x[n * C + c] += a * p[n * C + c];
      r[n * C + c] -= a * ap[n * C + c];
      s += r[n * C + c] * r[n * C + c];
    }
    const T beta = rs[n] > T(0) ? s / rs[n] : T(0);
    for (int64_t c = 0; c < C; ++c) p[n * C + c] = r[n * C + c] + beta * p[n * C + c];
    rs[n] = s;
  }
}

template <class T>
RowResidual CpuRows<T>::residual(const T* rs, const T* bb, int64_t N) {
  double worst = 0, r = 0, b = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (bb[n] > T(0)) worst = std::max(worst, std::sqrt(static_cast<double>(rs[n]) / static_cast<double>(bb[n])));
    r += static_cast<double>(rs[n]);
    b += static_cast<double>(bb[n]);
  }
  return RowResidual{worst, b > 0 ? std::sqrt(r / b) : 0.0};
}

template class CpuRows<float>;
template class CpuRows<double>;

namespace {

class CpuRowsWindow final : public RowsWindow {
 public:
  CpuRowsWindow(const Problem& p, Start start)
      : RowsWindow(p, start),
        n_(settings_.system.rows * settings_.system.width),
        x_(size(n_)),
        cache_(size(n_)),
        solved_b0_(size(n_)),
        workspace_(size(rows_workspace(settings_.system.rows, settings_.system.width))) {
    rows_.zero(x_.data(), n_);  // first touch by the threads that use them
    rows_.zero(cache_.data(), n_);
    rows_.zero(workspace_.data(), static_cast<int64_t>(workspace_.size()));
    if (starts_from_cache()) {  // the cache a window starts from: b_0 solved from zero
      solve_rows(rows_, settings_.system, x_.data(), rhs_.b(0), cache_.data(), false, workspace_.data());
      rows_.copy(solved_b0_.data(), cache_.data(), n_);
    }
  }

  std::vector<float> solution() override { return std::vector<float>(x_.data(), x_.data() + n_); }

 protected:
  void begin_window() override {
    if (starts_from_cache()) rows_.copy(cache_.data(), solved_b0_.data(), n_);
  }
  RowStats solve(int t) override {
    return solve_rows(rows_, settings_.system, x_.data(), rhs_.b(t), starts_from_cache() ? cache_.data() : nullptr,
                      start_ == Start::lazy, workspace_.data());
  }

 private:
  static std::size_t size(int64_t n) { return static_cast<std::size_t>(n); }

  CpuRows<float> rows_;
  int64_t n_;
  HostBuffer<float> x_, cache_, solved_b0_, workspace_;
};

}  // namespace

std::unique_ptr<Instance> make_cpu_rows(const Problem& p, const RunContext&, Start start) {
  return std::make_unique<CpuRowsWindow>(p, start);
}

}  // namespace tb::cg

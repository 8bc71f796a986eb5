// The propagator's form of `cg`, as functions over buffers: N independent systems (I + alpha L) x_n = b_n,
// one per row of [N, C] (a token's hidden vector), L the Laplacian of the ring lattice that joins each
// of the C features to its k nearest (k/2 on each side, indices mod C). This is the solve the training
// step's propagator runs (step/model.h calls solve_rows); the variants rows_cold, rows_warm and
// rows_lazy (cg.h) measure it.
//
// solve_rows is host-checked and row-batched: every row iterates together, the host reads the worst
// row's relative residual after every iteration (one sync on a GPU), and CG stops when it is at most
// tol or after max_iterations; a row that has converged stays put (its step length is 0 once p.Ap is
// 0). With a cache (the previous solution) it starts warm and leaves the solution in the cache; with
// the lazy gate of docs/sources.md#000-sem-v55 it keeps the cache and skips the solve when the TOTAL relative residual
// sqrt(sum_n ||r_n||^2 / sum_n ||b_n||^2) is below lazy_tol.
//
// The primitives come from a backend: CpuRows<T> (OpenMP, float as measured, double as the step's
// gradient oracle) or CudaRows (float, on a stream). This header includes no CUDA header.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>

struct CUstream_st;  // cudaStream_t is CUstream_st*: CudaRows takes one without this header including CUDA's

namespace tb::cg {

// N systems of C unknowns and how they are solved.
struct RowSystems {
  int64_t rows = 0;        // N: systems (tokens)
  int64_t width = 0;       // C: unknowns per system (features)
  int64_t neighbours = 0;  // k: even, below width
  double alpha = 0;
  double tol = 0;       // CG stops when every row has ||r_n|| <= tol ||b_n||
  double lazy_tol = 0;  // the gate skips when the total relative residual is below this
  int64_t max_iterations = 0;
};

// What solves did, summed (the step reports these as its SolveStats).
struct RowStats {
  int64_t solves = 0, skipped = 0, iterations = 0, matvecs = 0;
  double worst_residual = 0;  // the worst row's relative residual handed on (skipped solves included)

  RowStats& operator+=(const RowStats& o) {
    solves += o.solves;
    skipped += o.skipped;
    iterations += o.iterations;
    matvecs += o.matvecs;
    worst_residual = std::max(worst_residual, o.worst_residual);
    return *this;
  }
};

// The two readings of the residual the solve decides on.
struct RowResidual {
  double worst = 0;  // max over rows with b_n != 0 of sqrt(rs_n / bb_n): the stopping test
  double total = 0;  // sqrt(sum rs / sum bb), 0 when b = 0: the gate's test
};

// Elements of T solve_rows needs as scratch: r, p, Ap [N, C] and r.r, p.Ap, b.b [N].
inline int64_t rows_workspace(int64_t rows, int64_t width) { return 3 * rows * width + 3 * rows; }

// The CPU primitives: OpenMP over rows, each row summed in order (a solve is deterministic).
template <class T>
class CpuRows {
 public:
  using value_type = T;
  void zero(T* x, int64_t n);
  void copy(T* dst, const T* src, int64_t n);
  void subtract(T* out, const T* a, const T* b, int64_t n);
  // y_n = A x_n: y_i = x_i + alpha (k x_i - sum_{d=1..k/2} (x_{i-d} + x_{i+d})), indices mod C.
  void laplacian_apply(T* y, const T* x, int64_t N, int64_t C, int64_t k, T alpha);
  void row_dots(T* out, const T* a, const T* b, int64_t N, int64_t C);  // out_n = a_n . b_n
  // One CG iteration per row, given pap_n = p_n . Ap_n: a = rs/pap (0 when pap <= 0: a converged row
  // stays put), x += a p, r -= a Ap, rs' = r.r, p = r + (rs'/rs) p, rs = rs'.
  void cg_step(T* x, T* r, T* p, const T* ap, T* rs, const T* pap, int64_t N, int64_t C);
  RowResidual residual(const T* rs, const T* bb, int64_t N);
};
extern template class CpuRows<float>;
extern template class CpuRows<double>;

// The CUDA primitives (cg_cuda.cu), in float on `stream`; residual() reads back (one sync).
class CudaRows {
 public:
  using value_type = float;
  CudaRows(CUstream_st* stream, int device);
  ~CudaRows();
  CudaRows(const CudaRows&) = delete;
  CudaRows& operator=(const CudaRows&) = delete;

  void zero(float* x, int64_t n);
  void copy(float* dst, const float* src, int64_t n);
  void subtract(float* out, const float* a, const float* b, int64_t n);
  void laplacian_apply(float* y, const float* x, int64_t N, int64_t C, int64_t k, float alpha);
  void row_dots(float* out, const float* a, const float* b, int64_t N, int64_t C);
  void cg_step(float* x, float* r, float* p, const float* ap, float* rs, const float* pap, int64_t N, int64_t C);
  RowResidual residual(const float* rs, const float* bb, int64_t N);

 private:
  struct Readback;  // the device summary and its pinned host slot
  CUstream_st* stream_;
  int max_grid_ = 1;
  std::unique_ptr<Readback> readback_;
};

// x = A^-1 b for every row of b [N, C]. cache null: a cold start from x = 0 (the gate needs a cache);
// else a warm start from the cache, which then holds the solution (left as it was when skipped).
// `workspace` holds rows_workspace(N, C) elements. Returns what this solve did. (cache's type is not
// deduced, so a literal nullptr asks for a cold start.)
template <class Rows, class T = typename Rows::value_type>
RowStats solve_rows(Rows& rows, const RowSystems& s, T* x, const T* b, std::common_type_t<T>* cache, bool lazy,
                    T* workspace) {
  static_assert(std::is_same_v<T, typename Rows::value_type>, "the buffers are in the backend's type");
  const int64_t N = s.rows, C = s.width, n = N * C;
  const T alpha = static_cast<T>(s.alpha);
  T* r = workspace;
  T* p = r + n;
  T* ap = p + n;
  T* rs = ap + n;
  T* pap = rs + N;
  T* bb = pap + N;
  RowStats stats;
  stats.solves = 1;
  const bool warm = cache != nullptr;
  if (warm) rows.copy(x, cache, n);
  else rows.zero(x, n);
  rows.row_dots(bb, b, b, N, C);
  // r = b - A x (on a cold start too: the step's propagator has always spent this matvec on A 0)
  rows.laplacian_apply(ap, x, N, C, s.neighbours, alpha);
  ++stats.matvecs;
  rows.subtract(r, b, ap, n);
  rows.row_dots(rs, r, r, N, C);
  RowResidual residual = rows.residual(rs, bb, N);  // host read: one sync, the host-checked strategy
  if (lazy && warm && residual.total < s.lazy_tol) {
    stats.skipped = 1;
    stats.worst_residual = residual.worst;
    return stats;
  }
  rows.copy(p, r, n);
  for (int64_t it = 0; it < s.max_iterations && residual.worst > s.tol; ++it) {
    rows.laplacian_apply(ap, p, N, C, s.neighbours, alpha);
    ++stats.matvecs;
    ++stats.iterations;
    rows.row_dots(pap, p, ap, N, C);
    rows.cg_step(x, r, p, ap, rs, pap, N, C);
    residual = rows.residual(rs, bb, N);
  }
  stats.worst_residual = residual.worst;
  if (warm) rows.copy(cache, x, n);
  return stats;
}

}  // namespace tb::cg

// Stage `spmv`: the propagator's sparse matvec y = A x with A = I + alpha L (spmv/laplacian.h), and
// its many-right-hand-side form Y = A X (SpMM: one column per token's hidden vector), against the
// bandwidth floor. Values and vectors are fp64 (the CG that uses it solves to 1e-7).
//
// Bytes model (what one call must move at least, x and the matrix read once):
//   CSR SpMV:  12 B per nonzero (8 value + 4 column) + 4 B per row pointer + 8 B x + 8 B y per row
//   stencil:   8 B x + 8 B y per row (the matrix is arithmetic)
//   CSR SpMM:  the CSR once + 8 B per entry of X and of Y (n x rhs each, row-major)
// Random graphs gather x with no locality, so they move more than this model; that shortfall is
// what their % of peak shows.
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/registry.h"
#include "spmv/laplacian.h"

namespace tb::spmv {

inline constexpr uint64_t seed_x = 31;

struct Shape {
  laplacian::GraphSpec graph;
  int64_t rows = 0;
  int64_t rhs = 1;  // columns of X (SpMM variants)
};
Shape shape_of(const Problem& p);  // axes graph, rows and (when present) rhs

// x (or X, row-major n x rhs): element i is uniform_at(seed_x, i) in [-1, 1).
void fill_input(double* x, int64_t count);

// ---- reference: the graph's own definition, plain loops, no CSR -------------------------------------
// y = A x, each entry within tolerance::spmv_fp64 of sum_j |a_ij x_j|.
Verdict check_spmv(const laplacian::Graph& graph, double alpha, const double* x, const double* y);
// Y = A X for X, Y row-major n x rhs.
Verdict check_spmm(const laplacian::Graph& graph, double alpha, const double* x, const double* y, int64_t rhs);

// One CSR row's dot product on the CPU (also CG's matvec), with two accumulators: a row is a handful
// of nonzeros, and one running sum would make each add wait for the previous one.
inline double csr_row_dot(int32_t begin, int32_t end, const int32_t* __restrict col, const double* __restrict val,
                          const double* __restrict x) {
  double even = 0, odd = 0;
  int32_t p = begin;
  for (; p + 1 < end; p += 2) {
    even += val[p] * x[col[p]];
    odd += val[p + 1] * x[col[p + 1]];
  }
  if (p < end) even += val[p] * x[col[p]];
  return even + odd;
}

// ---- CPU variants (spmv_cpu.cpp) ------------------------------------------------------------------
std::unique_ptr<Instance> make_cpu_csr(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cpu_stencil(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cpu_spmm_csr(const Problem&, const RunContext&);

// ---- CUDA variants (spmv_cuda.cu) -----------------------------------------------------------------
std::unique_ptr<Instance> make_cuda_cusparse_csr(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cuda_csr(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cuda_stencil(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cuda_cusparse_spmm(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cuda_spmm_csr(const Problem&, const RunContext&);

}  // namespace tb::spmv

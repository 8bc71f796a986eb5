// The sparse operator of the SEM Cayley propagator (docs/sources.md#000-sem-v55): a graph Laplacian L, k neighbours per
// node ("5-8 neighbors per dimension", laplacian_sparsity 8) or a 2D/3D grid, shifted to
// A = I + alpha L, symmetric positive definite for alpha >= 0 (L is positive semi-definite, so every
// eigenvalue of A is at least 1). Deterministic: a graph depends only on (family, k, n, seed), so a
// reference can rebuild it. Stages `spmv` and `cg` share it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/host_buffer.h"
#include "runtime/random.h"

namespace tb::laplacian {

enum class Family {
  ring,    // node i linked to i+-1 .. i+-k/2 (mod n), and for odd k to the node opposite (i +- n/2)
  random,  // k/2 random Hamiltonian cycles (+ a random perfect matching for odd k): unstructured
  grid2d,  // 5-point grid, nx = round(sqrt(n)) wide, the last row partial
  grid3d,  // 7-point grid, nx = ny = round(cbrt(n)), the last plane partial
};

struct GraphSpec {
  Family family = Family::ring;
  int k = 8;                 // neighbours per node: 4..8 for ring and random, 4 for grid2d, 6 for grid3d
  std::string name() const;  // "ring8", "random5", "grid2d"
};

// Every graph name the `graph` axes accept: ring4..ring8, random4..random8, grid2d, grid3d.
std::vector<std::string> graph_names();
GraphSpec parse_graph(const std::string& name);  // throws UsageError

inline constexpr uint64_t graph_seed = 21;

// Stored nonzeros of A (diagonal included): exact for ring and grid graphs; for random graphs
// n (k+1) minus the rare duplicate edges of the cycles (exact when n is small).
int64_t nnz(const GraphSpec& spec, int64_t n);

// Empty when a graph of n nodes can be stored in 32-bit CSR, else why not.
std::string csr_unsupported(const GraphSpec& spec, int64_t n);

// The matrix-free form of A for ring and grid graphs: everything a stencil kernel needs, by value.
struct Stencil {
  Family family = Family::ring;
  int64_t n = 0;
  double alpha = 0;
  int half = 0;            // ring: offsets 1..half
  int64_t opposite = 0;    // ring with odd k: i is linked to i +- opposite (n/2); 0 when none
  int64_t nx = 1, ny = 1;  // grids
};

// Empty when the graph has a stencil form (ring with n >= k + 3, so that no two offsets meet;
// grids), else why not.
std::string stencil_unsupported(const GraphSpec& spec, int64_t n);

class Graph {
 public:
  Graph(GraphSpec spec, int64_t n, uint64_t seed = graph_seed);
  const GraphSpec& spec() const { return spec_; }
  int64_t rows() const { return n_; }
  // Neighbours of node i: sorted, distinct, never i. The relation is symmetric.
  void neighbours(int64_t i, std::vector<int32_t>& out) const;
  Stencil stencil(double alpha) const;  // requires stencil_unsupported(...) to be empty
  int64_t nx() const { return nx_; }
  int64_t ny() const { return ny_; }

 private:
  GraphSpec spec_;
  int64_t n_;
  int64_t nx_ = 1, ny_ = 1;
  // random: per cycle (and the matching) the node order and each node's position in it
  std::vector<std::vector<int32_t>> order_, position_;
};

// A = I + alpha L in CSR with 32-bit indices, columns sorted within a row (the diagonal among them).
// Filled row-parallel with OpenMP's static schedule, so a CPU kernel with the same schedule finds its
// rows in its own pages.
struct Csr {
  int64_t n = 0;
  int64_t nnz = 0;
  HostBuffer<int32_t> row_ptr;  // n + 1
  HostBuffer<int32_t> col;      // nnz
  HostBuffer<double> val;       // nnz
};
Csr build_shifted_laplacian(const Graph& graph, double alpha);

// ---- the oracle: plain loops over the graph's definition, no CSR -------------------------------------
// y = (I + alpha L) x; `scale` (optional) receives sum_j |a_ij x_j| per row, the rounding scale.
void reference_apply(const Graph& graph, double alpha, const double* x, double* y, double* scale = nullptr);
// The dense n x n matrix (row-major), for small n only: the oracle of the oracle in tests.
std::vector<double> dense_shifted_laplacian(const Graph& graph, double alpha);

// One row of A x from a stencil: the same arithmetic on the CPU and in CUDA kernels. Neighbours that
// fall off a grid are absent (their degree is smaller); the ring wraps around.
TB_HOST_DEVICE inline double stencil_row(const Stencil& s, const double* __restrict__ x, int64_t i) {
  double sum = 0;
  int degree = 0;
  if (s.family == Family::ring) {
    for (int d = 1; d <= s.half; ++d) {
      const int64_t up = i + d >= s.n ? i + d - s.n : i + d;
      const int64_t down = i - d < 0 ? i - d + s.n : i - d;
      sum += x[up] + x[down];
    }
    degree = 2 * s.half;
    if (s.opposite) {
      const int64_t m = s.opposite;
      const int64_t j = i < m ? i + m : (i < 2 * m ? i - m : -1);  // odd n: node 2m has no partner
      if (j >= 0) {
        sum += x[j];
        ++degree;
      }
    }
  } else {
    // Graphs hold at most 2^31 - 1 nodes: 32-bit division, several times cheaper on a GPU.
    const int64_t nx = s.nx;
    const auto i32 = static_cast<uint32_t>(i), nx32 = static_cast<uint32_t>(nx);
    const int64_t px = i32 % nx32;
    if (px > 0) {
      sum += x[i - 1];
      ++degree;
    }
    if (px < nx - 1 && i + 1 < s.n) {
      sum += x[i + 1];
      ++degree;
    }
    if (s.family == Family::grid2d) {
      if (i - nx >= 0) {
        sum += x[i - nx];
        ++degree;
      }
      if (i + nx < s.n) {
        sum += x[i + nx];
        ++degree;
      }
    } else {
      const int64_t plane = nx * s.ny;
      const int64_t py = (i32 / nx32) % static_cast<uint32_t>(s.ny);
      if (py > 0) {
        sum += x[i - nx];
        ++degree;
      }
      if (py < s.ny - 1 && i + nx < s.n) {
        sum += x[i + nx];
        ++degree;
      }
      if (i - plane >= 0) {
        sum += x[i - plane];
        ++degree;
      }
      if (i + plane < s.n) {
        sum += x[i + plane];
        ++degree;
      }
    }
  }
  return (1.0 + s.alpha * degree) * x[i] - s.alpha * sum;
}

}  // namespace tb::laplacian

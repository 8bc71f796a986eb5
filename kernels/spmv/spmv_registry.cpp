// Stage `spmv`: the propagator's sparse matvec against the bandwidth floor. Sizes in
// runtime/defaults.h (from docs/sources.md#000-sem-v55), the bytes model in spmv.h.
#include "runtime/defaults.h"
#include "runtime/device_info.h"
#include "spmv/spmv.h"

namespace tb {

namespace {

using namespace spmv;

std::string str(int64_t v) { return std::to_string(v); }

struct Size {
  laplacian::GraphSpec graph;
  double n, nnz, rhs;
};
Size size_of(const Problem& p) {
  const Shape s = shape_of(p);
  return Size{s.graph, static_cast<double>(s.rows), static_cast<double>(laplacian::nnz(s.graph, s.rows)),
              static_cast<double>(s.rhs)};
}

const char* peak_key(Backend b) { return b == Backend::cuda ? "cuda.copy" : "cpu.memory"; }

// CSR: 12 B per nonzero, 4 B per row pointer, x read once and y written once (8 B each per row and
// right-hand side).
Work csr_work(const Problem& p, Backend b) {
  const Size s = size_of(p);
  return Work{12.0 * s.nnz + 4.0 * (s.n + 1) + 16.0 * s.n, 2.0 * s.nnz, Work::Bound::memory, peak_key(b), {{"nnz", s.nnz}}};
}

Work spmm_work(const Problem& p, Backend b) {
  const Size s = size_of(p);
  return Work{12.0 * s.nnz + 4.0 * (s.n + 1) + 16.0 * s.n * s.rhs,
              2.0 * s.nnz * s.rhs,
              Work::Bound::memory,
              peak_key(b),
              {{"nnz", s.nnz}}};
}

// The stencil does the same arithmetic (so its FLOP/s compare) but moves only x and y.
Work stencil_work(const Problem& p, Backend b) {
  const Size s = size_of(p);
  return Work{16.0 * s.n, 2.0 * s.nnz, Work::Bound::memory, peak_key(b), {{"nnz", s.nnz}}};
}

// Host memory a variant needs: the graph (random graphs keep their cycles), the CSR, x and y, and
// the check's reference arrays.
double host_bytes(const Size& s, bool csr) {
  const double graph = s.graph.family == laplacian::Family::random ? 8.0 * s.n * (s.graph.k / 2 + 1) : 0.0;
  return graph + (csr ? 12.0 * s.nnz + 4.0 * s.n : 0.0) + 16.0 * s.n * s.rhs + 24.0 * s.n * s.rhs;
}

std::string cpu_reason(const Problem& p, bool csr) {
  const Size s = size_of(p);
  if (csr) {
    if (auto why = laplacian::csr_unsupported(s.graph, static_cast<int64_t>(s.n)); !why.empty()) return why;
  } else if (auto why = laplacian::stencil_unsupported(s.graph, static_cast<int64_t>(s.n)); !why.empty()) {
    return why;
  }
  return host_memory_reason(host_bytes(s, csr));
}

std::string cuda_reason(const Problem& p, bool csr) {
  if (auto why = cpu_reason(p, csr); !why.empty()) return why;
  const Size s = size_of(p);
  // cuSPARSE's workspace is small next to the matrix; a quarter of it is room enough.
  return device_memory_reason((csr ? 1.25 * (12.0 * s.nnz + 4.0 * s.n) : 0.0) + 16.0 * s.n * s.rhs);
}

}  // namespace

void register_stage_spmv(Registry& registry) {
  Stage s;
  s.name = "spmv";
  s.question = "the cost of the propagator's sparse matvec (and SpMM over many tokens) against the bandwidth floor";
  s.source = "docs/sources.md#000-sem-v55 (Cayley propagator: sparse Laplacian, 5-8 neighbours, laplacian_sparsity 8)";
  s.axes = {
      Axis{"graph",
           AxisKind::choice,
           {"ring" + str(defaults::laplacian_sparsity), "random" + str(defaults::laplacian_sparsity), "grid3d"},
           {"ring" + str(defaults::laplacian_sparsity)},
           "ringK: i linked to its K nearest on a circle; randomK: K/2 random Hamiltonian cycles (unstructured); "
           "grid2d / grid3d: 5- and 7-point grids (K = 4..8)",
           laplacian::graph_names()},
      Axis{"rows",
           AxisKind::positive_int,
           {str(defaults::spmv_rows), str(defaults::spmv_rows_large)},
           {str(defaults::quick_spmv_rows)},
           "rows (nodes) of A = I + alpha L",
           {}},
      Axis{"rhs",
           AxisKind::positive_int,
           {str(defaults::spmm_rhs)},
           {str(defaults::quick_spmm_rhs)},
           "right-hand sides of the SpMM variants (tokens whose hidden vectors the operator is applied to)",
           {}},
  };
  const std::vector<std::string> vector_axes{"graph", "rows"}, block_axes{"graph", "rows", "rhs"};
  auto work = [](auto model, Backend b) { return [model, b](const Problem& p) { return model(p, b); }; };
  auto reason = [](bool cuda, bool csr) {
    return [cuda, csr](const Problem& p) { return cuda ? cuda_reason(p, csr) : cpu_reason(p, csr); };
  };

  s.variants = {
      Variant{"csr", Backend::cpu, "OpenMP CSR loop: the general sparse matvec on the CPU", vector_axes,
              work(csr_work, Backend::cpu), reason(false, true), make_cpu_csr, ""},
      Variant{"stencil", Backend::cpu, "matrix-free stencil: the neighbours are index arithmetic, 16 B per row", vector_axes,
              work(stencil_work, Backend::cpu), reason(false, false), make_cpu_stencil, ""},
      Variant{"spmm_csr", Backend::cpu, "CSR times a row-major block of right-hand sides: the matrix read once for all",
              block_axes, work(spmm_work, Backend::cpu), reason(false, true), make_cpu_spmm_csr, ""},

      Variant{"cusparse_csr", Backend::cuda, "cuSPARSE SpMV (generic API, CSR): the library baseline", vector_axes,
              work(csr_work, Backend::cuda), reason(true, true), cuda_factory(make_cuda_cusparse_csr), ""},
      Variant{"csr", Backend::cuda, "own CSR kernel, a group of lanes per row sized to the row length", vector_axes,
              work(csr_work, Backend::cuda), reason(true, true), cuda_factory(make_cuda_csr), ""},
      Variant{"stencil", Backend::cuda, "matrix-free stencil kernel: only x and y move", vector_axes,
              work(stencil_work, Backend::cuda), reason(true, false), cuda_factory(make_cuda_stencil), ""},
      Variant{"cusparse_spmm", Backend::cuda, "cuSPARSE SpMM (generic API, CSR, row-major dense blocks)", block_axes,
              work(spmm_work, Backend::cuda), reason(true, true), cuda_factory(make_cuda_cusparse_spmm), ""},
      Variant{"spmm_csr", Backend::cuda, "own CSR SpMM, one output entry per thread, columns across lanes", block_axes,
              work(spmm_work, Backend::cuda), reason(true, true), cuda_factory(make_cuda_spmm_csr), ""},
  };
  s.pairs = {
      Pair{"csr", "stencil", "stencil vs CSR"},
      Pair{"cusparse_csr", "csr", "own CSR kernel vs cuSPARSE SpMV"},
      Pair{"cusparse_spmm", "spmm_csr", "own CSR SpMM vs cuSPARSE SpMM"},
  };
  registry.add(std::move(s));
}

}  // namespace tb

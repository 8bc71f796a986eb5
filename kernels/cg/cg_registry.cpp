// Stage `cg`: host-checked vs device-resident CG, each started cold, warm, or warm with the lazy gate,
// over a window of drifting right-hand sides; and the training step's own solve (rows.h: a batch of
// ring-lattice rows) started the same three ways. Sizes in runtime/defaults.h (from docs/sources.md#000-sem-v55) and
// defaults::cg_rows_* (from sem_v55), the model in cg.h.
#include <cstdio>

#include "cg/cg.h"
#include "runtime/defaults.h"
#include "runtime/device_info.h"

namespace tb {

namespace {

std::string str(int64_t v) { return std::to_string(v); }
std::string str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// No GB/s: a solve's traffic is known only once it ran (cg.h). The FLOPs are the floor, one matvec
// per solve; the counters carry what happened.
Work cg_work(const Problem& p) {
  const cg::Settings s = cg::settings_of(p);
  const double nnz = static_cast<double>(laplacian::nnz(s.graph, s.rows));
  return Work{0.0, 2.0 * nnz * s.window, Work::Bound::memory, "", {{"solves", static_cast<double>(s.window)}}};
}

struct Footprint {
  double host, device;
};
Footprint footprint(const cg::Settings& s) {
  const double n = static_cast<double>(s.rows), nnz = static_cast<double>(laplacian::nnz(s.graph, s.rows));
  const double graph = s.graph.family == laplacian::Family::random ? 8.0 * n * (s.graph.k / 2 + 1) : 0.0;
  const double csr = 12.0 * nnz + 4.0 * n, rhs = 8.0 * n * (s.window + 1), vectors = 5 * 8.0 * n;
  return Footprint{graph + csr + rhs + vectors + 2 * 8.0 * n, csr + rhs + vectors};
}

std::string problem_reason(const Problem& p) {
  const cg::Settings s = cg::settings_of(p);
  if (!(s.alpha >= 0)) return "alpha must be >= 0 (then A = I + alpha L is symmetric positive definite)";
  if (!(s.drift >= 0)) return "drift must be >= 0";
  if (auto why = laplacian::csr_unsupported(s.graph, s.rows); !why.empty()) return why;
  return host_memory_reason(footprint(s).host);
}

std::string cuda_reason(const Problem& p) {
  if (auto why = problem_reason(p); !why.empty()) return why;
  return device_memory_reason(footprint(cg::settings_of(p)).device);
}

// ---- the propagator's rows (rows.h) ----------------------------------------------------------------

// No GB/s, as for one system: the FLOPs are the floor, one matvec (2 (k + 1) per unknown, as the
// CSR form's nnz counts them) per batch solved; the counters carry what happened.
Work rows_work(const Problem& p) {
  const cg::RowsSettings s = cg::rows_settings_of(p);
  const double unknowns = static_cast<double>(s.system.rows) * static_cast<double>(s.system.width);
  return Work{0.0,
              2.0 * static_cast<double>(s.system.neighbours + 1) * unknowns * s.window,
              Work::Bound::memory,
              "",
              {{"solves", static_cast<double>(s.window)}, {"systems_per_solve", static_cast<double>(s.system.rows)}}};
}

// The window's batches, x, the cache, b_0's solution and the workspace, in float; the host also keeps
// the batches (built there) and a solution read back for the check.
Footprint rows_footprint(const cg::RowsSettings& s) {
  const double n = static_cast<double>(s.system.rows) * static_cast<double>(s.system.width);
  const double buffers = 4.0 * (n * (s.window + 1) + 3 * n +
                                static_cast<double>(cg::rows_workspace(s.system.rows, s.system.width)));
  return Footprint{buffers + 4.0 * n, buffers};
}

std::string rows_problem_reason(const Problem& p) {
  const cg::RowsSettings s = cg::rows_settings_of(p);
  if (!(s.drift >= 0)) return "drift must be >= 0";
  if (s.system.width <= s.system.neighbours)
    return "the ring joins each feature to its " + str(s.system.neighbours) + " nearest: the width must be above " +
           str(s.system.neighbours) + " (as the step's workloads require)";
  return "";
}

std::string rows_cpu_reason(const Problem& p) {
  if (auto why = rows_problem_reason(p); !why.empty()) return why;
  return host_memory_reason(rows_footprint(cg::rows_settings_of(p)).host);
}

std::string rows_cuda_reason(const Problem& p) {
  if (auto why = rows_problem_reason(p); !why.empty()) return why;
  const cg::RowsSettings s = cg::rows_settings_of(p);
  if (s.system.rows > int64_t{0x7fffffff})
    return "one block per row: " + str(s.system.rows) + " tokens are above the grid's 2^31 - 1";
  if (auto why = host_memory_reason(rows_footprint(s).host); !why.empty()) return why;
  return device_memory_reason(rows_footprint(s).device);
}

InstanceFactory cpu_rows(cg::Start start) {
  return [start](const Problem& p, const RunContext& c) { return cg::make_cpu_rows(p, c, start); };
}

InstanceFactory cuda_rows([[maybe_unused]] cg::Start start) {
  return cuda_factory([start](const Problem& p, const RunContext& c) { return cg::make_cuda_rows(p, c, start); });
}

InstanceFactory cpu_solver(cg::Start start) {
  return [start](const Problem& p, const RunContext& c) { return cg::make_cpu_host_checked(p, c, start); };
}

InstanceFactory cuda_solver([[maybe_unused]] cg::Strategy strategy, [[maybe_unused]] cg::Start start) {
  return cuda_factory(
      [strategy, start](const Problem& p, const RunContext& c) { return cg::make_cuda_solver(p, c, strategy, start); });
}

}  // namespace

void register_stage_cg(Registry& registry) {
  using cg::Start;
  using cg::Strategy;
  Stage s;
  s.name = "cg";
  s.question =
      "whether the lazy CG gate's claimed 30-50% skips and ~2x hold, and what per-iteration syncs cost, on "
      "one system and on the training step's own batch of per-token solves";
  s.source =
      "docs/sources.md#000-sem-v55 (lazy CG: 1-matvec residual gate, lazy_cg_tol 1e-6, 'Expected skip rate: 30-50%', '~2x')";
  std::vector<std::string> drifts(std::begin(defaults::cg_drifts), std::end(defaults::cg_drifts));
  s.axes = {
      Axis{"graph",
           AxisKind::choice,
           {"ring" + str(int64_t{defaults::laplacian_sparsity})},
           {},
           "the Laplacian's graph (see spmv): ringK, randomK, grid2d, grid3d",
           laplacian::graph_names()},
      Axis{"rows",
           AxisKind::positive_int,
           {str(defaults::cg_rows), str(defaults::cg_rows_large)},
           {str(defaults::quick_cg_rows)},
           "unknowns of (I + alpha L) x = b",
           {}},
      Axis{"alpha",
           AxisKind::number,
           {str(defaults::laplacian_alpha)},
           {},
           "the shift's scale: A = I + alpha L, condition number up to 1 + 2 k alpha",
           {}},
      Axis{"drift",
           AxisKind::number,
           drifts,
           {},
           "relative change of b (of each row of it, rows_*) per solve (each step 0.5x..1.5x of it); the gate skips "
           "below lazy_cg_tol = 1e-6",
           {}},
      Axis{"rows_shape",
           AxisKind::text,
           {defaults::cg_rows_shape},
           {defaults::quick_cg_rows_shape},
           "TOKENSxWIDTH of the propagator's rows (rows_*): a micro-batch's tokens, each a system over d_model "
           "features; ring k = " +
               str(defaults::cg_rows_neighbours) + ", alpha " + str(defaults::cg_rows_alpha) + ", tol " +
               str(defaults::cg_rows_tol) + " (sem_v55's propagator)",
           {},
           cg::rows_shape_invalid_reason},
  };
  const std::vector<std::string> axes{"graph", "rows", "alpha", "drift"};
  const std::vector<std::string> rows_axes{"rows_shape", "drift"};
  s.variants = {
      Variant{"host_checked", Backend::cpu, "OpenMP CG from x = 0 every solve: the propagator without lazy CG", axes,
              cg_work, problem_reason, cpu_solver(Start::cold), ""},
      Variant{"host_checked_warm", Backend::cpu,
              "warm start from the cached solution, always solved to tol: the gate's warm start without its skip", axes,
              cg_work, problem_reason, cpu_solver(Start::warm), ""},
      Variant{"host_checked_lazy", Backend::cpu, "the lazy gate: warm start from the cache, skip below 1e-6", axes, cg_work,
              problem_reason, cpu_solver(Start::lazy), ""},

      Variant{"rows_cold", Backend::cpu, "the step's propagator solve (rows.h) from x = 0 every batch: its backward solve",
              rows_axes, rows_work, rows_cpu_reason, cpu_rows(Start::cold), ""},
      Variant{"rows_warm", Backend::cpu, "the propagator solve warm from the cache, never skipped: its forward, lazy_cg off",
              rows_axes, rows_work, rows_cpu_reason, cpu_rows(Start::warm), ""},
      Variant{"rows_lazy", Backend::cpu, "the propagator solve with the gate on the total residual: its forward, lazy_cg on",
              rows_axes, rows_work, rows_cpu_reason, cpu_rows(Start::lazy), ""},

      Variant{"host_checked", Backend::cuda, "a kernel per phase, the residual norm read back every iteration", axes,
              cg_work, cuda_reason, cuda_solver(Strategy::host_checked, Start::cold), ""},
      Variant{"host_checked_warm", Backend::cuda, "host-checked, warm-started from the cache, never skipped", axes, cg_work,
              cuda_reason, cuda_solver(Strategy::host_checked, Start::warm), ""},
      Variant{"host_checked_lazy", Backend::cuda, "host-checked with the lazy gate (its verdict read back)", axes, cg_work,
              cuda_reason, cuda_solver(Strategy::host_checked, Start::lazy), ""},
      Variant{"graph", Backend::cuda,
              str(int64_t{defaults::cg_check_every}) +
                  " iterations per CUDA graph replay, convergence tested on the device, read after each replay",
              axes, cg_work, cuda_reason, cuda_solver(Strategy::graph, Start::cold), ""},
      Variant{"graph_warm", Backend::cuda, "graph-replayed CG warm-started from the cache, never skipped", axes, cg_work,
              cuda_reason, cuda_solver(Strategy::graph, Start::warm), ""},
      Variant{"graph_lazy", Backend::cuda, "graph-replayed CG with the lazy gate", axes, cg_work, cuda_reason,
              cuda_solver(Strategy::graph, Start::lazy), ""},
      Variant{"persistent", Backend::cuda, "one cooperative kernel per solve, grid barriers, no host sync at all", axes,
              cg_work, cuda_reason, cuda_solver(Strategy::persistent, Start::cold), ""},
      Variant{"persistent_warm", Backend::cuda, "the persistent kernel warm-started from the cache, never skipped", axes,
              cg_work, cuda_reason, cuda_solver(Strategy::persistent, Start::warm), ""},
      Variant{"persistent_lazy", Backend::cuda, "the persistent kernel with the gate decided on the device", axes, cg_work,
              cuda_reason, cuda_solver(Strategy::persistent, Start::lazy), ""},
      Variant{"rows_cold", Backend::cuda,
              "the step's propagator solve on the GPU from x = 0: a block per row, a read per iteration", rows_axes,
              rows_work, rows_cuda_reason, cuda_rows(Start::cold), ""},
      Variant{"rows_warm", Backend::cuda, "the GPU propagator solve warm from the cache, never skipped", rows_axes,
              rows_work, rows_cuda_reason, cuda_rows(Start::warm), ""},
      Variant{"rows_lazy", Backend::cuda, "the GPU propagator solve with the gate (the step's forward, lazy_cg on)",
              rows_axes, rows_work, rows_cuda_reason, cuda_rows(Start::lazy), ""},
  };
  // The report's lazy gate is a warm start and a skip at once: per strategy, what the warm start buys
  // over a cold one, then what the gate adds to the warm start alone, set against the gate model's
  // prediction (the lazy row's predicted_ns over the warm row's measured time).
  s.pairs = {
      Pair{"host_checked", "host_checked_warm", "warm start vs cold start (host-checked)"},
      Pair{"host_checked_warm", "host_checked_lazy", "gate vs warm start alone (host-checked)", {}, "predicted_ns"},
      Pair{"graph", "graph_warm", "warm start vs cold start (graph)"},
      Pair{"graph_warm", "graph_lazy", "gate vs warm start alone (graph)", {}, "predicted_ns"},
      Pair{"persistent", "persistent_warm", "warm start vs cold start (persistent)"},
      Pair{"persistent_warm", "persistent_lazy", "gate vs warm start alone (persistent)", {}, "predicted_ns"},
      Pair{"host_checked", "graph", "device-resident (graph) vs host-checked"},
      Pair{"host_checked", "persistent", "device-resident (persistent) vs host-checked"},
      Pair{"host_checked_lazy", "graph_lazy", "device-resident (graph) vs host-checked, lazy"},
      Pair{"host_checked_lazy", "persistent_lazy", "device-resident (persistent) vs host-checked, lazy"},
      // The step's propagator: its forward solves lazily (or warm with lazy_cg off), its backward cold.
      Pair{"rows_cold", "rows_lazy", "rows: lazy gate vs cold (the step's forward solve vs its backward one)"},
      Pair{"rows_cold", "rows_warm", "rows: warm start vs cold start"},
      Pair{"rows_warm", "rows_lazy", "rows: gate vs warm start alone (the step's lazy_cg switch)"},
  };
  registry.add(std::move(s));
}

}  // namespace tb

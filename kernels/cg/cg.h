// Stage `cg`: solve (I + alpha L) x = b (spmv/laplacian.h) by conjugate gradients, the way the SEM
// Cayley propagator does (docs/sources.md#000-sem-v55), over a window of right-hand sides that drift between steps.
//
// Strategies: host-checked (the residual norm is read back every iteration: one sync each), and on
// CUDA device-resident ones (the convergence flag is read every k iterations of a captured CUDA
// graph, or never: one persistent cooperative kernel runs the whole solve). Each starts its solves
// one of three ways (Start): cold, from x = 0, as the propagator does without lazy CG ("Without lazy
// CG: 5 CG iterations x 3 matvecs ... per forward"); warm, from the previous solution kept as a
// cache, its residual for the new b taken with one matvec, then CG to tol; lazy, the report's gate:
// the warm start, but the solve is skipped when that relative residual is below lazy_cg_tol (1e-6).
// The lazy gate of the report is both a warm start and a skip; the pairs take them apart: warm vs
// cold is what the warm start buys, lazy vs warm what the gate alone buys.
//
// One timed call is one window: the cache is set back to the solution of b_0 and the S right-hand
// sides b_1..b_S are solved in turn, so every call does the same work and the skip rate is a fact of
// the window, not of the sample. Each b_t moves from b_{t-1} by drift x (0.5..1.5, stratified over
// the window) of its norm in a random direction: `drift` is the knob, the skip rate what it yields.
//
// Work model: a solve's traffic depends on how many iterations it takes, known only when it ran, so
// a row carries no GB/s; its FLOPs are the floor (one matvec per solve) and the row's counters say
// what happened: skip rate, matvecs and iterations per solve, the worst final relative residual, and
// the gate's prediction time(lazy) = S x (time(gate) + (1 - skip) x time(full solve)), its parts
// timed separately after the samples (predicted_ns). The pair "gate vs warm start alone" sets that
// prediction against the warm variant: time(warm) / predicted time(lazy) is the speedup the model
// predicts for the gate, shown beside the measured one.
//
// The propagator's form (rows.h, the variants rows_*): the solve the training step runs, a batch of
// ring-lattice systems, one per token, with the gate on the batch's total residual; same window idea,
// each row of b drifting by its own norm.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cg/rows.h"
#include "runtime/host_buffer.h"
#include "runtime/registry.h"
#include "spmv/laplacian.h"

namespace tb::cg {

inline constexpr uint64_t seed_rhs = 41;

struct Settings {
  laplacian::GraphSpec graph;
  int64_t rows = 0;
  double alpha = 0;
  double drift = 0;
  int window = 0;       // solves per call (defaults::cg_window)
  double tol = 0;       // CG stops at ||r|| <= tol ||b|| (defaults::cg_tol)
  double lazy_tol = 0;  // the gate skips at ||b - A x_cache|| < lazy_tol ||b|| (defaults::lazy_cg_tol)
  int max_iterations = 0;
};
Settings settings_of(const Problem& p);  // axes graph, rows, alpha, drift; the rest from defaults

// b_0 .. b_S of one window, built once on the host (every backend solves the same sequence).
class RhsSequence {
 public:
  RhsSequence(int64_t n, double drift, int steps);
  const double* b(int t) const { return data_.data() + static_cast<std::size_t>(t) * static_cast<std::size_t>(n_); }
  int steps() const { return steps_; }
  int64_t n() const { return n_; }
  // ||b_t - b_{t-1}|| / ||b_{t-1}|| as drawn for step t (1..S).
  double drift_of(int t) const { return drift_[static_cast<std::size_t>(t)]; }

 private:
  int64_t n_;
  int steps_;
  HostBuffer<double> data_;
  std::vector<double> drift_;
};

// How every solve of a window starts.
enum class Start {
  cold,  // x = 0: r = b, no matvec
  warm,  // x from the cache (the previous solution): r = b - A x, one matvec; then CG to tol, never skipped
  lazy,  // the warm start, and the gate: skip the solve when ||r|| < lazy_tol ||b||
};

// What the solves so far did, summed.
struct Tally {
  int64_t solves = 0, skips = 0, iterations = 0, matvecs = 0, syncs = 0;
  double worst_residual = 0;  // the largest relative residual a solve ended with (the solver's own)
};

// ---- reference: the true residual of a solution, from the graph's definition (no CSR) --------------
// ||b - A x|| / ||b||, in double with plain loops.
double true_relative_residual(const laplacian::Graph& graph, double alpha, const double* b, const double* x);
// Passes when the true relative residual of step `step` is at most tol + tolerance::cg_residual_atol.
Verdict check_solve(const laplacian::Graph& graph, double alpha, const double* b, const double* x, double tol, int step,
                    bool skipped);

// The window loop, the check and the counters, shared by every strategy. A strategy supplies its
// parts: the cache reset, `start` (the cold start x = 0, the warm start's residual, or that and the
// gate) and `finish` (CG iterations to the tolerance), and `step` (what run() times: start then
// finish, fused where the strategy fuses them).
class WindowSolver : public Instance {
 public:
  void run() final;
  // Replays one window step by step and checks every solve's true residual: below lazy_tol for a
  // skipped solve, below tol for a solved one; only the lazy start may skip.
  Verdict check() final;
  std::vector<std::pair<std::string, double>> observed() const final;
  // x after the last step (synchronises).
  virtual std::vector<double> solution() = 0;
  // Totals since construction (synchronises).
  virtual Tally tally() = 0;

 protected:
  WindowSolver(const Problem& p, Start start);
  // Warm and lazy solves start from the cache, set to b_0's solution when the solver is built and
  // restored at the start of every window.
  bool starts_from_cache() const { return start_ != Start::cold; }
  virtual void begin_window() = 0;
  virtual void step(int t) {
    start(t);
    if (!started_done()) finish(t);
  }
  // The cold start x = 0, the warm start's residual, or that and the gate (lazy); a strategy whose
  // pattern reads the gate's verdict back reads it here.
  virtual void start(int t) = 0;
  // After start: whether the solve is already done (the gate skipped it, or b = 0, or a warm start
  // already within tol). May synchronise.
  virtual bool started_done() = 0;
  virtual void finish(int t) = 0;
  // Seconds `part` takes on this backend's clock (CUDA: events on the stream, after a sync).
  virtual double time_part(const std::function<void()>& part) = 0;

  Settings settings_;
  Start start_;
  laplacian::Graph graph_;
  RhsSequence rhs_;
  bool counts_syncs_ = false;  // CUDA strategies: report host syncs per solve

 private:
  // The gate's prediction: one window replayed with its parts timed apart.
  std::vector<std::pair<std::string, double>> measure_parts(const Tally& timed);
};

// ---- CPU variants (cg_cpu.cpp) --------------------------------------------------------------------
std::unique_ptr<Instance> make_cpu_host_checked(const Problem&, const RunContext&, Start start);

// ---- CUDA variants (cg_cuda.cu) -------------------------------------------------------------------
enum class Strategy { host_checked, graph, persistent };
std::unique_ptr<Instance> make_cuda_solver(const Problem&, const RunContext&, Strategy strategy, Start start);

// ---- the propagator's form (rows.h): rows_cold, rows_warm, rows_lazy -------------------------------
// solve_rows over a window of drifting batches [N, C], in float as the step runs it, started the three
// ways of Start: cold as the step's backward solve (x = 0), warm as its forward with lazy_cg off (from
// the cache), lazy as its forward with lazy_cg on (the gate). The cache is set back to b_0's solution
// at the start of every window, so every call takes the same decisions.
// Sizes and the solver's settings: defaults::cg_rows_*; the float residual's allowance:
// tolerance::cg_rows_residual_fp32_atol.

struct RowsShape {
  int64_t tokens = 0, width = 0;
};
RowsShape parse_rows_shape(const std::string& text);             // "TOKENSxWIDTH"; throws UsageError
std::string rows_shape_invalid_reason(const std::string& text);  // "" when valid

struct RowsSettings {
  RowSystems system;
  double drift = 0;
  int window = 0;  // batches solved per call (defaults::cg_window)
};
RowsSettings rows_settings_of(const Problem& p);  // axes rows_shape, drift; the rest from defaults::cg_rows_*

// b_0 .. b_S of one window, each [N, C] in float. Row n of b_t moves from row n of b_{t-1} by
// drift_of(t) of that row's norm in a random direction, drift_of(t) stratified as RhsSequence's.
class RowsRhs {
 public:
  RowsRhs(int64_t rows, int64_t width, double drift, int steps);
  const float* b(int t) const { return data_.data() + static_cast<std::size_t>(t) * static_cast<std::size_t>(n_); }
  int steps() const { return steps_; }
  int64_t elements() const { return n_; }  // N x C per batch
  double drift_of(int t) const { return drift_[static_cast<std::size_t>(t)]; }

 private:
  int64_t n_;
  int steps_;
  HostBuffer<float> data_;
  std::vector<double> drift_;
};

// Drift of each step 1..steps of a window: drift x (0.5 + (j + 1/2) / steps), j = 0..steps-1, in a
// seeded order (index 0 unused). Shared by RhsSequence and RowsRhs.
std::vector<double> window_drifts(double drift, int steps);

// ---- reference: the true residual of every row, from the definition, in double ---------------------
// ||b_n - A x_n|| / ||b_n|| of one row (||r_n|| when b_n = 0).
template <class T>
double true_row_residual(const RowSystems& s, const T* b_row, const T* x_row);
// sqrt(sum_n ||b_n - A x_n||^2 / sum_n ||b_n||^2): what the gate promises for a skipped solve.
template <class T>
double true_total_residual(const RowSystems& s, const T* b, const T* x);
// A solved step passes when every row's true relative residual is at most tol + atol; a skipped one
// when the total is at most lazy_tol + atol (the gate tests the total, not each row).
template <class T>
Verdict check_rows(const RowSystems& s, const T* b, const T* x, bool skipped, int step, double atol);

// The window loop, the check and the counters of the rows variants; a backend supplies the buffers.
class RowsWindow : public Instance {
 public:
  void run() final;
  // Replays one window batch by batch and checks every solution against its tolerance; only the
  // lazy start may skip.
  Verdict check() final;
  std::vector<std::pair<std::string, double>> observed() const final;
  // x after the last batch (synchronises).
  virtual std::vector<float> solution() = 0;
  // What the timed windows did (check()'s replays not included).
  const RowStats& stats() const { return stats_; }

 protected:
  RowsWindow(const Problem& p, Start start);
  bool starts_from_cache() const { return start_ != Start::cold; }
  // The cache set back to b_0's solution (warm and lazy).
  virtual void begin_window() = 0;
  // solve_rows for b_t, started start_'s way.
  virtual RowStats solve(int t) = 0;

  RowsSettings settings_;
  Start start_;
  RowsRhs rhs_;

 private:
  RowStats stats_;
};

std::unique_ptr<Instance> make_cpu_rows(const Problem&, const RunContext&, Start start);   // cg_rows_cpu.cpp
std::unique_ptr<Instance> make_cuda_rows(const Problem&, const RunContext&, Start start);  // cg_cuda.cu

}  // namespace tb::cg

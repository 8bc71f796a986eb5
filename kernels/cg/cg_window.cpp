// The window loops the `cg` variants share: run, the per-solve check, and the counters (with the
// gate's prediction for one system; for the propagator's rows, the solver's own statistics).
#include <algorithm>

#include "cg/cg.h"
#include "runtime/defaults.h"
#include "runtime/tolerance.h"

namespace tb::cg {

WindowSolver::WindowSolver(const Problem& p, Start start)
    : settings_(settings_of(p)),
      start_(start),
      graph_(settings_.graph, settings_.rows),
      rhs_(settings_.rows, settings_.drift, settings_.window) {}

void WindowSolver::run() {
  begin_window();
  for (int t = 1; t <= settings_.window; ++t) step(t);
}

Verdict WindowSolver::check() {
  begin_window();
  double worst = 0;
  for (int t = 1; t <= settings_.window; ++t) {
    const Tally before = tally();
    step(t);
    const Tally after = tally();
    if (after.solves != before.solves + 1)
      return Verdict{false, worst,
                     "step " + std::to_string(t) + " recorded " + std::to_string(after.solves - before.solves) +
                         " solves, expected 1"};
    const bool skipped = after.skips > before.skips;
    if (skipped && start_ != Start::lazy)
      return Verdict{false, worst, "step " + std::to_string(t) + " was skipped by a solver without the gate"};
    const std::vector<double> x = solution();
    Verdict v = check_solve(graph_, settings_.alpha, rhs_.b(t), x.data(), skipped ? settings_.lazy_tol : settings_.tol, t,
                            skipped);
    worst = std::max(worst, v.max_error);
    if (!v.passed) return Verdict{false, worst, v.detail};
  }
  return Verdict{true, worst, ""};
}

std::vector<std::pair<std::string, double>> WindowSolver::observed() const {
  // observed() is const in the Instance interface; timing the parts replays a window, which rewrites
  // the solver's buffers (what run() rewrites anyway) but not what was observed while timed.
  auto* self = const_cast<WindowSolver*>(this);
  const Tally t = self->tally();
  const double solves = static_cast<double>(std::max<int64_t>(t.solves, 1));
  std::vector<std::pair<std::string, double>> out{
      {"skip_rate", static_cast<double>(t.skips) / solves},
      {"matvecs_per_solve", static_cast<double>(t.matvecs) / solves},
      {"iterations_per_solve", static_cast<double>(t.iterations) / solves},
      // In parts per million of ||b|| (the gate's tolerance is 1 ppm, the solve's 0.1 ppm).
      {"final_rel_residual_ppm", t.worst_residual * 1e6},
  };
  if (counts_syncs_) out.emplace_back("syncs_per_solve", static_cast<double>(t.syncs) / solves);
  for (auto& c : self->measure_parts(t)) out.push_back(std::move(c));
  return out;
}

std::vector<std::pair<std::string, double>> WindowSolver::measure_parts(const Tally& timed) {
  // A few replays, the median of each part's total: one replay is as noisy as one sample.
  std::vector<double> start_s, finish_s;
  int finished = 0;
  for (int replay = 0; replay < defaults::cg_prediction_replays; ++replay) {
    begin_window();
    double started = 0, finishing = 0;
    finished = 0;
    for (int t = 1; t <= settings_.window; ++t) {
      started += time_part([&] { start(t); });
      if (!started_done()) {
        finishing += time_part([&] { finish(t); });
        ++finished;
      }
    }
    start_s.push_back(started);
    finish_s.push_back(finishing);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double steps = settings_.window, start_total = median(start_s), finish_total = median(finish_s);
  // Without the gate every step is a whole solve (a warm one includes its residual's matvec).
  if (start_ != Start::lazy) return {{"full_solve_ns", (start_total + finish_total) / steps * 1e9}};
  const double skip = timed.solves ? static_cast<double>(timed.skips) / static_cast<double>(timed.solves) : 0.0;
  const double gate_ns = start_total / steps * 1e9;
  const double full_ns = finished ? finish_total / finished * 1e9 : 0.0;
  return {{"gate_ns", gate_ns}, {"full_solve_ns", full_ns}, {"predicted_ns", steps * (gate_ns + (1.0 - skip) * full_ns)}};
}

// ---- the propagator's rows ------------------------------------------------------------------------

RowsWindow::RowsWindow(const Problem& p, Start start)
    : settings_(rows_settings_of(p)),
      start_(start),
      rhs_(settings_.system.rows, settings_.system.width, settings_.drift, settings_.window) {}

void RowsWindow::run() {
  begin_window();
  for (int t = 1; t <= settings_.window; ++t) stats_ += solve(t);
}

Verdict RowsWindow::check() {
  begin_window();
  double worst = 0;
  for (int t = 1; t <= settings_.window; ++t) {
    const RowStats s = solve(t);
    const bool skipped = s.skipped > 0;
    if (skipped && start_ != Start::lazy)
      return Verdict{false, worst, "batch " + std::to_string(t) + " was skipped by a solver without the gate"};
    const std::vector<float> x = solution();
    const Verdict v = check_rows(settings_.system, rhs_.b(t), x.data(), skipped, t, tolerance::cg_rows_residual_fp32_atol);
    worst = std::max(worst, v.max_error);
    if (!v.passed) return Verdict{false, worst, v.detail};
  }
  return Verdict{true, worst, ""};
}

std::vector<std::pair<std::string, double>> RowsWindow::observed() const {
  const double solves = static_cast<double>(std::max<int64_t>(stats_.solves, 1));
  return {
      {"skip_rate", static_cast<double>(stats_.skipped) / solves},
      {"matvecs_per_solve", static_cast<double>(stats_.matvecs) / solves},
      {"iterations_per_solve", static_cast<double>(stats_.iterations) / solves},
      // The worst row's, in parts per million of its ||b_n|| (both tolerances are 1 ppm).
      {"final_rel_residual_ppm", stats_.worst_residual * 1e6},
  };
}

}  // namespace tb::cg

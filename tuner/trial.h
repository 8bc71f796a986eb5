// Trials in child processes. A crash, a sticky CUDA error or a hang costs one trial, never the
// sweep: the parent starts `autotune --trial JSON` with a watchdog, reads one JSON line back, and
// classifies anything else (a signal, an exit without a result, the watchdog) itself.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "step/workload.h"
#include "tuner/search.h"

namespace tb::tune {

// The switches a workload can tune on a backend, the workload's own value first.
std::map<std::string, std::vector<std::string>> available_switches(const step::Workload& w, bool cuda);
// The workload with a candidate's batch and switches applied.
step::Workload apply(const step::Workload& w, const Candidate& c);
// The workload's own configuration as a candidate.
Candidate own_candidate(const step::Workload& w, const SearchSpace& space);
// Untimed steps a trial runs between its checked first step and its first timed sample; the last
// of them is timed alone to size the samples.
int64_t warmup_steps(const step::Workload& w);

// A trial bound by a budget (MeasurePolicy::wall_seconds) gets this long past it to write its
// result and exit before the parent stops it.
inline constexpr double kill_grace_seconds = 1.0;

// The shortest a trial of `w` can be on this machine, from the work model: process start and set-up,
// the checked step, the warm-up steps and `min_steps` measured steps, each step's FLOPs at the
// machine's compute ceiling. A lower bound: a budget below it cannot buy one trial.
struct TrialEstimate {
  double seconds = 0;
  double step_seconds = 0;  // one step at the ceiling
  double step_flops = 0;
  double flop_rate = 0;     // the ceiling used
  std::string rate_source;  // how it was had
};
TrialEstimate shortest_trial(const step::Workload& w, int64_t min_steps, bool cuda, int device);

nlohmann::json to_json(const Candidate& c);
Candidate candidate_from_json(const nlohmann::json& j);
nlohmann::json to_json(const TrialResult& r);
TrialResult trial_result_from_json(const nlohmann::json& j);

// ---- the child ---------------------------------------------------------------------------------
// Runs one trial described by `request` (workload path, backend, device, candidate, policy) and
// returns its result; out-of-memory and failed checks are results, not exceptions.
TrialResult run_trial_here(const nlohmann::json& request);

// ---- the parent --------------------------------------------------------------------------------
struct ChildOutcome {
  bool timed_out = false;
  bool interrupted = false;
  int exit_code = -1;  // when it exited
  int signal = 0;      // when a signal ended it
  std::string out;     // its standard output
  std::string err_tail;  // the end of its standard error
};
// Runs argv in its own process group; kills the group after `timeout_s`, or when `stop` turns true.
ChildOutcome run_child(const std::vector<std::string>& argv, double timeout_s, const std::atomic<bool>* stop);
// What a child's outcome means as a trial.
TrialResult classify(const ChildOutcome& outcome);

class ProcessExecutor final : public Executor {
 public:
  ProcessExecutor(std::string self_exe, std::string workload_path, bool cuda, int device,
                  const std::atomic<bool>* stop);
  TrialResult run(const Candidate& candidate, const MeasurePolicy& policy) override;
  int64_t memory_capacity() const override { return capacity_; }

 private:
  std::string exe_, workload_path_;
  bool cuda_;
  int device_;
  const std::atomic<bool>* stop_;
  int64_t capacity_ = 0;
};

}  // namespace tb::tune

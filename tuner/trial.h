// Trials: the measuring rule every trial follows (measure_steps), the C++ step's trials in child
// processes, and the PyTorch twin's executor. A crash, a sticky CUDA error or a hang costs one trial,
// never the sweep: the parent starts `autotune --trial JSON` with a watchdog, reads one JSON line back,
// and classifies anything else (a signal, an exit without a result, the watchdog) itself; PyTorch runs
// in the tune's worker (worker.h), restarted after such a failure.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "step/workload.h"
#include "tuner/search.h"
#include "tuner/worker.h"

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

// A candidate and a trial's result as a trial's child, the journal and a request carry them. The readers take what
// another process or an earlier run wrote: UsageError naming the field for anything that is not one (a batch below
// 1, a class that does not exist, a field of another type).
nlohmann::json to_json(const Candidate& c);
Candidate candidate_from_json(const nlohmann::json& j);
nlohmann::json to_json(const TrialResult& r);
TrialResult trial_result_from_json(const nlohmann::json& j);

// The measuring rule of every trial, whoever runs the steps (this process, the ranks of a data-parallel
// step, the PyTorch worker): samples of whole steps, each at least ~20 ms (sized from one step's
// `sizing_step_seconds`), taken until the median's interval is within the policy's target, its
// max_seconds pass, the candidate is clearly behind the best so far (stop_below), or the budget's end
// (wall_seconds) would come before the next sample. Fills `r`'s samples_per_s and interval (of
// `samples_per_step`), steps, setup_seconds (when unset: the time before the first sample) and message.
// A pipelined sampler's steps take batches other processes make (a DataLoader's workers): a sample's time
// depends on how far ahead the workers stood when it began (a run of ready batches, then a wait), so its rate
// is its samples' steps over their whole time (the mean step, with Student's t interval), not the median
// sample, which lands on one side of that alternation or the other.
struct StepSampler {
  std::function<double(int64_t steps)> time_steps;                       // seconds for that many whole steps
  std::function<double()> elapsed;                                       // seconds since the trial started
  std::function<double(double)> agree_max = [](double x) { return x; };  // over the ranks, on several
  bool pipelined = false;
};
void measure_steps(const StepSampler& sampler, double sizing_step_seconds, const MeasurePolicy& policy,
                   double samples_per_step, TrialResult& r);

// ---- the child ---------------------------------------------------------------------------------
// Runs one trial described by `request` (workload path, backend, device, candidate, policy) and
// returns its result; out-of-memory and failed checks are results, not exceptions.
TrialResult run_trial_here(const nlohmann::json& request);

// ---- the parent --------------------------------------------------------------------------------
struct ChildOutcome {
  bool timed_out = false;
  bool interrupted = false;
  int exit_code = -1;    // when it exited
  int signal = 0;        // when a signal ended it
  std::string out;       // its standard output
  std::string err_tail;  // the end of its standard error
};
// Runs argv in its own process group; kills the group after `timeout_s`, or when `stop` turns true.
ChildOutcome run_child(const std::vector<std::string>& argv, double timeout_s, const std::atomic<bool>* stop);
// What a child's outcome means as a trial: its last line of standard output read as its result, or how it ended.
// Never throws: an unreadable result is an error trial saying so.
TrialResult classify(const ChildOutcome& outcome);
// How a process ended, in words, for a trial's child and the PyTorch worker alike: "killed by SIGKILL (the
// kernel's out-of-memory killer, most likely)", "crashed: killed by signal 15 (Terminated)", "exited with code 3"
// followed by `after_exit`, or "ended" when it neither exited nor was signalled (exit_code < 0); then, but for
// SIGKILL, what it said last on its standard error (`said`, its bytes that are not UTF-8 replaced by '?') after a
// colon when it said anything.
std::string ending_text(int signal, int exit_code, const std::string& said, const std::string& after_exit = "");
// How a child that gave no result ended: "crashed: killed by signal 15 (Terminated)", "exited with code 3 and no
// result", with the end of its standard error after a colon when it said anything.
std::string ending_text(const ChildOutcome& outcome);

// Bytes a trial may use: the GPU's memory less what the context, cuBLAS's workspace and an
// allocator's slack take (1 GiB), or 90% of the host memory available now.
int64_t trial_memory_capacity(bool cuda, int device);

// The policy as a request carries it, and back.
nlohmann::json to_json(const MeasurePolicy& policy);
MeasurePolicy policy_from_json(const nlohmann::json& j);

// Runs a trial child (argv) under the watchdog: `policy.wall_seconds` (with a grace) when a budget
// bounds the trial, else a hang limit of 3 x max_seconds + 120 s; throws OutOfBudget when the budget's
// end stopped it. The child's outcome as a trial (classify()).
TrialResult run_watched(const std::vector<std::string>& argv, const MeasurePolicy& policy, const std::atomic<bool>* stop);

// The native executor: each trial is `autotune --trial REQUEST`, the C++ step (kernels/step). With
// ranks > 1, `LAUNCHER -n RANKS autotune --trial REQUEST` (launcher: mpirun and its options, a full
// path first): the data-parallel step on every rank, the per-rank batch in the candidate; with
// `independent`, every rank a step of its own without the all-reduce, timed as the slowest rank's.
class ProcessExecutor final : public Executor {
 public:
  ProcessExecutor(std::string self_exe, std::string workload_path, bool cuda, int device, const std::atomic<bool>* stop,
                  int64_t ranks = 1, std::vector<std::string> launcher = {}, bool independent = false);
  TrialResult run(const Candidate& candidate, const MeasurePolicy& policy) override;
  int64_t memory_capacity() const override { return capacity_; }

 private:
  std::string exe_, workload_path_;
  bool cuda_;
  int device_;
  const std::atomic<bool>* stop_;
  int64_t ranks_ = 1;
  std::vector<std::string> launcher_;
  bool independent_ = false;
  int64_t capacity_ = 0;
};

// `LAUNCHER -n RANKS COMMAND...`: a command on every rank (launcher: mpirun and its options).
std::vector<std::string> under_launcher(const std::vector<std::string>& launcher, int64_t ranks,
                                        const std::vector<std::string>& command);
// The program's path: as given when it holds a '/' and is executable, else the first executable of
// that name on PATH; "" when there is none.
std::string find_on_path(const std::string& program);

// What the PyTorch worker said of its interpreter when it started.
struct TorchProbe {
  std::string python, script;  // what runs the worker: python script --serve START
  std::string torch_version, python_version;
  bool cuda = false;          // the worker drives a GPU
  double import_seconds = 0;  // the worker's start: importing torch and the twin (paid once a tune)
};

// The interpreter and scripts/torch-step as autotune finds them (torch_python(), torch_step_script()).
TorchProbe torch_interpreter();
// Starts `worker` and fills `probe` from its hello; UsageError saying how to install PyTorch (or what the worker
// said) when it cannot start. `who` names the option in the message.
// How long importing PyTorch (and the script) may take before the worker is taken for hung.
inline constexpr double kTorchWorkerStartSeconds = 180;
void start_torch_worker(WorkerExecutor& worker, TorchProbe& probe, const std::string& who,
                        double timeout_s = kTorchWorkerStartSeconds);

// The PyTorch executor (`autotune --executor torch`): the PyTorch twin of the step in the tune's worker
// (worker.h; scripts/trainbench/pytorch/worker.py), each candidate opened with the workload resolved
// here with the candidate applied, measured by the same rules as the C++ step (measure_steps). Its first
// step is checked against the C++ step's double-precision reference (step::reference_losses), computed here
// once: it depends on neither the batch nor the switches. Peak memory is PyTorch's (max_memory_allocated on
// a GPU, the worker's peak resident set on the CPU, reset at each candidate); on the CPU the worker is held
// to memory_capacity() (or --memory-limit) by an address-space limit, so that too large a configuration is
// an out-of-memory result rather than the kernel's killer.
class TorchExecutor final : public Executor {
 public:
  // Starts the worker; throws UsageError when the interpreter cannot import torch, the script is missing, or
  // `cuda` is asked of a PyTorch that sees no GPU.
  TorchExecutor(const step::Workload& workload, bool cuda, int device, const std::atomic<bool>* stop,
                int64_t memory_limit = 0);
  TrialResult run(const Candidate& candidate, const MeasurePolicy& policy) override {
    return worker_->run(candidate, policy);
  }
  int64_t memory_capacity() const override { return capacity_; }
  const TorchProbe& probe() const { return probe_; }
  const WorkerStats& worker_stats() const { return worker_->stats(); }

 private:
  step::Workload workload_;
  bool cuda_;
  int64_t capacity_ = 0;
  TorchProbe probe_;
  int32_t first_sample_ = 0;
  std::vector<double> reference_;
  std::unique_ptr<WorkerExecutor> worker_;
};

}  // namespace tb::tune

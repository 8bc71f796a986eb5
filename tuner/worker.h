// The tune's PyTorch worker (`autotune --executor torch`, the twin of the step or the user's own model with
// --entry): one `scripts/torch-step --serve` process for the whole tune, which imports torch and the entry once
// and then builds, checks and steps each candidate as asked (scripts/trainbench/pytorch/worker.py). This
// side measures, as benchsuite measures its PyTorch rows: it sizes the samples, applies the stopping rule and
// computes the interval (measure_steps, trial.h), and the race's rounds are its own. Isolation comes from
// restarting: a crash, a hang, a sticky CUDA error or an out-of-memory that leaves memory held costs that
// candidate, the worker is started again for the next one, and the restarts are counted.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tuner/search.h"

namespace tb::tune {

// What autotune and scripts/torch-step --serve say to each other: a JSON object a line each way, with the ops of
// benchsuite's PyTorch rows (open, time, counters, close), a candidate where those have a row.
inline constexpr const char* torch_worker_protocol = "trainbench-torch-worker/1";

// The conversation ended without an answer: the process died (a crash, the kernel's out-of-memory killer), did not
// answer in time (hung), or autotune was asked to stop.
struct WorkerLost : std::runtime_error {
  enum class Why { died, hung, interrupted };
  WorkerLost(Why why_in, const std::string& what, int signal_in = 0)
      : std::runtime_error(what), why(why_in), signal(signal_in) {}
  Why why;
  int signal = 0;  // the signal that ended it, when one did
};

// ---- the worker's answers, as this side reads them ---------------------------------------------------------------
// Each throws WorkerLost (died), saying what is wrong, when an answer is not what the protocol says there: the
// candidate in hand is lost and the worker started again, as after a crash.

// One line the worker wrote: a JSON object.
nlohmann::json parse_worker_line(const std::string& line);

// Its first line: the protocol it speaks and what it runs.
struct WorkerHello {
  std::string protocol, torch_version, python_version;
  bool cuda = false;
  double start_seconds = 0;  // importing torch and the twin or the entry
};
WorkerHello read_hello(const nlohmann::json& said);

// "open": the candidate built and its first step checked ("passed", else why not: incorrect, oom, error), one step's
// time as the worker saw it, what it says once a tune (a warning) and torch.compile's seconds in the first step.
struct OpenAnswer {
  std::string disposition = "error", reason, warning;
  double step_seconds = 0, compile_seconds = 0;
  bool pipelined = false;  // its batches come from loader worker processes (StepSampler::pipelined)
};
OpenAnswer read_open_answer(const nlohmann::json& said);

// "time": the seconds the asked steps took, or the steps' failure and its class (oom, incorrect, error).
struct TimeAnswer {
  bool failed = false;
  std::string failed_class, error;
  double seconds = 0;
};
TimeAnswer read_time_answer(const nlohmann::json& said);

// "counters": the candidate's peak memory in bytes (0 when it does not say).
int64_t read_counters_answer(const nlohmann::json& said);
// "close": whether the worker asks to be started again (memory it could not give back).
bool read_close_answer(const nlohmann::json& said);

// "split": where the open candidate's steps spend their time (autotune's time split): each part's seconds a step,
// the step as its parts add up and as as many steps timed whole, and the candidate's loader settings. Read after the
// race, for the output only: a failure or an answer of the wrong shape is `error` (never thrown), and the tune
// keeps what it measured.
struct SplitAnswer {
  std::string error;                     // not empty: no split (the worker's words, or what is wrong with its answer)
  std::map<std::string, double> parts;   // data, forward_backward, optimizer, communication, sync (0 when not said)
  double step_seconds = 0, whole_step_seconds = 0;
  int64_t steps = 0;                     // 0 when not said
  // {num_workers, prefetch_factor (null without workers), persistent_workers, pin_memory, cpu_threads}, or null
  nlohmann::json dataloader;
};
SplitAnswer read_split_answer(const nlohmann::json& said);

// "profile": the communication the open candidate's steps wait for (on ranks: the rank that waited most, every rank's
// share beside it), seconds over all the profiled steps. As the split: a failure or a wrong shape is `error`.
struct ProfileAnswer {
  std::string error;
  double share = 0, wall_seconds = 0, exposed_seconds = 0, communication_seconds = 0;
  int64_t steps = 0;  // 0 when not said
  std::vector<double> rank_shares;
};
ProfileAnswer read_profile_answer(const nlohmann::json& said);

// One worker process: its own process group, one socket as its stdin and stdout, its stderr kept (the tail, for
// the message of a death). Killed with its group when this object goes.
class WorkerProcess {
 public:
  // Starts argv and waits up to `timeout_s` for its first line (the protocol's hello). UsageError with the
  // worker's last line of stderr when it exits 2 (bad start: no PyTorch, a GPU it cannot see).
  WorkerProcess(const std::vector<std::string>& argv, double timeout_s, const std::atomic<bool>* stop);
  ~WorkerProcess();
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  // The answer to `message` within `timeout_s`; WorkerLost when none comes.
  nlohmann::json request(const nlohmann::json& message, double timeout_s);
  const nlohmann::json& hello() const { return hello_; }
  std::string stderr_tail() const;  // the last non-empty line of its standard error

 private:
  nlohmann::json read_line(double timeout_s);
  void pump(int wait_ms);  // reads what the socket and the stderr pipe have
  [[noreturn]] void lost(WorkerLost::Why why, const std::string& what);
  void kill_group();
  int pid_ = 0;
  int socket_ = -1, stderr_ = -1;
  std::string in_, err_;
  bool socket_closed_ = false;
  const std::atomic<bool>* stop_;
  nlohmann::json hello_;
};

// What the worker's restarts were, for the output.
struct WorkerStats {
  int starts = 0;
  int restarts = 0;                  // starts after the first: each after a candidate lost the worker
  std::vector<std::string> reasons;  // why each restart was needed: "optimizer=foreach: crashed (signal 6)"
  double start_seconds = 0;          // every start together (importing torch and the entry)
  nlohmann::json to_json() const;
};

// How long a request may go unanswered before the worker is taken for hung: kHangFactor x what it is expected to
// take, at least kHangFloorSeconds (a busy machine stalls a process for seconds at a time).
inline constexpr double kHangFloorSeconds = 30;
inline constexpr double kHangFactor = 10;

// The executor over a worker. `open_request(candidate)` is the open request's body (the candidate; for the twin
// also its resolved workload and reference). A worker of `ranks` ranks (an entry's under torchrun) steps every
// rank's share of the batch at once: a candidate's global batch is one rank's, a step takes `ranks` of them.
class WorkerExecutor final : public Executor {
 public:
  using OpenRequest = std::function<nlohmann::json(const Candidate&)>;
  WorkerExecutor(std::vector<std::string> argv, OpenRequest open_request, int64_t capacity, const std::atomic<bool>* stop,
                 int64_t ranks = 1);
  ~WorkerExecutor() override;
  TrialResult run(const Candidate& candidate, const MeasurePolicy& policy) override;
  int64_t memory_capacity() const override { return capacity_; }
  const WorkerStats& stats() const { return stats_; }
  // Starts the worker now (the tune's first act, so that a broken interpreter is a clear error before any trial);
  // its hello.
  const nlohmann::json& start(double timeout_s);
  // A request outside a trial (an entry's probe): the worker started when it is not; WorkerLost as the process's.
  nlohmann::json request(const nlohmann::json& message, double timeout_s);
  // `steps` steps of `candidate` (opened, its warm-up step run) under torch.profiler: the worker's "profile" answer
  // ({wall_seconds, communication_seconds, exposed_seconds, share, ...}), or {"error"} when it did not run; the
  // candidate is closed after. Within `timeout_s` in all.
  nlohmann::json profile(const Candidate& candidate, int64_t steps, double timeout_s);
  // Where `steps` steps of `candidate` spend their time: the worker's "split" answer ({parts: {data,
  // forward_backward, optimizer, communication, sync} seconds a step, step_seconds, dataloader}), or {"error"}; as
  // profile.
  nlohmann::json split(const Candidate& candidate, int64_t steps, double timeout_s);
  // The least time a request may go unanswered before the worker is taken for hung (kHangFloorSeconds).
  void set_hang_floor(double seconds) { hang_floor_ = seconds; }

 private:
  // A trial's steps, each a function: open the candidate (set-up and the checked first step), measure its steps,
  // read its peak memory and close it. `r` holds the failure where one ends the trial.
  class TrialClock;  // the trial's clock and each request's time limit (worker.cpp)
  nlohmann::json open_candidate(const Candidate& candidate, TrialClock& clock, TrialResult& r);
  bool measure_candidate(const Candidate& candidate, const nlohmann::json& said, const MeasurePolicy& policy,
                         TrialClock& clock, TrialResult& r);  // false: a step failed
  void close_measured(const Candidate& candidate, const nlohmann::json& said, TrialClock& clock, TrialResult& r);
  // `request` to `candidate` opened (as a trial opens it), then closed: the answer, or {"error"}.
  nlohmann::json opened_request(const Candidate& candidate, const nlohmann::json& request, double timeout_s);
  // Closes the candidate; a worker that still holds memory after it is restarted for the next one, the restart's
  // reason the candidate and `held_after`.
  void close_candidate(const Candidate& candidate, bool failed, double timeout_s, const std::string& held_after);
  // The worker was lost during the candidate (a crash, a hang, an interrupt): the trial's result says how, except
  // a hang cut at the budget's end, which is the budget's (OutOfBudget).
  TrialResult lost_candidate(const Candidate& candidate, const WorkerLost& e, const TrialClock& clock, TrialResult r);

  std::vector<std::string> argv_;
  OpenRequest open_request_;
  int64_t capacity_ = 0;
  int64_t ranks_ = 1;
  const std::atomic<bool>* stop_;
  std::unique_ptr<WorkerProcess> process_;
  WorkerStats stats_;
  std::string pending_reason_;  // why the next start is a restart
  double slowest_open_ = 0;     // of the candidates opened without compilation: what a hang is told from
  std::set<std::string> warned_;  // the worker's warnings said so far (each once a tune)
  double hang_floor_ = 0;
};

}  // namespace tb::tune

// The tuner's search: which (micro-batch, switches) to measure, in which order, and when to stop.
// It talks to an Executor, which runs one trial (a candidate for a number of whole steps) and says
// how it went; the real executor runs trials in child processes (trial.h), tests use synthetic
// landscapes. The search never sees a GPU.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace tb::tune {

// One configuration: micro-batch, accumulation (global / micro) and a value for every switch in the
// space, e.g. {"optimizer": "fused", "cuda_graphs": "on"}.
struct Candidate {
  int64_t global_batch = 0;
  int64_t micro_batch = 0;
  std::map<std::string, std::string> switches;
  int64_t accumulation() const { return micro_batch ? global_batch / micro_batch : 0; }
  std::string key() const;  // stable text: "g=4096 mb=128 lazy_cg=on optimizer=fused"
  bool operator==(const Candidate& o) const { return key() == o.key(); }
};

enum class TrialClass { ok, oom, error, timeout, incorrect };
const char* to_string(TrialClass c);
TrialClass trial_class_from_string(const std::string& s);  // throws std::invalid_argument

// What a trial measured. Throughput is samples per second over whole optimizer steps.
struct TrialResult {
  TrialClass cls = TrialClass::ok;
  double samples_per_s = 0;        // median over the trial's samples
  double ci_low = 0, ci_high = 0;  // interval of that median (samples/s)
  int64_t peak_bytes = 0;          // the allocator's high-water mark
  int64_t steps = 0;               // whole steps measured
  double seconds = 0;              // wall time the trial took, setup included
  std::string message;             // why, when not ok
  double setup_seconds = 0;        // of `seconds`, before the first timed sample (set-up, check, warm-up)
  // Its batches came from loader worker processes (a DataLoader's workers: StepSampler::pipelined): its rate is
  // its mean step, and its race slices run longer (slice_seconds_for).
  bool pipelined = false;
  bool ok() const { return cls == TrialClass::ok; }
};

// How long a trial may measure: until the interval's half-width is below `target_rel_ci` of the
// median, or `max_seconds`, whichever comes first, with at least `min_steps` steps.
struct MeasurePolicy {
  double target_rel_ci = 0.01;
  double max_seconds = 10;
  int64_t min_steps = 3;
  // A candidate clearly behind: the trial may stop (after `min_steps`) as soon as its interval's upper
  // end is below this (samples/s). 0: never. The fast search sets it from the best so far; the
  // result is still ok, with the wider interval it had when it stopped.
  double stop_below = 0;
  // The whole trial, set-up included, must end within this many seconds of its start (0: no limit):
  // the trial stops measuring in time, and an executor stops a trial that runs past it.
  double wall_seconds = 0;
};

// Thrown by an executor whose trial was stopped at MeasurePolicy::wall_seconds before it had a
// result: the budget ended, which says nothing about the candidate (the trial is not recorded).
struct OutOfBudget : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual TrialResult run(const Candidate& candidate, const MeasurePolicy& policy) = 0;
  // Bytes the configuration may use: device (or host) memory available to a trial.
  virtual int64_t memory_capacity() const = 0;
};

// The space: global batch(es), the switch values to try (the first value of each switch is the
// workload's own), and the micro-batches allowed (divisors of the global batch; empty: all).
struct SearchSpace {
  std::vector<int64_t> global_batches;
  std::map<std::string, std::vector<std::string>> switches;
  std::vector<int64_t> micro_batches;
  // Switches that change memory per sample (e.g. activation_checkpointing): the memory model is
  // fitted once per value of these.
  std::vector<std::string> memory_switches;
  // Switches that mean something only where a condition holds, by name: "workers" (a loader's
  // prefetch_factor, persistent_workers, cpu_threads: where num_workers is not 0) or "accumulation"
  // (no_sync: where a step has more than one micro-batch). Elsewhere the search keeps them at their
  // first value and never tries another.
  std::map<std::string, std::string> applies_when;
  // Switches a descent tries before the others, in this order (the others by name): on ranks, the data
  // parallelism's own (parallel, no_sync, ...), so that a budget that buys few trials still tries each.
  std::vector<std::string> tried_first;
};

// Whether switch `name` means something in `candidate` (SearchSpace::applies_when).
bool switch_applies(const SearchSpace& space, const std::string& name, const Candidate& candidate);
// `candidate` with every switch that means nothing in it at its first value (the same configuration).
Candidate canonical(const SearchSpace& space, Candidate candidate);

struct SearchOptions {
  enum class Strategy { grid, auto_ } strategy = Strategy::auto_;
  double budget_seconds = 300;  // wall time for the whole search (trials' own seconds count)
  // When set, the wall-clock seconds left for trials, which replaces the budget above: a trial starts
  // only with at least `min_trial_seconds` left and must end (MeasurePolicy::wall_seconds) in time.
  std::function<double()> seconds_left;
  double min_trial_seconds = 0;
  double noise_margin = 0.01;  // configs whose throughputs differ less than this are ties
  double headroom = 0.05;      // memory kept free, at least; widened by the measured variation
  MeasurePolicy measure;
  // Called after each trial (progress lines, journaling). Trials already known (resume) are passed
  // in `known` and are not run again.
  std::function<void(const Candidate&, const TrialResult&)> on_trial;
  // By Candidate::key(): every finished measurement of it, in the order they ran. The search takes
  // the i-th measurement it asks for from here while there is one, so a resumed search replays the
  // interrupted one exactly and repeats no finished trial.
  std::map<std::string, std::vector<TrialResult>> known;
};

struct Ranked {
  Candidate candidate;
  TrialResult result;
};

struct SearchReport {
  Ranked best;
  std::vector<Ranked> runners_up;  // within noise of the best, best first
  std::vector<Ranked> trials;      // every trial, in the order run (resumed ones included)
  int64_t trials_run = 0;          // executed in this search (not from `known`)
  int64_t max_micro_batch = 0;     // the largest that fits, per the memory probes
  double headroom = 0;             // the headroom used
  double seconds = 0;
  bool budget_exhausted = false;
  bool found = false;  // false when no candidate ran successfully
};

// The largest micro-batch that fits for the given memory-relevant switches: probes two sizes,
// fits peak = fixed + per_sample * micro, predicts, and confirms by running the prediction (one
// step down the allowed list on an out-of-memory). Probes are trials and are reported.
int64_t largest_micro_batch(Executor& executor, const Candidate& base, const std::vector<int64_t>& allowed,
                            SearchOptions& options, std::vector<Ranked>& trials, double& headroom);

SearchReport search(Executor& executor, const SearchSpace& space, SearchOptions options);

// Micro-batches that divide `global` (sorted), at most `max_micro`.
std::vector<int64_t> divisors(int64_t global, int64_t max_micro);

// The global batches a tune searches, and where they come from (the output says both). A larger global
// batch often runs more samples per second, but it changes the optimisation (fewer steps per epoch, a
// learning rate tuned for another batch), so the range searched is the one the user declared.
struct GlobalBatchPlan {
  std::vector<int64_t> batches;  // ascending
  std::string source;            // "--batch", "--batch-range 32:256", "the workload's global_range [4, 16]", ...
  bool pinned = false;           // --batch: one global batch, the user's
};
// An inclusive range [lo, hi]; lo == 0: none given.
struct BatchRange {
  int64_t lo = 0, hi = 0;
  bool given() const { return lo > 0; }
};
// `pinned` (--batch N, 0: not given) searches N alone; `option` (--batch-range A:B) searches A, 2A, 4A ...
// and B; otherwise the workload's global_range the same way, with its own global batch `own` added
// when the range holds it; a workload without a range, `own` alone.
GlobalBatchPlan plan_global_batches(int64_t own, BatchRange workload_range, int64_t pinned, BatchRange option);

// The search's best samples/s at each global batch it searched (0 and no trials where none ran ok).
struct GlobalBatchResult {
  int64_t global_batch = 0;
  double best_samples_per_s = 0;
  int64_t ok_trials = 0;
};
std::vector<GlobalBatchResult> per_global_batch(const std::vector<Ranked>& trials, const std::vector<int64_t>& batches);

}  // namespace tb::tune

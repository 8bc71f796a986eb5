// The user's own PyTorch model as what autotune tunes (`autotune --executor torch --entry FILE.py:NAME`,
// `--entry hf:MODEL?key=value`): the entry is validated once in a child (`torch-step --entry-probe`, a
// bad one is a UsageError naming the file, the function and what was expected, before any trial), and
// every trial is `torch-step --entry-trial REQUEST` under the same watchdog, with the same TrialResult
// line back as the twin's (scripts/trainbench_tracking/torch_entry.py).
#pragma once

#include <atomic>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "step/workload.h"
#include "tuner/search.h"
#include "tuner/trial.h"

namespace tb::tune {

struct EntryProbe {
  std::string spec;    // as the trials get it: FILE.py made absolute
  std::string label;   // "FILE.py:NAME", "hf:gpt2", "LightningModule Name"
  std::string file;    // the entry's file, "" for hf:
  int64_t parameters = 0;
  double max_grad_norm = 0;
  int64_t micro_batch = 0;     // the probe's
  double step_seconds = 0;     // one step at that micro-batch, as the probe measured it
  double probe_seconds = 0;    // the whole probe: a trial's start-up, at least
  std::map<std::string, std::vector<std::string>> switches;  // the entry's own value first
  TorchProbe torch;
};

// Default global batch of an entry when --batch does not say.
inline constexpr int64_t kEntryDefaultBatch = 32;

// Validates `spec` in a child; UsageError (one line) when the entry is bad or PyTorch is missing.
EntryProbe probe_entry(const std::string& spec, bool cuda, int device, int64_t global_batch, const std::atomic<bool>* stop);

// What the rest of autotune reads of a workload, for an entry: its name, path, batch (micro = global:
// the entry's own configuration is one micro-batch) and clipping.
step::Workload entry_workload(const EntryProbe& p, int64_t global_batch);
// The text the journal's and the output's digest is taken of: the entry's file and the spec.
std::string entry_digest_text(const EntryProbe& p);
// The shortest trial of `c`: the probe's start-up and steps at its measured rate.
TrialEstimate entry_shortest_trial(const EntryProbe& p, const Candidate& c, int64_t min_steps);

// `--versus largest-batch`: what Lightning's BatchSizeFinder (mode "power") gives on this device, found in
// one child (`torch-step --entry-largest-batch`): the micro-batch doubled from 1 while a few steps at it fit
// in `memory_limit_bytes`, at most the global batch and dividing it; its accumulation makes up the rest.
struct LargestBatch {
  int64_t micro_batch = 0;  // 0: not even one sample fits
  int64_t steps_per_size = 0;
  double seconds = 0;
  nlohmann::json tried;     // [{micro_batch, outcome, peak_bytes}], in the order tried
};
// UsageError (one line) for a bad entry; a runtime error naming what happened when it fails otherwise, runs
// past `timeout_s` or is stopped by `stop`.
LargestBatch find_largest_batch(const EntryProbe& p, bool cuda, int device, int64_t global_batch,
                                int64_t memory_limit_bytes, double timeout_s, const std::atomic<bool>* stop);

class EntryExecutor final : public Executor {
 public:
  EntryExecutor(EntryProbe probe, bool cuda, int device, const std::atomic<bool>* stop);
  TrialResult run(const Candidate& candidate, const MeasurePolicy& policy) override;
  int64_t memory_capacity() const override { return capacity_; }
  const EntryProbe& probe() const { return probe_; }

 private:
  EntryProbe probe_;
  bool cuda_;
  int device_;
  const std::atomic<bool>* stop_;
  int64_t capacity_ = 0;
};

}  // namespace tb::tune

// The user's own PyTorch model as what autotune tunes (`autotune --executor torch --entry FILE.py:NAME`,
// `--entry hf:MODEL?key=value`), all of it in the tune's one PyTorch worker (`torch-step --serve`,
// worker.h), where torch and the entry are imported once: the entry is validated first (a bad one is a
// UsageError naming the file, the function and what was expected, before any trial), --versus's largest
// batch is found there, and every trial runs there, measured here by the same rules as the twin's
// (scripts/trainbench/pytorch/entry.py, worker.py).
#pragma once

#include <atomic>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "step/workload.h"
#include "tuner/search.h"
#include "tuner/trial.h"
#include "tuner/worker.h"

namespace tb::tune {

struct EntryProbe {
  std::string spec;   // as the trials get it: FILE.py made absolute
  std::string label;  // "FILE.py:NAME", "hf:gpt2", "LightningModule Name"
  std::string file;   // the entry's file, "" for hf:
  int64_t parameters = 0;
  double max_grad_norm = 0;
  int64_t micro_batch = 0;   // the probe's
  double step_seconds = 0;   // one step at that micro-batch, as the probe measured it
  double probe_seconds = 0;  // the probe in the worker: building the entry, a forward, backward and step
  std::map<std::string, std::vector<std::string>> switches;  // the entry's own value first
  // Switches that mean something only where a condition holds (SearchSpace::applies_when): a loader's
  // prefetch_factor, persistent_workers and cpu_threads with workers; no_sync with accumulation.
  std::map<std::string, std::string> applies_when;
  TorchProbe torch;
};

// Default global batch of an entry when --batch does not say.
inline constexpr int64_t kEntryDefaultBatch = 32;

// The spec as the worker gets it: FILE.py made absolute; UsageError for one that is neither FILE.py:NAME nor hf:MODEL.
std::string entry_spec(const std::string& spec);

// What the rest of autotune reads of a workload, for an entry: its name, path, batch (micro = global:
// the entry's own configuration is one micro-batch) and clipping.
step::Workload entry_workload(const EntryProbe& p, int64_t global_batch);
// The text the journal's and the output's digest is taken of: the entry's file and the spec.
std::string entry_digest_text(const EntryProbe& p);
// The shortest trial of `c`: the probe's start-up and steps at its measured rate.
TrialEstimate entry_shortest_trial(const EntryProbe& p, const Candidate& c, int64_t min_steps);

// `--launcher 'torchrun ARGS'` (or 'python -m torch.distributed.run ARGS'): ARGS, which the worker's torchrun is
// given in place of --standalone, with --nproc-per-node (ranks / nodes) added when ARGS leave it out. UsageError
// (one line) for another program, a --nnodes range, or ranks that the nodes do not divide. "" gives
// {"--standalone", "--nproc-per-node", ranks}.
std::vector<std::string> torchrun_arguments(const std::string& launcher, int64_t ranks);
// The --nnodes of torchrun's ARGS (1 when they do not say).
int64_t torchrun_nodes(const std::vector<std::string>& args);
// The CPU threads torchrun gives each of several ranks on a node: OMP_NUM_THREADS where it is set (a whole number
// above 0), else 1, as torchrun sets it.
int torchrun_rank_threads();

// Why `--entry --ranks N` cannot run here ("" when it can): on a GPU, one rank per GPU.
std::string entry_ranks_unavailable_reason(int64_t ranks, bool cuda);

// `--versus largest-batch`: what Lightning's BatchSizeFinder (mode "power") gives on this device, found in the
// worker: the micro-batch doubled from 1 while a few steps at it fit in the memory limit, at most the global
// batch and dividing it; its accumulation makes up the rest.
struct LargestBatch {
  int64_t micro_batch = 0;  // 0: not even one sample fits
  int64_t steps_per_size = 0;
  double seconds = 0;
  nlohmann::json tried;  // [{micro_batch, outcome, peak_bytes}], in the order tried
};

// The worker's answers about an entry, as this side reads them: "probe" (the entry's label, parameters, clipping,
// switches and one step's time) into `probe`, and "largest_batch" for a global batch of `global_batch`. An error the
// worker reports: UsageError when it says it is the user's to fix, else std::runtime_error with its words. An answer
// that is not what autotune expects: UsageError (the probe) or std::runtime_error (the largest-batch search), naming
// what is wrong.
void read_probe_answer(const nlohmann::json& said, const std::string& spec, EntryProbe& probe);
LargestBatch read_largest_batch_answer(const nlohmann::json& said, const std::string& label, int64_t global_batch);

// The user's model in the tune's worker (worker.h): the entry's module imported once, each candidate rebuilt
// from the entry function (same seed, fresh parameters, optimizer and loader), its first step checked against
// the reference of its global batch (computed once in the worker and kept), then stepped as measure_steps asks.
class EntryExecutor final : public Executor {
 public:
  // Starts the worker on `spec` and validates the entry there within `timeout_s`: UsageError (one line) when the
  // entry is bad or PyTorch is missing. `memory_limit`: bytes a CPU worker may map (0: what the host has).
  // With ranks > 1 the worker is a torchrun group of that many ranks (scripts/trainbench/pytorch/distributed.py):
  // the candidates it is given hold one rank's share of the global batch, as the native --ranks ones. With
  // `torchrun_args` (--launcher), one rank too is a torchrun group: DDP or FSDP2 on one GPU, NCCL's path checked.
  // `cpu_threads`: the threads a CPU worker computes with (torch.set_num_threads; 0: PyTorch's default).
  EntryExecutor(const std::string& spec, bool cuda, int device, int64_t global_batch, const std::atomic<bool>* stop,
                int64_t memory_limit, double timeout_s, int64_t ranks = 1,
                std::vector<std::string> torchrun_args = {}, int cpu_threads = 0);
  TrialResult run(const Candidate& candidate, const MeasurePolicy& policy) override {
    return worker_->run(candidate, policy);
  }
  int64_t memory_capacity() const override { return capacity_; }
  const EntryProbe& probe() const { return probe_; }
  int64_t ranks() const { return ranks_; }
  // The worker runs as a torchrun group (DDP or FSDP2 around the model): several ranks, or one given a launcher.
  bool distributed() const { return distributed_; }
  // How the ranks are started: "torchrun --standalone --nproc-per-node N" (python -m torch.distributed.run), or
  // torchrun with --launcher's arguments.
  std::string launcher() const;
  const WorkerStats& worker_stats() const { return worker_->stats(); }
  // The communication the step of `candidate` waits for, from `steps` profiled steps (WorkerExecutor::profile).
  nlohmann::json profile(const Candidate& candidate, int64_t steps, double timeout_s) {
    return worker_->profile(candidate, steps, timeout_s);
  }
  // Where the step of `candidate` spends its time, from `steps` steps with timers (WorkerExecutor::split).
  nlohmann::json split(const Candidate& candidate, int64_t steps, double timeout_s) {
    return worker_->split(candidate, steps, timeout_s);
  }
  // `--versus largest-batch`, within `memory_limit_bytes` (a GPU's; on the CPU the worker's limit holds) and
  // `timeout_s`. UsageError for a bad entry; a runtime error naming what happened when it fails otherwise.
  LargestBatch largest_batch(int64_t global_batch, int64_t memory_limit_bytes, double timeout_s);

 private:
  EntryProbe probe_;
  bool cuda_;
  int64_t ranks_ = 1;
  bool distributed_ = false;
  std::vector<std::string> torchrun_args_;  // torch.distributed.run's arguments (distributed_)
  int64_t capacity_ = 0;
  std::unique_ptr<WorkerExecutor> worker_;
};

}  // namespace tb::tune

// What autotune writes: the chosen configuration with its provenance (device and versions, the
// workload and its digest, the measured throughput with its interval, peak memory and headroom,
// trials and time, runners-up within noise, the speedup over the workload's own configuration with
// the interval of the interleaved comparison that holds it, the race of the finalists), as YAML or
// JSON, or as the keys DeepSpeed, PyTorch Lightning, Hugging Face TrainingArguments or an Accelerate config
// file read (on ranks: Lightning's DDPStrategy or ModelParallelStrategy, TrainingArguments' ddp_* or
// fsdp/fsdp_config, Accelerate's MULTI_GPU, MULTI_CPU or FSDP with its fsdp_config).
// The YAML and JSON document: trainbench_autotune: {chosen, measured, workload_config,
// speedup_over_workload_config, speedup_significant, speedup_interval, speedup_note, global_batches,
// search, race, runners_up_within_noise, failed_trials, executor, device, workload, version, git_commit}
// (chosen is null, with a note, when nothing ran). With --versus the baseline and the speedup over it
// are under `versus` instead: {name, how, ..., config, measured, speedup, speedup_significant,
// speedup_interval, note}. With --ranks N: chosen also holds ranks and
// per_rank_batch (its global_batch is every rank's together) and batch_split ("global batch 64 = micro-batch
// 32 x accumulation 1 x 2 ranks"), the document `ranks`, and with --predict `prediction` (distributed.h).
// An entry whose batches are a DataLoader: chosen.dataloader {num_workers, prefetch_factor, persistent_workers,
// pin_memory, cpu_threads} and, after the race, time_split (where the step's time goes, for the choice and the
// entry's own configuration).
// For an entry (executor torch-entry): chosen.format_notes {hf, lightning, accelerate}, a line for each part
// of the choice that format cannot hold and where it goes instead (the hf JSON has no room for comments;
// the Lightning and Accelerate files repeat theirs as comments); on ranks also chosen.launch, the command
// that starts the ranks as the tune did (executor.launcher) followed by YOUR_TRAINING_SCRIPT.py.
// workload.grad_clip is the gradient norm clipped at (0: none), which `autotune --from` carries over.
// `autotune --compare` writes
// trainbench_autotune_compare: {within_noise, comparisons, configs, race, interrupted, executor,
// device, workload, version, git_commit}.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tuner/race.h"
#include "tuner/search.h"

namespace tb::tune {

enum class OutFormat { yaml, json, deepspeed, lightning, hf, accelerate };
OutFormat out_format_from_string(const std::string& name);  // throws UsageError

// The choice against the workload's own configuration, and whether that is a measured speedup.
struct Speedup {
  double ratio = 1;                // choice / own, samples per second
  double ci_low = 0, ci_high = 0;  // the paired interval over the interleaved rounds (rounds >= 2)
  double level = 0.95;
  int rounds = 0;            // interleaved rounds it rests on; 0: separate trials, or one configuration
  bool significant = false;  // the interval excludes 1 by at least the noise margin
  std::string note;          // the verdict, in a sentence
};
// From the race's paired rounds of the choice against the workload's own configuration.
// `against` names the configuration compared with: the workload's own, or --versus's.
inline const std::string kWorkloadOwnConfig = "the workload's own configuration";
Speedup speedup_from_rounds(const PairedRounds& choice_vs_own, double noise_margin,
                            const std::string& against = kWorkloadOwnConfig);
// From two trials measured apart (the search's, when no round could be raced): never significant,
// since such trials compare the machine's drift as much as the configurations. `why`: why not raced.
Speedup speedup_from_separate_trials(double ratio, const std::string& why);
// The choice is the workload's own configuration.
Speedup speedup_of_own_choice(const std::string& against = kWorkloadOwnConfig);

// Which step the trials ran: {"name": "native"} (trainbench's C++ step), or {"name": "torch", the
// PyTorch and Python versions, the interpreter} for the PyTorch twin.
nlohmann::json native_executor_json();

struct TuneOutput {
  nlohmann::json device;  // backend, name, versions
  nlohmann::json executor = native_executor_json();
  std::string workload_name, workload_path, workload_digest, workload_source;
  std::string strategy;
  double budget_seconds = 0;
  double grad_clip = 0;
  SearchReport report;
  std::optional<Ranked> baseline;  // the workload's own configuration (or --versus's), measured
  // --versus: what the baseline is and how it was found ({name, how, ...}); null: the workload's own.
  nlohmann::json versus;
  bool confirmed = false;          // best and baseline measured again, interleaved, after the search
  std::optional<Speedup> speedup;  // absent: from best and baseline as measured, in separate trials
  std::optional<RaceReport> race;  // the finalists' race, when one was run
  double noise_margin = 0.01;
  bool interrupted = false;
  // Data parallelism: the candidates hold one rank's share of the batch; the output speaks of all
  // `ranks` (global batch, DeepSpeed's train_batch_size, Lightning's devices).
  int64_t ranks = 1;
  nlohmann::json prediction;  // autotune --predict (distributed.h), or null
  // An entry on ranks: the chosen configuration's step profiled for the communication it waits for
  // ({share, step_seconds, exposed_seconds, communication_seconds, rank_shares, steps, how}), or null.
  nlohmann::json communication;
  // Where a step's time goes, from steps timed part by part apart from the samples speed is judged on (the
  // worker's "split"): {chosen: {parts: {data, forward_backward, optimizer, communication, sync} in ms and % of the
  // step, step_ms, steps, config}, own: ...}, or null.
  nlohmann::json time_split;
  // The chosen loader's settings as the worker ran them ({num_workers, prefetch_factor, persistent_workers,
  // pin_memory, cpu_threads}), or null (then taken from the choice's switches, where it has data switches).
  nlohmann::json dataloader;
  // The global batches searched (one rank's share with --ranks) and where they came from, and the
  // workload's own global batch.
  GlobalBatchPlan global_batches;
  int64_t pinned_micro_batch = 0;  // --micro-batch (0: searched)
  int64_t workload_global_batch = 0;
  // Why the choice is what it is where a rule other than "the fastest" decided it (a tie in the race went to
  // the simpler configuration; without a race verdict, the workload's own was kept or left): "" otherwise.
  std::string choice_note;
  nlohmann::json budget_spent;  // {set_up_seconds, search_seconds, race_seconds, ...}, or null
  std::string command;       // how autotune was called (the page shows it: the command that tunes again)
  std::string journal_path;  // the tune's journal: every trial (autotune --report --from finds it here)
};

// "searching global batches 4, 8 and 16 (the workload's global_range [4, 16]; ...)": said before the search.
std::string searched_batches_text(const GlobalBatchPlan& plan, int64_t ranks);
// The global batches searched, the best samples/s the search measured at each, which one the choice
// has and why, and that a larger global batch is not free for convergence (--batch pins one).
std::string global_batch_note(const TuneOutput& out);

nlohmann::json to_json(const TuneOutput& out);
std::string emit(const TuneOutput& out, OutFormat format);

// `autotune --compare`: configurations from tuned files, measured interleaved, each against the first.
struct CompareOutput {
  nlohmann::json device;
  nlohmann::json executor = native_executor_json();
  std::string workload_name, workload_path, workload_digest;
  std::vector<std::string> files;
  std::vector<Candidate> configs;  // one per file
  std::vector<std::size_t> raced;  // per file: its finalist in `race` (files holding one configuration share it)
  std::optional<RaceReport> race;  // absent when every file holds the same configuration
  double noise_margin = 0.01, level = 0.95;
  bool interrupted = false;
  // Every configuration is within noise of the first: over enough rounds for a verdict, no paired
  // interval excludes 1 by the noise margin either way (or every file holds the same configuration).
  bool within_noise() const;
};

nlohmann::json to_json(const CompareOutput& out);
std::string emit(const CompareOutput& out, OutFormat format);  // yaml or json

}  // namespace tb::tune

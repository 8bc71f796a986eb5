// autotune's plan, before any trial runs: the global batches, the executor (capped at --memory-limit), the
// search space, what --predict and the output keep of the budget, the race's settings, and what is refused.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/registry.h"
#include "step/step.h"
#include "step/workload.h"
#include "tuner/autotune.h"
#include "tuner/autotune_parts.h"
#include "tuner/distributed.h"
#include "tuner/emit.h"
#include "tuner/entry.h"
#include "tuner/journal.h"
#include "tuner/race.h"
#include "tuner/search.h"
#include "tuner/trial.h"

namespace tb::tune {
namespace {

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) bytes /= 1024, ++u;
  std::ostringstream out;
  out << std::fixed << std::setprecision(bytes < 10 ? 1 : 0) << bytes << " " << units[u];
  return out.str();
}

// --batch, --batch-range, or the workload's global_range: the global batches searched (search.h).
GlobalBatchPlan global_batches(const step::Workload& w, int64_t batch, const std::string& range) {
  BatchRange option;
  if (!range.empty()) {
    const auto colon = range.find(':');
    double a = 0, b = 0;
    if (colon == std::string::npos || !parse_number(range.substr(0, colon), a) ||
        !parse_number(range.substr(colon + 1), b) || a < 1 || b < a || a != std::floor(a) || b != std::floor(b))
      throw UsageError("--batch-range '" + range + "': expected A:B with 1 <= A <= B, e.g. 32:256");
    option = {static_cast<int64_t>(a), static_cast<int64_t>(b)};
  }
  return plan_global_batches(w.batch.global, {w.batch.global_min, w.batch.global_max}, batch, option);
}

// The trials as `inner` runs them, planned for at most `limit` bytes: the memory model's wall, the
// largest micro-batch probed and the finalists that may be chosen all stop there (a GPU smaller than
// this one, or what a shared host can spare).
class MemoryCapped final : public Executor {
 public:
  MemoryCapped(std::unique_ptr<Executor> inner, int64_t limit) : inner_(std::move(inner)), limit_(limit) {}
  TrialResult run(const Candidate& candidate, const MeasurePolicy& policy) override {
    return inner_->run(candidate, policy);
  }
  int64_t memory_capacity() const override { return std::min(limit_, inner_->memory_capacity()); }

 private:
  std::unique_ptr<Executor> inner_;
  int64_t limit_;
};

// The user's own model (--entry): every candidate in the tune's one worker (entry.h, worker.h), the one the
// entry was validated in.
TrialRunner entry_runner(std::unique_ptr<EntryExecutor> entry) {
  const EntryProbe& p = entry->probe();
  TrialRunner r;
  r.description = {{"name", "torch-entry"},
                   {"step", "the user's own PyTorch model, trainbench's loop (--entry), in one worker for the tune"},
                   {"entry", p.spec},
                   {"torch", p.torch.torch_version},
                   {"python", p.torch.python_version},
                   {"interpreter", p.torch.python}};
  r.journal_tag = " torch-entry " + p.torch.torch_version;
  if (entry->distributed()) {
    r.description["step"] =
        "the user's own PyTorch model, trainbench's loop (--entry) in DistributedDataParallel, in one "
        "group of ranks (torchrun) for the tune";
    r.description["ranks"] = entry->ranks();
    r.description["launcher"] = entry->launcher();
    r.journal_tag += " ranks " + std::to_string(entry->ranks());
  }
  r.torch = true;
  r.worker = &entry->worker_stats();
  r.entry = entry.get();
  r.executor = std::move(entry);
  return r;
}

// What --predict's all-reduce probe takes (start-up of the ranks, two warm-up and seven timed calls).
constexpr double kProbeSeconds = 5.0;

// Refused before anything runs: a workload that cannot fit even at micro-batch 1 (with activation
// checkpointing where it can be switched on, and fused attention where it can be chosen).
void refuse_workload_that_cannot_fit(const TunePlan& plan, int64_t memory_limit) {
  Candidate smallest = plan.own;
  smallest.micro_batch = 1;
  const auto has_value = [&](const char* name, const char* value) {
    const auto it = plan.space.switches.find(name);
    return it != plan.space.switches.end() && std::find(it->second.begin(), it->second.end(), value) != it->second.end();
  };
  const bool with_ckpt = has_value("activation_checkpointing", "on");
  if (with_ckpt) smallest.switches["activation_checkpointing"] = "on";
  if (has_value("attention", "fused")) smallest.switches["attention"] = "fused";
  const double need = step::estimate_bytes(apply(plan.workload, smallest));
  const auto capacity = static_cast<double>(plan.runner.executor->memory_capacity());
  if (need > capacity)
    throw UsageError(plan.workload.name + " needs about " + human_bytes(need) + " at micro-batch 1" +
                     (with_ckpt ? " with activation checkpointing" : "") +
                     (memory_limit > 0 && capacity == static_cast<double>(memory_limit)
                          ? "; --memory-limit allows " + human_bytes(capacity)
                          : "; this " + (plan.machine.use_cuda ? "GPU has " + human_bytes(capacity) + " for a step"
                                                               : "CPU has " + human_bytes(capacity) + " free")));
}

}  // namespace

TrialRunner make_runner(const std::string& which, const step::Workload& workload, const Machine& machine, int64_t ranks,
                        const std::vector<std::string>& launcher, bool independent, int64_t memory_limit) {
  TrialRunner r;
  if (which == "torch") {
    auto torch = std::make_unique<TorchExecutor>(workload, machine.use_cuda, machine.device, &stop_requested, memory_limit);
    const TorchProbe& p = torch->probe();
    r.description = {{"name", "torch"},
                     {"step", "the PyTorch twin of the step (scripts/torch-step), in one worker for the tune"},
                     {"torch", p.torch_version},
                     {"python", p.python_version},
                     {"interpreter", p.python}};
    r.worker = &torch->worker_stats();
    r.journal_tag = " torch " + p.torch_version;
    r.torch = true;
    r.executor = std::move(torch);
  } else {
    r.description = native_executor_json();
    r.executor = std::make_unique<ProcessExecutor>(std::filesystem::read_symlink("/proc/self/exe").string(), workload.path,
                                                   machine.use_cuda, machine.device, &stop_requested, ranks, launcher,
                                                   independent);
    if (ranks > 1) {
      r.description["ranks"] = ranks;
      r.description["launcher"] = launcher;
      if (independent) r.description["independent_ranks"] = true;
      r.journal_tag = std::string(independent ? " independent" : "") + " ranks " + std::to_string(ranks);
    }
  }
  return r;
}

std::string file_text(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// --predict's share of the budget, kept from the trials: the probe and, where the ranks are at hand, the check
// run of the prediction (one trial). An entry's ranks start torch under torchrun for each, and the check run's
// ranks validate the entry again before its trial.
double predict_reserve(const AutotuneOptions& options, const TunePlan& plan, const TrialEstimate& shortest) {
  if (!options.predict) return 0.0;
  const bool check_run = options.ranks <= options.probe_ranks;
  double seconds = kProbeSeconds + (check_run ? options.trial_seconds + shortest.seconds : 0.0);
  if (plan.entry)
    seconds += plan.entry->torch.import_seconds * (check_run ? 2 : 1) + (check_run ? plan.entry->probe_seconds : 0.0);
  return seconds;
}

// An entry's step split into its parts after the race, for the choice and its own configuration (time_split_step),
// and on ranks the profile of the choice's communication (profile_communication_step): each opens a candidate in the
// running worker and steps it for about a second, `slice` (Tune::slice_floor) plus that second each.
double profile_reserve(const AutotuneOptions& options, const TunePlan& plan, double slice) {
  if (!plan.entry) return 0.0;
  const double split = plan.entry->switches.count("num_workers") ? kLoaderSplitSeconds : kSplitSeconds;
  const bool profiled = options.ranks > 1 && !options.predict;
  return (profiled ? 3 : 2) * slice + 2 * split + (profiled ? kSplitSeconds : 0.0);
}

// Kept back from the trials: the output, and the exit of a trial stopped at the budget's end.
double output_reserve(double budget) { return kill_grace_seconds + std::min(2.0, 0.05 * budget); }

// Refused before anything runs: a budget too small for one trial of `c`.
void refuse_budget_below_one_trial(const step::Workload& workload, const Candidate& c, const TrialEstimate& shortest,
                                   const MeasurePolicy& measure, double budget, double elapsed) {
  if (shortest.seconds <= budget - output_reserve(budget) - elapsed) return;
  // The smallest B with B - grace - min(2, 0.05 B) >= the trial (and what this took so far).
  const double t = shortest.seconds + elapsed + kill_grace_seconds;
  const double smallest_budget = t / 0.95 <= 40 ? t / 0.95 : t + 2;
  std::ostringstream why;
  why << std::fixed << std::setprecision(1) << "--budget " << budget << " is below one trial of " << workload.name
      << " on this machine: about " << std::ceil(smallest_budget) << " s at the least (" << shortest.step_flops / 1e9
      << " GFLOP a step at " << shortest.flop_rate / 1e9 << " GFLOP/s, " << shortest.rate_source
      << "; set-up, the checked step, " << warmup_steps(apply(workload, c)) << " warm-up and " << measure.min_steps
      << " measured steps); give at least that";
  throw UsageError(why.str());
}

double slice_seconds_for(double trial_seconds, bool pipelined) {
  const double slice = std::max(kSliceShare * trial_seconds, std::min(trial_seconds, 1.0));
  return pipelined ? std::max(slice, std::min(trial_seconds, kLoaderSliceSeconds)) : slice;
}

// The race's settings and its progress lines on stderr.
RaceOptions race_options(const SearchOptions& search, int rounds, double trial_seconds, std::function<double()> seconds_left,
                         double min_trial_seconds, std::function<double()> elapsed, double budget) {
  RaceOptions o;
  o.max_rounds = rounds;
  o.min_rounds_to_drop = kMinRoundsToDrop;
  o.noise_margin = search.noise_margin;
  o.level = kLevel;
  o.slice = search.measure;
  o.slice.max_seconds = slice_seconds_for(trial_seconds);
  o.pipelined_slice_seconds = slice_seconds_for(trial_seconds, true);
  o.slice.stop_below = 0;  // a slice measures fully: the race, not the slice, decides who is behind
  o.seconds_left = std::move(seconds_left);
  o.min_trial_seconds = min_trial_seconds;
  o.on_round = [](int round, int max_rounds, std::size_t racing) {
    std::cerr << "autotune: racing " << racing << " finalists interleaved, round " << round << "/" << max_rounds
              << std::endl;
  };
  o.on_slice = [elapsed, budget, rounds](int round, const Candidate& c, const TrialResult& r) {
    if (stop_requested) throw Interrupted{};
    std::cerr << "autotune: [race round " << round << "/" << rounds << ", " << human_seconds(elapsed()) << " of "
              << human_seconds(budget) << " budget] " << describe(c) << " -> " << result_text(r) << std::endl;
  };
  o.on_drop = [](int round, const Candidate& c, const std::string& why) {
    std::cerr << "autotune: dropped after round " << round << ": " << describe(c) << ": " << why << std::endl;
  };
  return o;
}

void share_batches_over_ranks(const AutotuneOptions& options, step::Workload& workload, GlobalBatchPlan& batches) {
  const int64_t ranks = options.ranks;
  if (ranks <= 1) return;
  const std::string ranks_text = "--ranks " + std::to_string(ranks);
  // The user's batches must split over the ranks; of the workload's range, those that do are searched.
  std::vector<int64_t> shares;
  for (const int64_t g : batches.batches) {
    if (g % ranks == 0) shares.push_back(g / ranks);
    else if (!options.batch_range.empty() || options.batch > 0)
      throw UsageError(ranks_text + ": the global batch " + std::to_string(g) + " is not a multiple of the ranks");
  }
  if (shares.size() < batches.batches.size())
    std::cerr << "autotune: of " << batches.source << ", only the global batches that are multiples of " << ranks
              << " ranks are searched" << std::endl;
  if (shares.empty())
    throw UsageError(ranks_text + ": no global batch of " + batches.source + " is a multiple of the ranks (give --batch)");
  batches.batches = shares;
  if (workload.batch.global % ranks != 0)
    throw UsageError(ranks_text + ": " + workload.name + "'s batch " + std::to_string(workload.batch.global) +
                     " is not a multiple of the ranks (give --batch)");
  workload.batch.global /= ranks;
  workload.batch.micro = std::min(workload.batch.micro, workload.batch.global);
  while (workload.batch.global % workload.batch.micro) --workload.batch.micro;
  workload.distributed.ranks = options.predict ? 1 : ranks;
  if (options.predict && !options.entry.empty())
    std::cerr << "autotune: predicting " << ranks << " ranks: one rank's share (" << workload.batch.global
              << " of each step's samples) tuned in one process here (no DDP, so its switches are not searched); "
              << "the all-reduce measured after on " << std::min(ranks, options.probe_ranks)
              << " ranks of torch.distributed" << std::endl;
  else if (options.predict)
    std::cerr << "autotune: predicting " << ranks << " ranks: one rank's share (" << workload.batch.global
              << " of each step's samples) measured as " << std::min(ranks, options.probe_ranks)
              << " independent ranks here (each its own step, no all-reduce; the slowest rank's time)" << std::endl;
}

// --micro-batch N: the one micro-batch of every candidate; each global batch searched (one rank's share with --ranks)
// must be micro-batches of N.
void pin_micro_batch(const AutotuneOptions& options, TunePlan& plan) {
  const int64_t m = options.micro_batch;
  if (m <= 0) return;
  for (const int64_t g : plan.space.global_batches)
    if (g % m != 0)
      throw UsageError("--micro-batch " + std::to_string(m) + " does not divide the global batch " +
                       std::to_string(g * options.ranks) +
                       (options.ranks > 1 ? "'s share of each of " + std::to_string(options.ranks) + " ranks (" +
                                                std::to_string(g) + ")"
                                          : std::string()));
  plan.space.micro_batches = {m};
  plan.workload.batch.micro = m;  // the workload's own configuration, at that micro-batch
}

SearchSpace search_space(const std::string& switch_list, const std::map<std::string, std::vector<std::string>>& available,
                         const std::string& backend) {
  SearchSpace space;
  if (switch_list.empty()) {
    space.switches = available;
  } else if (switch_list != "none") {
    std::stringstream list(switch_list);
    std::string name;
    while (std::getline(list, name, ',')) {
      if (!available.count(name)) {
        std::string names;
        for (const auto& kv : available) names += (names.empty() ? "" : ", ") + kv.first;
        throw UsageError("--switches: '" + name + "' is not a switch of this workload on " + backend +
                         " (available: " + names + ")");
      }
      space.switches[name] = available.at(name);
    }
  }
  for (const char* name : {"activation_checkpointing", "attention"})
    if (space.switches.count(name)) space.memory_switches.push_back(name);
  // Switches left out keep the workload's own value.
  for (const auto& [name, values] : available)
    if (!space.switches.count(name)) space.switches[name] = {values.front()};
  return space;
}

TunePlan plan_tune(const AutotuneOptions& options, const BudgetClock& clock) {
  TunePlan plan;
  if (options.entry.empty()) plan.workload = step::load_workload(options.workload);  // a bad file: UsageError
  plan.machine = pick_machine(options.gpu);
  const Machine& machine = plan.machine;
  std::unique_ptr<EntryExecutor> entry;
  if (!options.entry.empty()) {  // validated in the tune's worker before anything runs (a bad one: UsageError)
    const int64_t g = options.batch > 0 ? options.batch : kEntryDefaultBatch;
    // Under the budget, as a trial is: a probe that hangs (a build that never returns) is stopped at its end.
    // --predict: the trials run one rank's share in one worker; the ranks at hand measure the all-reduce after.
    const int64_t worker_ranks = options.predict ? 1 : options.ranks;
    if (options.ranks > 1) {
      const std::string why = entry_ranks_unavailable_reason(
          options.predict ? std::min(options.ranks, options.probe_ranks) : options.ranks, machine.use_cuda);
      if (!why.empty())
        throw UsageError(why + (options.predict ? " (--predict measures the all-reduce on min(N, --probe-ranks) ranks)"
                                                : ""));
    }
    // --predict on the CPU: one rank's share in one process with the threads torchrun gives each of its ranks,
    // not every core: the ranks share the cores
    const int threads = options.predict && options.ranks > 1 && !machine.use_cuda ? torchrun_rank_threads() : 0;
    entry = std::make_unique<EntryExecutor>(options.entry, machine.use_cuda, machine.device,
                                            options.predict ? g / options.ranks : g, &stop_requested, options.memory_limit,
                                            std::max(options.budget - clock.elapsed(), 1.0), worker_ranks,
                                            worker_ranks > 1 || !options.torchrun.empty()
                                                ? torchrun_arguments(options.torchrun, worker_ranks)
                                                : std::vector<std::string>{},
                                            threads);
    plan.entry = entry->probe();
    plan.workload = entry_workload(*plan.entry, g);
  }
  plan.batches = global_batches(plan.workload, options.batch, options.batch_range);
  if (options.ranks > 1 && entry) {  // torchrun's ranks: the candidates hold one rank's share, as the native ones
    share_batches_over_ranks(options, plan.workload, plan.batches);
  } else if (options.ranks > 1) {
    const std::string why = ranks_unavailable_reason(options.ranks, machine.use_cuda, options.predict, options.launcher);
    if (!why.empty()) throw UsageError(why);
    plan.launcher = launcher_argv(options.launcher);
    allow_mpirun_as_root();
    share_batches_over_ranks(options, plan.workload, plan.batches);
  }
  const int64_t trial_ranks = options.predict ? std::min(options.ranks, options.probe_ranks) : options.ranks;
  plan.runner = entry ? entry_runner(std::move(entry))
                      : make_runner(options.executor, plan.workload, machine, trial_ranks, plan.launcher, options.predict,
                                    options.memory_limit);
  if (options.memory_limit > 0) {
    plan.runner.executor = std::make_unique<MemoryCapped>(std::move(plan.runner.executor), options.memory_limit);
    plan.runner.description["memory_limit_bytes"] = options.memory_limit;
  }
  plan.space = search_space(options.switches,
                            plan.entry ? plan.entry->switches : available_switches(plan.workload, machine.use_cuda),
                            machine.backend);
  // An entry's cuda_graphs on a CPU is only ever refused: tried when --switches names it, to see why.
  if (plan.entry && !machine.use_cuda && options.switches.empty() && plan.space.switches.count("cuda_graphs"))
    plan.space.switches["cuda_graphs"] = {plan.entry->switches.at("cuda_graphs").front()};
  if (plan.entry) plan.space.applies_when = plan.entry->applies_when;
  // On ranks DDP's and FSDP2's switches first: each is tried where it applies before the budget goes to the others
  if (plan.entry && options.ranks > 1 && !options.predict)
    plan.space.tried_first = {"parallel", "no_sync", "static_graph", "bucket_mb", "gradient_as_bucket_view"};
  plan.space.global_batches = plan.batches.batches;
  pin_micro_batch(options, plan);
  plan.workload_digest = digest(plan.entry ? entry_digest_text(*plan.entry) : file_text(plan.workload.path));
  plan.own = own_candidate(plan.workload, plan.space);
  if (!plan.entry) refuse_workload_that_cannot_fit(plan, options.memory_limit);
  return plan;
}

}  // namespace tb::tune

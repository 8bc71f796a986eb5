// autotune: the best batch / micro-batch / accumulation and switches for a workload on this GPU (or
// CPU). The configuration goes to stdout (`autotune --gpu auto > tuned.yaml`), progress to stderr.
// After the search, its finalists and the workload's own configuration are raced interleaved
// (race.h), and a speedup is claimed only where that comparison holds it. `autotune --compare A B`
// races the choices of tuned files against each other. `--executor torch` measures every trial in the
// PyTorch twin of the step (trial.h's TorchExecutor) instead of the C++ step; with `--entry`, the user's
// own PyTorch model (entry.h's EntryExecutor).
// Exit codes: 0 a configuration was chosen (or compared), 1 none ran successfully, 2 bad usage, 128 + the
// signal when stopped by SIGINT, SIGTERM or SIGHUP (130, 143, 129: the best so far and the journal are still
// written). The steps are in autotune.h.
#include "tuner/autotune.h"

#include <CLI/CLI.hpp>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <climits>
#include <cstdlib>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "runtime/files.h"
#include "runtime/stats.h"
#include "runtime/device_info.h"
#include "runtime/error.h"
#include "runtime/registry.h"
#include "step/step.h"
#include "step/workload.h"
#include "tuner/emit.h"
#include "tuner/entry.h"
#include "tuner/journal.h"
#include "tuner/race.h"
#include "runtime/comm.h"
#include "tuner/distributed.h"
#include "tuner/trial.h"

namespace tb::tune {
namespace {

std::atomic<bool> stop_requested{false};
volatile std::sig_atomic_t stop_signal = 0;  // the first signal that asked, 0: none

struct Interrupted {};

// SIGINT (Ctrl-C), SIGTERM (a job scheduler's stop, `timeout`, CI's limit) and SIGHUP (the terminal gone) stop a
// tune alike, in every phase: the trial or slice in flight is stopped (its process group killed and waited for,
// the worker's too), and the best so far and the journal are written before autotune exits 128 + the signal.
// Without SA_RESTART, a blocking wait returns at once and its loop sees the stop; a second signal changes nothing.
void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = [](int signal) {
    if (!stop_signal) stop_signal = signal;
    stop_requested = true;
  };
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;
  for (const int signal : {SIGINT, SIGTERM, SIGHUP}) sigaction(signal, &action, nullptr);
}

int interrupted_exit_code() { return 128 + (stop_signal ? static_cast<int>(stop_signal) : SIGINT); }

std::string stop_signal_name() {
  switch (stop_signal) {
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "SIGINT";
  }
}

constexpr const char* examples = R"(
Examples:
  autotune --gpu auto > tuned.yaml                       the small-GPT preset on the first GPU (or the CPU), at
                                                         the global batches of its global_range (4, 8, 16)
  autotune --workload small_gpt --batch 4                its own global batch only (convergence decided elsewhere)
  autotune --workload sem_v55 --batch-range 2048:8192    every global batch from 2048 to 8192 (powers of 2)
  autotune --workload my_model.yaml --budget 600 --format deepspeed --out ds_config.json
  autotune --workload small_gpt --format hf --out training_args.json   TrainingArguments(**json.load(f))
  autotune --workload t4_transformer --switches optimizer,sync --strategy grid
  autotune --workload tiny --gpu cpu --journal tune.jsonl --resume   go on where an interrupted tune stopped
  autotune --compare a.yaml b.yaml --gpu cpu             two tunes' choices raced interleaved: within noise?
  autotune --workload small_gpt --gpu cpu --executor torch > torch.yaml   tuned in the PyTorch twin of the step
  autotune --compare native.yaml torch.yaml --executor torch   both choices raced in PyTorch
  autotune --compare tuned.yaml --executor native,torch    the C++ step against its PyTorch twin, one configuration
  autotune --executor torch --entry my_train.py:build --batch 64   your own PyTorch model (README: --entry)
  autotune --executor torch --entry 'hf:gpt2?n_layer=4&n_embd=256' --format hf --out training_args.json
  autotune --entry hf:gpt2 --batch 64 --versus largest-batch   the choice raced against the largest batch that fits

Presets: tuner/workloads/*.yaml (the source reports' pipelines). Switches: optimizer, attention (fused
frees the T^2 probabilities, so a larger micro-batch fits), sync, activation_checkpointing, lazy_cg (with a
propagator), bf16_matmuls and cuda_graphs (GPU only).

After the search, its choice, the candidates within noise of it and the next fastest (four at most), the
fastest with each switch value not among those, the choice's switches at half and twice its micro-batch,
and the workload's own configuration are raced: measured in rounds, one short trial of each a round in a
rotating order, compared on their per-round ratios (which the machine's drift between rounds does not
move), and the ones behind the leader beyond noise dropped. A speedup over the workload's own
configuration is claimed only when that paired interval excludes 1 by the noise margin (1%).
)";

std::string human_seconds(double s) {
  std::ostringstream out;
  if (s >= 60)
    out << static_cast<int>(s / 60) << "m" << std::setw(2) << std::setfill('0') << static_cast<int>(s) % 60 << "s";
  else out << std::fixed << std::setprecision(1) << s << "s";
  return out.str();
}

// --ranks: the candidates hold one rank's share of the batch; progress lines speak of all ranks.
int64_t described_ranks = 1;

std::string describe(const Candidate& c) {
  std::ostringstream out;
  out << "batch " << c.global_batch * described_ranks << " = " << c.micro_batch << " x " << c.accumulation();
  if (described_ranks > 1) out << " x " << described_ranks << " ranks";
  for (const auto& [k, v] : c.switches) out << ", " << k << "=" << v;
  return out.str();
}

std::string result_text(const TrialResult& r) {
  std::ostringstream out;
  if (!r.ok()) return std::string(to_string(r.cls)) + ": " + r.message;
  const double mib = static_cast<double>(r.peak_bytes) / (1 << 20);
  out << std::fixed << std::setprecision(1) << r.samples_per_s << " samples/s (" << r.ci_low << "-" << r.ci_high
      << "), peak " << (mib >= 1024 ? mib / 1024 : mib) << (mib >= 1024 ? " GiB" : " MiB");
  return out.str();
}

// The best of what has run, for an interrupted search: the fastest, ties (within noise) to the one
// with less memory.
SearchReport best_so_far(const std::vector<Ranked>& trials, double noise) {
  SearchReport rep;
  rep.trials = trials;
  for (const auto& t : trials) {
    if (!t.result.ok()) continue;
    if (!rep.found || t.result.samples_per_s > rep.best.result.samples_per_s) rep.best = t;
    rep.found = true;
  }
  if (!rep.found) return rep;
  for (const auto& t : trials)
    if (t.result.ok() && t.result.samples_per_s >= (1 - noise) * rep.best.result.samples_per_s &&
        t.result.peak_bytes < rep.best.result.peak_bytes)
      rep.best = t;
  return rep;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) bytes /= 1024, ++u;
  std::ostringstream out;
  out << std::fixed << std::setprecision(bytes < 10 ? 1 : 0) << bytes << " " << units[u];
  return out.str();
}

// Where the journal goes when --journal does not say: beside --out (tuned.yaml ->
// tuned.autotune.jsonl), else in the user's cache, keyed by the workload's digest and the device, so
// that --resume finds it again and no run litters the current directory.
std::string default_journal_path(const std::string& out_path, const std::string& workload_name, const std::string& backend,
                                 const std::string& key) {
  namespace fs = std::filesystem;
  if (!out_path.empty()) {
    fs::path p(out_path);
    return (p.parent_path() / (p.stem().string() + ".autotune.jsonl")).string();
  }
  const std::string cache = cache_dir();
  const fs::path dir = cache.empty() ? fs::temp_directory_path() / "trainbench" : fs::path(cache);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw UsageError("cannot create the journal folder " + dir.string() + ": " + ec.message() + " (give --journal FILE)");
  // The workload's name is the user's (a YAML's `name:`): one safe file name, so that it stays in the folder.
  return (dir / (safe_file_name(workload_name) + "." + backend + "." + key.substr(0, 12) + ".autotune.jsonl")).string();
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

// The race of the finalists after the search (race.h): its defaults.
// The search's choice and at most three more, the workload's own configuration besides: the race
// drops the ones clearly behind after kMinRoundsToDrop rounds, so a round of five is paid three times.
constexpr std::size_t kMaxSearchFinalists = 4;
constexpr int kMinRoundsToDrop = PairedRounds::kMinRoundsForVerdict;
// A slice measures this share of --trial-seconds, at least a second (or all of it): the race's verdict rests on
// the rounds' ratios, so more rounds of short slices tell more than few long ones.
constexpr double kSliceShare = 0.1;
// The race decides the claim: the time of kMinRoundsToDrop rounds of kExpectedFinalists is kept for it from the
// start of the search, at most this share of what is left after the workload's own trial (measured: small_gpt's
// slices of 0.2-0.75 s steps take about 4 s, and 3 rounds of 6 finalists then 75 s of a 120 s budget).
constexpr double kRaceShare = 0.7;
// The search's, the workload's own, a switch value none of those has, the choice's neighbouring micro-batches.
constexpr double kExpectedFinalists = kMaxSearchFinalists + 4;
// Without a race verdict, a search's choice other than the workload's own must beat it by more than the drift
// between trials; where no candidate was measured twice, this (a shared machine's run-to-run spread, 10-20%).
constexpr double kDefaultTrialDrift = 0.15;
constexpr double kLevel = 0.95;  // of every interval the race reports

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

TrialRunner make_runner(const std::string& which, const step::Workload& workload, const Machine& machine, int64_t ranks = 1,
                        const std::vector<std::string>& launcher = {}, bool independent = false, int64_t memory_limit = 0) {
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

std::string file_text(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// What --predict's all-reduce probe takes (start-up of the ranks, two warm-up and seven timed calls).
constexpr double kProbeSeconds = 5.0;
// The least an entry's check run of --predict is given to start its ranks and validate the entry there, when the
// budget has less left: the search's choice is not left unchecked for a second or two.
constexpr double kEntryCheckRunSeconds = 60.0;

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

// An entry on ranks: the profile of the choice's communication after the race (profile_communication_step), about
// a trial's shortest (its set-up, warm-up and two steps).
double profile_reserve(const AutotuneOptions& options, const TunePlan& plan, const TrialEstimate& shortest) {
  return plan.entry && options.ranks > 1 && !options.predict ? shortest.seconds : 0.0;
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

double slice_seconds_for(double trial_seconds) {
  return std::max(kSliceShare * trial_seconds, std::min(trial_seconds, 1.0));
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

// The finalists: the search's choice, its ties (runners-up), then the next fastest candidates by their
// best trial while there is room (kMaxSearchFinalists in all), then for each value of a switch that no
// finalist has yet, the fastest candidate with it, and the workload's own configuration when its trial
// ran (eligible to be chosen when it kept the memory headroom). The next fastest join however far
// behind they measured: a trial's interval covers the noise within it, not the drift between trials
// minutes apart (25% on the issue's machine, 20x for seconds at a time on a busy 2-core one), so the
// search's best may be one lucky trial; the race drops whoever is behind. Each switch value races
// because a slow spell of the machine during the few trials of one value (measured here: every
// configuration 25% slower for a few seconds) would otherwise keep it out for good, and a second tune
// without that spell would choose it.
std::vector<RaceEntrant> finalists(const SearchReport& rep, const Ranked& own, double memory_limit,
                                   const std::vector<std::string>& memory_switches) {
  std::vector<RaceEntrant> out;
  std::set<std::string> keys;
  auto add = [&](const Ranked& r, bool eligible, const std::string& why) {
    if (keys.insert(r.candidate.key()).second) out.push_back(RaceEntrant{r.candidate, r.result, eligible, why});
  };
  auto fits = [&](const TrialResult& r) { return r.ok() && static_cast<double>(r.peak_bytes) <= memory_limit; };
  add(rep.best, true, "choice");
  for (const auto& r : rep.runners_up)
    if (out.size() < kMaxSearchFinalists) add(r, true, "tie");
  std::map<std::string, Ranked> fastest;  // each candidate's fastest trial
  for (const auto& t : rep.trials) {
    if (!fits(t.result)) continue;
    auto [it, fresh] = fastest.try_emplace(t.candidate.key(), t);
    if (!fresh && t.result.samples_per_s > it->second.result.samples_per_s) it->second = t;
  }
  std::vector<Ranked> next;
  for (const auto& [key, t] : fastest) next.push_back(t);
  std::sort(next.begin(), next.end(),
            [](const Ranked& a, const Ranked& b) { return a.result.samples_per_s > b.result.samples_per_s; });
  for (const auto& t : next)
    if (out.size() < kMaxSearchFinalists) add(t, true, "next fastest");
  for (const auto& t : next)  // fastest first: the first trial with a value missing is its best
    for (const auto& [name, value] : t.candidate.switches) {
      const bool present = std::any_of(out.begin(), out.end(), [&, &name = name, &value = value](const RaceEntrant& e) {
        const auto it = e.candidate.switches.find(name);
        return it != e.candidate.switches.end() && it->second == value;
      });
      if (!present) add(t, true, "best " + name + "=" + value);
    }
  // The choice's switches at half and twice its micro-batch, and at the micro-batch of every finalist
  // so far. The search does not try again a micro-batch step that one trial under other switches
  // measured worse, and one trial is one draw of the machine's drift: two tunes then settled on
  // neighbouring micro-batches 10% apart; and a micro-batch that ran fast under other switches is
  // never tried with the choice's when it is two steps away (measured: a tune chose 4 x 4 with fused
  // AdamW, never having run 16 x 1 with it, 6% faster, while its 16 x 1 with per-tensor AdamW raced).
  // A neighbour joins where a trial at its micro-batch with the same memory switches kept the
  // headroom, so that it fits too; never measured, it races on that trial's set-up time.
  const Candidate& best = rep.best.candidate;
  std::vector<int64_t> micro_batches{best.micro_batch / 2, best.micro_batch * 2};
  for (const auto& e : out)
    if (std::find(micro_batches.begin(), micro_batches.end(), e.candidate.micro_batch) == micro_batches.end() &&
        e.candidate.micro_batch != best.micro_batch)
      micro_batches.push_back(e.candidate.micro_batch);
  auto same_memory = [&](const Candidate& a, const Candidate& b) {
    return std::all_of(memory_switches.begin(), memory_switches.end(), [&](const std::string& name) {
      const auto x = a.switches.find(name), y = b.switches.find(name);
      return (x == a.switches.end()) == (y == b.switches.end()) && (x == a.switches.end() || x->second == y->second);
    });
  };
  for (const int64_t micro : micro_batches) {
    if (micro < 1 || best.global_batch % micro != 0) continue;
    Candidate neighbour = best;
    neighbour.micro_batch = micro;
    const auto fitted = std::find_if(rep.trials.begin(), rep.trials.end(), [&](const Ranked& t) {
      return t.candidate.global_batch == best.global_batch && t.candidate.micro_batch == micro && fits(t.result) &&
             same_memory(t.candidate, neighbour);
    });
    if (fitted == rep.trials.end()) continue;
    const auto measured = fastest.find(neighbour.key());
    add(measured != fastest.end() ? measured->second : Ranked{neighbour, fitted->result}, true,
        "micro-batch " + std::to_string(micro) + " with the choice's switches");
  }
  if (own.result.ok()) add(own, fits(own.result), "own");
  // How far each is from the workload's own configuration: ties in the race go to the simpler.
  for (auto& e : out) {
    const auto compiles = e.candidate.switches.find("compile");
    e.costly = compiles != e.candidate.switches.end() && compiles->second == "on" ? 1 : 0;
    e.changed = e.candidate.micro_batch != own.candidate.micro_batch ? 1 : 0;
    for (const auto& [name, value] : e.candidate.switches) {
      const auto theirs = own.candidate.switches.find(name);
      if (theirs == own.candidate.switches.end() || theirs->second != value) ++e.changed;
    }
  }
  return out;
}

// What the choice is compared with: the workload's own configuration, or --versus's.
std::string baseline_name(const TuneOutput& out) {
  return out.versus.is_null() ? kWorkloadOwnConfig : "the largest-batch configuration";
}

// `--versus largest-batch`: the configuration Lightning's BatchSizeFinder gives (entry.h), found in a
// child, as the baseline the choice races against; `own` takes its micro-batch.
nlohmann::json versus_largest_batch(EntryExecutor& entry, Candidate& own, int64_t memory_capacity, double seconds_left) {
  std::cerr << "autotune: --versus largest-batch: doubling the micro-batch from 1 while a few training steps at it fit, "
               "as Lightning's BatchSizeFinder does (mode power), up to the global batch "
            << own.global_batch << std::endl;
  LargestBatch found;
  try {
    found = entry.largest_batch(own.global_batch, memory_capacity, seconds_left);
  } catch (const std::runtime_error&) {
    if (stop_requested) throw Interrupted{};
    throw;
  }
  if (found.micro_batch < 1)
    throw std::runtime_error("--versus largest-batch: " + entry.probe().label + " does not fit even one sample (" +
                             found.tried.dump() + ")");
  own.micro_batch = found.micro_batch;
  std::cerr << "autotune: the largest batch that fits: micro-batch " << found.micro_batch << " x accumulation "
            << own.accumulation() << " (" << human_seconds(found.seconds) << "); the choice races against it" << std::endl;
  return {{"name", "largest-batch"},
          {"how", "Lightning's BatchSizeFinder (mode power): the micro-batch doubled from 1 while " +
                      std::to_string(found.steps_per_size) +
                      " training steps at it fit in memory, in the entry's own configuration (its optimizer as given, "
                      "fp32), at most the global batch and dividing it; the accumulation makes up the global batch"},
          {"micro_batch", found.micro_batch},
          {"accumulation", own.accumulation()},
          {"search", {{"tried", found.tried}, {"steps_per_size", found.steps_per_size}, {"seconds", found.seconds}}}};
}

// The race's verdict in the output: the choice and the workload's own configuration (or --versus's) as
// the race measured them, the finalists still in as runners-up, and the speedup only where the paired
// rounds hold it.
void take_race(TuneOutput& out, const RaceReport& race, double noise_margin) {
  out.race = race;
  const std::string against = baseline_name(out);
  const std::string own_key = out.baseline->candidate.key();
  auto from_separate_trials = [&](const std::string& why) {
    if (out.baseline->result.ok() && out.baseline->result.samples_per_s > 0)
      out.speedup = speedup_from_separate_trials(out.report.best.result.samples_per_s / out.baseline->result.samples_per_s,
                                                 why);
  };
  if (race.choice < 0) {
    if (out.report.best.candidate == out.baseline->candidate) out.speedup = speedup_of_own_choice(against);
    else from_separate_trials("the race measured no round: " + race.ended);
    return;
  }
  const auto chosen = static_cast<std::size_t>(race.choice);
  out.report.best = Ranked{race.finalists[chosen].candidate, race.finalists[chosen].measured(kLevel)};
  out.report.runners_up.clear();
  int own = -1;
  for (std::size_t i = 0; i < race.finalists.size(); ++i) {
    const Finalist& f = race.finalists[i];
    if (f.candidate.key() == own_key) own = static_cast<int>(i);
    else if (i != chosen && !f.dropped_after) out.report.runners_up.push_back(Ranked{f.candidate, f.measured(kLevel)});
  }
  std::sort(out.report.runners_up.begin(), out.report.runners_up.end(),
            [](const Ranked& a, const Ranked& b) { return a.result.samples_per_s > b.result.samples_per_s; });
  out.confirmed = true;
  if (own == race.choice) {
    out.baseline->result = out.report.best.result;
    out.speedup = speedup_of_own_choice(against);
  } else if (own >= 0 && !race.finalists[static_cast<std::size_t>(own)].slices.empty()) {
    out.baseline->result = race.finalists[static_cast<std::size_t>(own)].measured(kLevel);
    out.speedup = speedup_from_rounds(race.compare(chosen, static_cast<std::size_t>(own), kLevel), noise_margin, against);
  } else {
    from_separate_trials(against + " did not run in the race");
  }
}

// Runs each candidate in the executor its "executor" switch names, without that switch: what
// `--compare FILE --executor native,torch` races, the C++ step against its PyTorch twin on one
// configuration, interleaved round by round like any two configurations.
class ByExecutor final : public Executor {
 public:
  explicit ByExecutor(std::map<std::string, std::unique_ptr<Executor>> inner) : inner_(std::move(inner)) {}
  TrialResult run(const Candidate& candidate, const MeasurePolicy& policy) override {
    Candidate plain = candidate;
    const std::string which = plain.switches.at(executor_switch);
    plain.switches.erase(executor_switch);
    return inner_.at(which)->run(plain, policy);
  }
  int64_t memory_capacity() const override {
    int64_t least = INT64_MAX;
    for (const auto& [name, e] : inner_) least = std::min(least, e->memory_capacity());
    return least;
  }
  static constexpr const char* executor_switch = "executor";

 private:
  std::map<std::string, std::unique_ptr<Executor>> inner_;
};

// "native,torch" -> {"native", "torch"}.
std::vector<std::string> executor_names(const std::string& text) {
  std::vector<std::string> names;
  std::stringstream in(text);
  for (std::string name; std::getline(in, name, ',');) names.push_back(name);
  return names;
}

// A tuned file's choice, for --compare.
struct TunedFile {
  std::string path;
  Candidate chosen;
  std::string workload_path, workload_digest;
};

TunedFile read_tuned_file(const std::string& path) {
  TunedFile f;
  f.path = path;
  try {
    const YAML::Node t = YAML::LoadFile(path)["trainbench_autotune"];
    if (!t || !t["chosen"] || !t["chosen"].IsMap())
      throw UsageError(path + ": no trainbench_autotune.chosen in it (autotune writes one with --format yaml or json)");
    f.chosen.global_batch = t["chosen"]["global_batch"].as<int64_t>();
    f.chosen.micro_batch = t["chosen"]["micro_batch"].as<int64_t>();
    f.chosen.switches = t["chosen"]["switches"].as<std::map<std::string, std::string>>();
    f.workload_path = t["workload"]["path"].as<std::string>();
    f.workload_digest = t["workload"]["digest"].as<std::string>();
  } catch (const YAML::Exception& e) {
    throw UsageError(path + ": not a configuration autotune wrote (" + e.what() + ")");
  }
  if (f.chosen.global_batch <= 0 || f.chosen.micro_batch <= 0 || f.chosen.global_batch % f.chosen.micro_batch)
    throw UsageError(path + ": its micro-batch does not divide its global batch");
  return f;
}

// --compare's executor: the one --executor names, or with two (native,torch) each configuration run in
// the executor its "executor" switch names.
TrialRunner compare_runner(const std::vector<std::string>& executors, const std::string& executor_name,
                           const step::Workload& workload, const Machine& machine) {
  std::map<std::string, TrialRunner> runners;
  for (const auto& name : executors) runners.emplace(name, make_runner(name, workload, machine));
  if (executors.size() == 1) return std::move(runners.begin()->second);
  TrialRunner runner;
  std::map<std::string, std::unique_ptr<Executor>> inner;
  runner.description = {{"name", executor_name}};
  for (auto& [name, r] : runners) {
    runner.description[name] = r.description;
    runner.torch = runner.torch || r.torch;
    inner.emplace(name, std::move(r.executor));
  }
  runner.executor = std::make_unique<ByExecutor>(std::move(inner));
  return runner;
}

// Each file's configuration (in each executor), and the entrant in the race each is: files holding
// one configuration share it.
std::vector<RaceEntrant> compare_entrants(const std::vector<TunedFile>& tuned, const std::vector<std::string>& executors,
                                          CompareOutput& out) {
  std::vector<RaceEntrant> entrants;
  for (const auto& t : tuned)
    for (const auto& name : executors) {
      Candidate c = t.chosen;
      std::string label = t.path;
      if (executors.size() > 1) {
        c.switches[ByExecutor::executor_switch] = name;
        label += name == "torch" ? " in the PyTorch twin" : " in the C++ step";
      }
      out.files.push_back(label);
      out.configs.push_back(c);
      std::size_t k = 0;
      while (k < entrants.size() && !(entrants[k].candidate == c)) ++k;
      if (k == entrants.size()) entrants.push_back(RaceEntrant{c, TrialResult{}, true});
      out.raced.push_back(k);
    }
  return entrants;
}

// The compared configurations raced to the end (none is dropped: each is compared, none chosen).
void race_compared(const AutotuneOptions& options, const step::Workload& workload, const Machine& machine,
                   TrialRunner& runner, const std::vector<TunedFile>& tuned, const std::vector<RaceEntrant>& entrants,
                   const BudgetClock& clock, CompareOutput& out) {
  const int rounds = std::max(options.race_rounds, 2);
  const bool both_executors = executor_names(options.executor).size() > 1;
  SearchOptions search;
  search.measure.max_seconds = options.trial_seconds;
  Candidate first = entrants.front().candidate;
  first.switches.erase(ByExecutor::executor_switch);
  TrialEstimate shortest = shortest_trial(apply(workload, first), search.measure.min_steps, machine.use_cuda,
                                          machine.device);
  refuse_budget_below_one_trial(workload, first, shortest, search.measure, options.budget, clock.elapsed());
  const double deadline = options.budget - output_reserve(options.budget);
  if (const std::string notice = take_blas_kernel_notice(); !notice.empty()) std::cerr << notice << std::endl;
  std::cerr << "autotune: comparing " << entrants.size() << " configurations of " << workload.name << " on " << machine.name
            << (both_executors ? " in the C++ step and in its PyTorch twin"
                : runner.torch ? " in the PyTorch twin"
                               : "")
            << ", interleaved, " << options.budget << " s budget" << std::endl;
  for (const auto& t : tuned) std::cerr << "autotune:   " << t.path << ": " << describe(t.chosen) << std::endl;
  RaceOptions ro = race_options(
      search, rounds, options.trial_seconds, [&] { return deadline - clock.elapsed(); }, shortest.seconds,
      [&] { return clock.elapsed(); }, options.budget);
  ro.on_drop = nullptr;  // every configuration is measured to the end: each is compared, none is chosen
  ro.min_rounds_to_drop = rounds + 1;
  try {
    out.race = race(*runner.executor, entrants, ro);
    std::cerr << "autotune: the race ended after " << out.race->rounds << " round" << (out.race->rounds == 1 ? "" : "s")
              << ": " << out.race->ended << std::endl;
  } catch (const Interrupted&) {
    out.interrupted = true;
    std::cerr << "autotune: interrupted by " << stop_signal_name() << "; nothing was compared" << std::endl;
  }
}

// Each comparison's verdict on stderr, as the written output holds it.
void print_comparisons(const CompareOutput& out) {
  const nlohmann::json doc = to_json(out);  // named: the loop below reads inside it
  for (const auto& c : doc["trainbench_autotune_compare"]["comparisons"]) {
    const std::string verdict = c["verdict"], of = c["of"], against = c["against"];
    if (verdict == "same_configuration") std::cerr << "autotune: " << of << " holds the same configuration as " << against;
    else
      std::cerr << "autotune: " << c["note"].get<std::string>() << ": "
                << (verdict == "within_noise"     ? "within noise"
                    : verdict == "too_few_rounds" ? "too few rounds to tell"
                                                  : verdict + " beyond noise");
    std::cerr << std::endl;
  }
}

void write_output(const std::string& text, const std::string& out_path) {
  if (out_path.empty()) std::cout << text << std::flush;
  else write_file_atomically(out_path, text);
}

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

// Says which finalists race and why each is there.
void announce_finalists(const std::vector<RaceEntrant>& entrants, bool own_chosen, bool own_ran, const std::string& against,
                        const AutotuneOptions& options) {
  auto count = [&](const std::string& why) {
    return std::count_if(entrants.begin(), entrants.end(), [&](const RaceEntrant& e) { return e.why == why; });
  };
  std::string values, neighbours;
  for (const auto& e : entrants) {
    if (e.why.rfind("best ", 0) == 0) values += (values.empty() ? "" : ", ") + e.why.substr(5);
    if (e.why.rfind("micro-batch ", 0) == 0)
      neighbours += (neighbours.empty() ? "" : " and ") + std::to_string(e.candidate.micro_batch);
  }
  std::cerr << "autotune: racing the finalists interleaved: the search's choice" << (own_chosen ? " (" + against + ")" : "")
            << ", " << count("tie") << " within noise of it, " << count("next fastest") << " next fastest"
            << (values.empty() ? "" : ", the fastest with " + values)
            << (neighbours.empty() ? "" : ", its switches at micro-batch " + neighbours)
            << (own_ran && !own_chosen ? ", " + against : "") << "; up to " << options.race_rounds << " rounds of "
            << slice_seconds_for(options.trial_seconds) << " s slices" << std::endl;
}

// What an exhausted budget or a Ctrl-C leaves: the best of the trials so far, this run's and the
// workload's own configuration's when --resume took it from the journal rather than running it again.
// The largest relative spread between trials of one configuration (at least the noise margin), or
// kDefaultTrialDrift where none was measured twice: how far trials run apart can differ for nothing.
double drift_between_trials(const std::vector<Ranked>& trials, double noise) {
  std::map<std::string, std::pair<double, double>> range;  // key -> (slowest, fastest)
  std::map<std::string, int> count;
  for (const auto& t : trials) {
    if (!t.result.ok() || t.result.samples_per_s <= 0) continue;
    auto [it, fresh] = range.try_emplace(t.candidate.key(), t.result.samples_per_s, t.result.samples_per_s);
    if (!fresh)
      it->second = {std::min(it->second.first, t.result.samples_per_s), std::max(it->second.second, t.result.samples_per_s)};
    ++count[t.candidate.key()];
  }
  double drift = 0;
  bool measured = false;
  for (const auto& [key, r] : range)
    if (count[key] >= 2) drift = std::max(drift, r.second / r.first - 1), measured = true;
  return measured ? std::max(drift, noise) : kDefaultTrialDrift;
}

// Without a race verdict (no race, or fewer rounds than a verdict needs) the search's trials ran apart, and
// compare the machine's drift as much as the configurations: its choice replaces the workload's own (or
// --versus's) only when it is ahead of it by more than the drift seen between trials; else that configuration
// is kept. Either way the output says which.
void keep_own_without_verdict(Tune& tune) {
  TuneOutput& out = tune.out;
  if (!out.report.found || !out.baseline || !out.baseline->result.ok() || out.interrupted) return;
  if (out.race && out.race->rounds >= PairedRounds::kMinRoundsForVerdict) return;
  if (out.report.best.candidate == out.baseline->candidate) return;
  const Ranked& own = *out.baseline;
  const double memory_limit = static_cast<double>(tune.plan.runner.executor->memory_capacity()) * (1 - out.report.headroom);
  if (static_cast<double>(own.result.peak_bytes) > memory_limit) return;  // it may not be chosen: no headroom
  const double drift = drift_between_trials(tune.seen, tune.search_options.noise_margin);
  const double ratio = out.report.best.result.samples_per_s / own.result.samples_per_s;
  const std::string verdict = out.race ? "after " + std::to_string(out.race->rounds) + " race round" +
                                             (out.race->rounds == 1 ? "" : "s") + " (a verdict needs " +
                                             std::to_string(PairedRounds::kMinRoundsForVerdict) + ")"
                                       : "without a race";
  std::ostringstream note;
  note << std::fixed << std::setprecision(2);
  if (ratio > 1 + drift) {
    note << verdict << ", the search's choice is ahead of " << baseline_name(out) << " by " << ratio
         << "x in trials run apart, more than the drift seen between trials (" << 100 * drift << "%): chosen, not claimed";
    out.choice_note = note.str();
    return;
  }
  note << verdict << ", " << baseline_name(out) << " is kept: the search's best, " << out.report.best.candidate.key()
       << ", was " << ratio << "x of it in trials run apart, within the drift seen between trials (" << 100 * drift << "%)";
  out.choice_note = note.str();
  out.report.runners_up.insert(out.report.runners_up.begin(), out.report.best);
  out.report.best = own;
  out.speedup = speedup_of_own_choice(baseline_name(out));
}

void settle_on_best_so_far(Tune& tune) {
  std::vector<Ranked> all = tune.seen;
  if (tune.resumed_own_trial) all.insert(all.begin(), *tune.resumed_own_trial);
  tune.out.report = best_so_far(all, tune.search_options.noise_margin);
  // The search's own trials: this run's, less the workload's own configuration's when it ran now.
  const bool own_ran_now = !tune.resumed_own_trial && !tune.seen.empty() && tune.seen.front().candidate == tune.plan.own;
  tune.out.report.trials_run = static_cast<int64_t>(tune.seen.size()) - (own_ran_now ? 1 : 0);
  tune.out.report.seconds = tune.clock.elapsed();
}

}  // namespace

// --ranks and how the ranks start: the native step's under MPI, an entry's under torchrun; --predict past them.
static void add_ranks_options(CLI::App& app, AutotuneOptions& o) {
  app.add_option(
         "--ranks", o.ranks,
         "data-parallel ranks: every trial runs the step on N ranks (LAUNCHER -n N; with --entry, under torchrun), the "
         "global batch split as micro-batch x accumulation x N, DDP's bucket size a switch (with --entry also DDP or "
         "FSDP2 and no_sync); the output's DeepSpeed / Lightning / hf / accelerate keys are for N")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--mpirun", o.launcher,
                 "the launcher of --ranks trials, with its options (default: mpirun; e.g. "
                 "'mpirun --hostfile hosts')");
  app.add_option("--launcher", o.torchrun,
                 "with --entry --ranks N: how torchrun starts the ranks, e.g. 'torchrun --nnodes 2 --rdzv-backend c10d "
                 "--rdzv-endpoint HOST:29500' (run as the tune's python -m torch.distributed.run; --nproc-per-node "
                 "N / nodes added when left out; default: torchrun --standalone, this node); with --ranks 1, a "
                 "group of one rank (DDP or FSDP2 on one GPU)");
  app.add_flag("--predict", o.predict,
               "with --ranks N: predict N ranks (more than are at hand) from trials of one rank's share of the batch on "
               "--probe-ranks independent ranks (with --entry: in one process) and the all-reduce measured on them "
               "(with --entry: torch.distributed's, under torchrun); measured too where N <= --probe-ranks");
  app.add_option("--probe-ranks", o.probe_ranks,
                 "R, the ranks at hand for --predict: the all-reduce is measured on min(N, R) of them, and N ranks run "
                 "for real where N <= R (default 2)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
}

// The options the command line sets; `format` and `memory_limit` as typed, checked after the parse.
// Returns the --workload option, whose presence parse_options asks about.
static CLI::Option* add_options(CLI::App& app, AutotuneOptions& o, std::string& format, std::string& memory_limit_text) {
  app.footer(examples);
  app.add_option("--gpu", o.gpu, "auto (the first GPU, else the CPU), a device index, or cpu");
  auto* workload_opt = app.add_option("--workload", o.workload, "a preset name or a workload .yaml file");
  auto* batch_opt = app.add_option("--batch", o.batch,
                                   "pin the global batch (default: each of the workload's global_range, else its own; a "
                                   "larger global batch is not free for convergence)")
                        ->check(CLI::PositiveNumber);
  app.add_option("--batch-range", o.batch_range,
                 "A:B: global batches A, 2A, 4A ... up to B (default: the workload's global_range)")
      ->excludes(batch_opt);
  app.add_option("--micro-batch", o.micro_batch,
                 "N: every candidate runs micro-batches of N (the accumulation makes up the global batch; with --ranks, "
                 "one rank's share); the switches are still searched (default: the micro-batch is searched)")
      ->check(CLI::PositiveNumber);
  app.add_option("--budget", o.budget, "seconds for the whole run: probes, trials, the race, output (default 300)")
      ->check(CLI::Range(1.0, 1e7));
  app.add_option("--memory-limit", memory_limit_text,
                 "plan for at most this much memory, e.g. 16G (the GPU you will train on, or what this host can spare; "
                 "default: what the device has free)");
  app.add_option("--trial-seconds", o.trial_seconds,
                 "longest a trial measures before its interval is tight (default 10; a race slice measures a quarter of it, "
                 "at least a second)")
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--executor", o.executor,
                 "native (trainbench's C++ step, the default) or torch (the PyTorch twin of the step, scripts/torch-step: "
                 "the same model, data, optimizer and switches written as a PyTorch program; needs PyTorch, see "
                 "scripts/install-deps --torch); with --compare, native,torch races each configuration in both, the C++ "
                 "step against its PyTorch twin")
      ->check(CLI::IsMember({"native", "torch", "native,torch"}));
  app.add_option("--entry", o.entry,
                 "FILE.py:NAME: tune your own PyTorch model, NAME(micro_batch, device) returning dict(model, optimizer, "
                 "batches, loss) or a LightningModule (README: --entry); hf:MODEL?key=value&...: a transformers model from "
                 "its configuration, random weights, synthetic tokens (never downloads); implies --executor torch")
      ->excludes(workload_opt);
  app.add_option("--versus", o.versus,
                 "largest-batch: with --entry, race the choice against the configuration Lightning's BatchSizeFinder "
                 "gives (the largest power-of-two micro-batch that fits, accumulation = global batch / it) instead of "
                 "the entry's own, and report the ratio with its interval")
      ->check(CLI::IsMember({"largest-batch"}));
  add_ranks_options(app, o);
  app.add_option("--strategy", o.strategy, "auto (fast search) or grid (every candidate)")
      ->check(CLI::IsMember({"auto", "grid"}));
  app.add_option("--switches", o.switches, "comma list of switches to tune (default: all the workload has), or none");
  app.add_option("--race-rounds", o.race_rounds,
                 "most rounds of the finalists' interleaved race after the search (default 12; 0: no race, and no speedup "
                 "is claimed)")
      ->check(CLI::Range(0, 100));
  app.add_option("--format", format,
                 "yaml, json, deepspeed, lightning, hf (Hugging Face TrainingArguments) or accelerate (an Accelerate "
                 "config file for accelerate launch --config_file)")
      ->check(CLI::IsMember({"yaml", "json", "deepspeed", "lightning", "hf", "accelerate"}));
  app.add_option("--journal", o.journal_path,
                 "append every finished trial here (default: beside --out, else under "
                 "${XDG_CACHE_HOME:-~/.cache}/trainbench/, keyed by workload and device)");
  app.add_flag("--resume", o.resume, "skip the trials already in the journal");
  app.add_option("--out", o.out_path, "write the config to this file (atomically) instead of stdout");
  auto* compare_opt = app.add_option(
                             "--compare", o.compare_files,
                             "FILE FILE...: race the configurations these tuned files (--format yaml or json) chose, "
                             "interleaved, each against the first, instead of tuning; says whether they are "
                             "within noise (the workload is the files' unless --workload names it). One FILE with "
                             "--executor native,torch: its configuration in the C++ step against its PyTorch twin")
                          ->expected(1, 64);
  for (const char* tuning_only : {"--batch", "--batch-range", "--strategy", "--switches", "--journal", "--resume"})
    compare_opt->excludes(tuning_only);
  app.add_option("--from", o.from_file,
                 "TUNED.yaml: write the choice of this tuned file (--format yaml or json) in another --format "
                 "(deepspeed, lightning, hf, accelerate) without running anything");
  return workload_opt;
}

// --from re-emits a tuned file: the options that plan, probe or run trials have nothing to do with it.
static void refuse_trial_options_with_from(const CLI::App& app) {
  for (const char* trial_option :
       {"--gpu", "--workload", "--batch", "--batch-range", "--micro-batch", "--budget", "--memory-limit",
        "--trial-seconds", "--executor", "--entry", "--versus", "--ranks", "--mpirun", "--launcher", "--predict",
        "--probe-ranks", "--strategy", "--switches", "--race-rounds", "--journal", "--resume", "--compare"})
    if (const CLI::Option* given = app.get_option_no_throw(trial_option); given && given->count())
      throw UsageError(std::string("--from writes a tuned file in another format without running anything: ") +
                       "leave out " + trial_option);
}

AutotuneOptions parse_options(int argc, const char* const* argv) {
  AutotuneOptions o;
  std::string format = "yaml", memory_limit_text;
  CLI::App app{"trainbench autotune: the best batch / micro-batch / accumulation config for this machine"};
  CLI::Option* workload_opt = add_options(app, o, format, memory_limit_text);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    o.help = app.help();
    return o;
  } catch (const CLI::ParseError& e) {
    throw UsageError(std::string(e.what()) + "\nRun 'autotune --help' for the options.");
  }
  o.workload_given = workload_opt->count() > 0;
  o.format = out_format_from_string(format);
  if (!o.from_file.empty()) refuse_trial_options_with_from(app);
  if (o.predict && o.ranks < 2) throw UsageError("--predict needs --ranks N with N >= 2");
  if (!o.versus.empty() && o.entry.empty())
    throw UsageError("--versus " + o.versus +
                     " races the choice for an --entry against the largest batch that fits: give --entry");
  if (!o.entry.empty()) {
    if (app.count("--executor") && o.executor != "torch")
      throw UsageError("--entry tunes a PyTorch model: it runs with --executor torch, not " + o.executor);
    if (!o.compare_files.empty()) throw UsageError("--entry tunes its own model: leave out --compare");
    if (o.ranks > 1 && app.count("--mpirun"))
      throw UsageError("--mpirun launches the native step's ranks; an entry's ranks start under torchrun "
                       "(--launcher 'torchrun ...')");
    if (app.count("--launcher") && o.predict)
      throw UsageError("--launcher starts the ranks a tune measures; --predict tunes one process and starts its "
                       "probes itself");
    // A bad --launcher is refused before anything runs; with --ranks 1 it makes a group of one rank
    if (o.ranks > 1 || app.count("--launcher")) torchrun_arguments(o.torchrun, o.ranks);
    if (o.ranks > 1 && o.batch > 0 && o.batch % o.ranks)
      throw UsageError("--ranks " + std::to_string(o.ranks) + ": the global batch " + std::to_string(o.batch) +
                       " is not a multiple of the ranks");
    o.executor = "torch";
  }
  o.memory_limit = memory_limit_text.empty() ? 0 : parse_memory_limit(memory_limit_text);
  if (app.count("--launcher") && o.entry.empty())
    throw UsageError("--launcher starts an entry's ranks under torchrun; the native step's ranks start with --mpirun");
  if (o.ranks > 1 && o.executor == "torch" && o.entry.empty())
    throw UsageError(
        "--ranks runs the native step or an --entry on every rank; without --entry, --executor torch is one "
        "process (the twin)");
  if (o.ranks > 1 && !o.compare_files.empty())
    throw UsageError("--compare races one-rank configurations: leave out --ranks");
  if (executor_names(o.executor).size() > 1 && o.compare_files.empty())
    throw UsageError("--executor native,torch races configurations in both executors: give it --compare FILE");
  return o;
}

Machine pick_machine(const std::string& gpu) {
  Machine m;
  const auto& cuda = cuda_status();
  if (gpu == "auto") {
    m.use_cuda = cuda.available();
    if (!m.use_cuda) std::cerr << "autotune: " << cuda.unavailable_reason << "; measuring on the CPU" << std::endl;
  } else if (gpu != "cpu") {
    double n = 0;
    if (!parse_number(gpu, n) || n < 0 || n != std::floor(n))
      throw UsageError("--gpu '" + gpu + "': expected auto, cpu or a device index");
    m.device = static_cast<int>(n);
    try {
      select_cuda_device(m.device);  // UsageError when it does not exist
    } catch (const UsageError& e) {  // said of benchsuite's --device: named as the user typed it here
      const std::string what = e.what();
      const auto colon = what.find(": ");
      throw UsageError("--gpu " + gpu + ": " +
                       (what.rfind("--device", 0) == 0 && colon != std::string::npos ? what.substr(colon + 2) : what));
    }
    m.use_cuda = true;
  }
  m.backend = m.use_cuda ? "cuda" : "cpu";
  m.name = m.use_cuda ? cuda.devices.at(static_cast<std::size_t>(m.device)).name : host_info().cpu_model;
  m.description = {{"backend", m.backend}, {"name", m.name}};
  if (m.use_cuda) {
    const auto& g = cuda.devices.at(static_cast<std::size_t>(m.device));
    m.description.update({{"uuid", g.uuid},
                          {"compute_capability", g.compute_capability},
                          {"memory_bytes", g.memory_bytes},
                          {"driver_version", g.driver_version},
                          {"runtime_version", g.runtime_version},
                          {"cublas_version", g.cublas_version}});
  } else {
    const HostInfo h = host_info();
    m.description.update({{"cores", h.cores}, {"compiler", h.compiler}, {"blas", h.blas}});
  }
  return m;
}

// --memory-limit: "16G", "512M", "3.5GiB", or bytes. Throws UsageError naming the value.
int64_t parse_memory_limit(const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  if (unit.size() > 1 && (unit.substr(1) == "iB" || unit.substr(1) == "B")) unit = unit.substr(0, 1);
  const std::string units = "KMGT";
  const std::size_t power = unit.empty() ? 0 : units.find(static_cast<char>(std::toupper(unit[0])));
  if (used == 0 || !(value > 0) || (!unit.empty() && (unit.size() != 1 || power == std::string::npos)))
    throw UsageError("--memory-limit '" + text +
                     "': expected a size such as 16G, 512M or 3.5GiB (K, M, G, T: powers of 1024)");
  return static_cast<int64_t>(value * std::pow(1024.0, unit.empty() ? 0.0 : static_cast<double>(power + 1)));
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
  plan.space.global_batches = plan.batches.batches;
  pin_micro_batch(options, plan);
  plan.workload_digest = digest(plan.entry ? entry_digest_text(*plan.entry) : file_text(plan.workload.path));
  plan.own = own_candidate(plan.workload, plan.space);
  if (!plan.entry) refuse_workload_that_cannot_fit(plan, options.memory_limit);
  return plan;
}

Tune::Tune(const AutotuneOptions& options_in, TunePlan& plan_in, const BudgetClock& clock_in)
    : options(options_in), plan(plan_in), clock(clock_in) {
  plan_seconds = clock.elapsed();
  const Machine& machine = plan.machine;
  search_options.strategy = options.strategy == "grid" ? SearchOptions::Strategy::grid : SearchOptions::Strategy::auto_;
  search_options.budget_seconds = options.budget;
  search_options.measure.max_seconds = options.trial_seconds;
  // Refused before anything runs: a budget too small for one trial.
  shortest = plan.entry ? entry_shortest_trial(*plan.entry, plan.own, search_options.measure.min_steps)
                        : shortest_trial(apply(plan.workload, plan.own), search_options.measure.min_steps, machine.use_cuda,
                                         machine.device);
  refuse_budget_below_one_trial(plan.workload, plan.entry ? Candidate{} : plan.own, shortest, search_options.measure,
                                options.budget, clock.elapsed());
  // --predict: the all-reduce probe after the search, and where the ranks are at hand one real N-rank
  // trial of the prediction, come out of the same budget.
  trial_deadline_ = options.budget - output_reserve(options.budget) - predict_reserve(options, plan, shortest) -
                    profile_reserve(options, plan, shortest);
  search_options.seconds_left = [this] { return seconds_left() - race_reserve(); };
  search_options.min_trial_seconds = shortest.seconds;
  open_journal();
  search_options.on_trial = [this](const Candidate& c, const TrialResult& r) { note_trial(c, r); };
  announce();
  out.global_batches = plan.batches;
  out.pinned_micro_batch = options.micro_batch;
  out.workload_global_batch = plan.workload.batch.global;
  out.device = machine.description;
  out.executor = plan.runner.description;
  out.workload_name = plan.workload.name;
  out.workload_path = plan.workload.path;
  out.workload_digest = plan.workload_digest;
  out.workload_source = plan.workload.source;
  out.strategy = options.strategy;
  out.budget_seconds = options.budget;
  out.grad_clip = plan.workload.optimizer.grad_clip;
  out.noise_margin = search_options.noise_margin;
  out.ranks = options.predict ? 1 : options.ranks;
}

void Tune::open_journal() {
  const std::string key = digest(plan.workload_digest + plan.machine.backend + plan.machine.name + plan.runner.journal_tag);
  journal_path = options.journal_path.empty()
                     ? default_journal_path(options.out_path, plan.workload.name,
                                            plan.machine.backend + (plan.runner.torch ? ".torch" : ""), key)
                     : options.journal_path;
  journal_ = std::make_unique<Journal>(journal_path, key, options.resume);
  if (const std::string notice = take_blas_kernel_notice(); !notice.empty()) std::cerr << notice << std::endl;
  std::cerr << "autotune: journal " << journal_path << std::endl;
  if (journal_->torn_bytes() > 0)
    std::cerr << "autotune: the journal's last line was cut short (" << journal_->torn_bytes()
              << " bytes: a crash mid-write, no whole trial); cut off before this tune's first trial" << std::endl;
  if (options.resume) {
    search_options.known = journal_->load();
    for (const auto& kv : search_options.known) resumed += kv.second.size();
    std::cerr << "autotune: resuming with " << resumed << " trials from " << journal_path << std::endl;
  } else if (journal_->dropped_lines() > 0) {
    std::cerr << "autotune: a fresh tune starts a fresh journal: the " << journal_->dropped_lines()
              << " trials of the last tune in it were dropped (--resume goes on from them instead)" << std::endl;
  }
}

void Tune::announce() const {
  const TrialRunner& runner = plan.runner;
  std::cerr << "autotune: " << plan.workload.name << " ("
            << static_cast<double>(plan.entry ? plan.entry->parameters : plan.workload.parameter_count()) / 1e6
            << "M parameters) on " << plan.machine.name << ", " << search_options.budget_seconds << " s budget, "
            << options.strategy << " search";
  if (plan.entry)
    std::cerr << ", your model in trainbench's PyTorch loop (torch " << plan.entry->torch.torch_version << ", "
              << plan.entry->torch.python << ")";
  else if (runner.torch)
    std::cerr << ", measured in the PyTorch twin of the step (torch " << runner.description["torch"].get<std::string>()
              << ", " << runner.description["interpreter"].get<std::string>() << ")";
  std::cerr << std::endl;
  std::cerr << "autotune: " << searched_batches_text(plan.batches, described_ranks) << std::endl;
}

MeasurePolicy Tune::within_budget(MeasurePolicy policy) const {
  const double left = seconds_left();
  if (left < shortest.seconds) throw OutOfBudget("no time left in the budget for another trial");
  policy.max_seconds = std::min(policy.max_seconds, left);
  policy.wall_seconds = left;
  return policy;
}

// Kept from the search for the race: about kMinRoundsToDrop rounds of every finalist at the slice
// time the trials so far suggest (their median set-up plus a slice: a busy machine makes both
// longer), at most `race_share` (set once the workload's own trial ran), and nothing while that
// share cannot buy one round of the choice against the workload's own configuration.
double Tune::race_reserve() const {
  if (race_share <= 0 || setups.empty()) return 0.0;
  // A slice as the trials so far measured their candidates: the set-up (in the PyTorch worker, opening a
  // candidate; natively, a process), then its measuring, at least a slice and at least the three samples of
  // whole steps the measuring rule takes, with the race's safety margin. The longest: finalists gather at the
  // global batch and micro-batch that run fastest, which are often the largest and the slowest to step (the
  // median of small_gpt's twin's trials, at global batches 4 to 16, kept 49 s for 3 rounds that took 75 s).
  // A compiling candidate's set-up is its compilation, which its slices do not pay again.
  double slowest = 0;
  for (const auto& t : seen)
    if (t.result.ok() && t.result.samples_per_s > 0) {
      const auto compiles = t.candidate.switches.find("compile");
      const bool compiled = compiles != t.candidate.switches.end() && compiles->second == "on";
      const double step = static_cast<double>(t.candidate.global_batch) / t.result.samples_per_s;
      slowest = std::max(slowest, (compiled ? 0.0 : t.result.setup_seconds) +
                                      std::max(slice_seconds_for(options.trial_seconds), 3 * std::max(step, 0.02)));
    }
  if (slowest <= 0) return 0.0;
  const double slice = 1.1 * std::max(shortest.seconds, slowest);
  const double rounds = std::min(options.race_rounds, kMinRoundsToDrop);
  return race_share < 2 * slice ? 0.0 : std::min(race_share, rounds * kExpectedFinalists * slice);
}

void Tune::note_trial(const Candidate& c, const TrialResult& r) {
  if (stop_requested) throw Interrupted{};
  journal_->append(c, r);
  seen.push_back(Ranked{c, r});
  if (r.ok()) setups.push_back(r.setup_seconds);
  std::cerr << "autotune: [trial " << seen.size() << ", " << human_seconds(clock.elapsed()) << " of "
            << human_seconds(options.budget) << " budget] " << describe(c) << " -> " << result_text(r) << std::endl;
}

// The search chooses among the candidates it ran, and one cut short by the budget need not have run
// the workload's own configuration (or --versus's), measured before it: a tune never recommends a
// configuration slower than one it measured and may choose. When that trial kept the search's memory
// headroom and ran faster than the search's choice beyond noise, it becomes the choice; the search's
// choice and ties stay runners-up where within noise of it. A search that ran it weighed it already.
bool own_outran_the_search(Tune& tune) {
  SearchReport& rep = tune.out.report;
  const Ranked& own = *tune.out.baseline;
  const double noise = tune.search_options.noise_margin;
  const double memory_limit = static_cast<double>(tune.plan.runner.executor->memory_capacity()) * (1 - rep.headroom);
  if (!rep.found || !own.result.ok() || static_cast<double>(own.result.peak_bytes) > memory_limit ||
      own.result.samples_per_s <= (1 + noise) * rep.best.result.samples_per_s ||
      std::any_of(rep.trials.begin(), rep.trials.end(), [&](const Ranked& t) { return t.candidate == own.candidate; }))
    return false;
  std::vector<Ranked> ties;
  rep.runners_up.insert(rep.runners_up.begin(), rep.best);
  for (const auto& r : rep.runners_up)
    if (r.result.samples_per_s >= (1 - noise) * own.result.samples_per_s) ties.push_back(r);
  std::sort(ties.begin(), ties.end(),
            [](const Ranked& a, const Ranked& b) { return a.result.samples_per_s > b.result.samples_per_s; });
  std::cerr << "autotune: the search found nothing faster than " << baseline_name(tune.out)
            << " within its budget: its best, " << describe(rep.best.candidate) << " -> " << result_text(rep.best.result)
            << ", against " << describe(own.candidate) << " -> " << result_text(own.result) << "; choosing "
            << baseline_name(tune.out) << std::endl;
  rep.best = own;
  rep.runners_up = std::move(ties);
  return true;
}

void search_step(Tune& tune) {
  Executor& executor = *tune.plan.runner.executor;
  if (!tune.options.versus.empty())
    tune.out.versus = versus_largest_batch(*tune.plan.runner.entry, tune.plan.own, executor.memory_capacity(),
                                           tune.seconds_left());
  tune.search_started = tune.clock.elapsed();
  const Candidate& own = tune.plan.own;  // --versus: its micro-batch is the largest that fits
  // The workload's own configuration (or --versus's) first: what the speedup is measured against.
  auto& own_known = tune.search_options.known[own.key()];
  const bool resumed_own = !own_known.empty();
  const TrialResult own_result = resumed_own ? own_known.front()
                                             : executor.run(own, tune.within_budget(tune.search_options.measure));
  if (!resumed_own) {
    tune.search_options.on_trial(own, own_result);
    own_known.push_back(own_result);  // the search takes it as the first measurement of `own`
  }
  tune.out.baseline = Ranked{own, own_result};
  if (resumed_own) tune.resumed_own_trial = Ranked{own, own_result};
  if (resumed_own && own_result.ok()) tune.setups.push_back(own_result.setup_seconds);
  if (tune.options.race_rounds >= 2 && own_result.ok()) tune.race_share = kRaceShare * tune.seconds_left();
  tune.out.report = search(executor, tune.plan.space, tune.search_options);
  tune.search_ended = tune.clock.elapsed();
  tune.race_share = 0;
  if (own_outran_the_search(tune)) tune.out.speedup = speedup_of_own_choice(baseline_name(tune.out));
  // A trial of the workload's own configuration can take most of a short budget (sem_v55 at its
  // batch of 4096: 73 s on an H100, 31 s of it set-up) and leave the search no time for one of its
  // own: that measured configuration is then the answer, and nothing is raced against it.
  tune.only_own = !tune.out.report.found && own_result.ok();
  if (tune.only_own) {
    settle_on_best_so_far(tune);
    tune.out.report.budget_exhausted = true;
    tune.out.speedup = speedup_of_own_choice(baseline_name(tune.out));
    std::cerr << "autotune: the search ran no trial of its own within the budget (" << human_seconds(tune.options.budget)
              << "; the workload's own configuration took " << human_seconds(own_result.seconds)
              << "): reporting that configuration, measured; give a larger --budget to search" << std::endl;
  }
}

// Trials run one after another compare the machine's drift as much as the candidates: the finalists
// and the workload's own configuration are measured again, interleaved, and the losers dropped. The
// race's slices are not journaled, as they repeat finished trials: a resumed tune replays the search
// from the journal and races afresh.
void race_step(Tune& tune) {
  TuneOutput& out = tune.out;
  if (!out.report.found || stop_requested || tune.only_own) return;
  Executor& executor = *tune.plan.runner.executor;
  const TrialResult own_result = out.baseline->result;
  const double memory_limit = static_cast<double>(executor.memory_capacity()) * (1 - out.report.headroom);
  const std::vector<RaceEntrant> entrants = finalists(out.report, *out.baseline, memory_limit,
                                                      tune.plan.space.memory_switches);
  const bool own_chosen = out.report.best.candidate == tune.plan.own;
  const AutotuneOptions& options = tune.options;
  if (entrants.size() < 2) {
    std::cerr << "autotune: one configuration ran within the memory headroom: nothing to race it against" << std::endl;
    if (own_chosen) out.speedup = speedup_of_own_choice(baseline_name(out));
  } else if (options.race_rounds < 1) {
    if (own_chosen) out.speedup = speedup_of_own_choice(baseline_name(out));
    else if (own_result.ok())
      out.speedup = speedup_from_separate_trials(out.report.best.result.samples_per_s / own_result.samples_per_s,
                                                 "--race-rounds 0");
  } else {
    announce_finalists(entrants, own_chosen, own_result.ok(), baseline_name(out), options);
    const RaceReport raced = race(executor, entrants,
                                  race_options(
                                      tune.search_options, options.race_rounds, options.trial_seconds,
                                      [&] { return tune.seconds_left(); }, tune.shortest.seconds,
                                      [&] { return tune.clock.elapsed(); }, options.budget));
    if (raced.rounds == 0) std::cerr << "autotune: the race measured no round: " << raced.ended << std::endl;
    else
      std::cerr << "autotune: the race ended after " << raced.rounds << " round" << (raced.rounds == 1 ? "" : "s") << ": "
                << raced.ended << std::endl;
    take_race(out, raced, tune.search_options.noise_margin);
    if (!raced.choice_why.empty()) out.choice_note = raced.choice_why;
  }
  keep_own_without_verdict(tune);
  if (!out.choice_note.empty()) std::cerr << "autotune: " << out.choice_note << std::endl;
  if (out.speedup) std::cerr << "autotune: " << out.speedup->note << std::endl;
}

// Where the budget went, and the PyTorch worker's starts: in the output and on stderr.
void account_budget(Tune& tune) {
  TuneOutput& out = tune.out;
  const double now = tune.clock.elapsed();
  const WorkerStats* worker = tune.plan.runner.worker;
  const double search_end = tune.search_ended > 0 ? tune.search_ended : now;
  const double race_end = tune.race_ended > 0 ? tune.race_ended : now;
  // The worker starts in the plan; a restart within the trial or slice that lost it.
  const double search = std::max(search_end - tune.search_started, 0.0);
  const double race = tune.search_ended > 0 ? std::max(race_end - tune.search_ended, 0.0) : 0.0;
  const double set_up = tune.plan_seconds;
  std::vector<double> after_first(tune.setups.size() > 1 ? tune.setups.begin() + 1 : tune.setups.end(), tune.setups.end());
  out.budget_spent = {{"set_up_seconds", set_up},
                      {"versus_seconds",
                       tune.search_started > tune.plan_seconds ? tune.search_started - tune.plan_seconds : 0.0},
                      {"search_seconds", search},
                      {"race_seconds", race},
                      {"profile_seconds", tune.profile_seconds},
                      {"total_seconds", now},
                      {"set_up_per_candidate_seconds",
                       after_first.empty() ? nlohmann::json(nullptr) : nlohmann::json(median_of(after_first))},
                      {"note",
                       "set_up: the plan (the PyTorch worker's start; the entry's probe in it); "
                       "versus: --versus's largest-batch search; search: the workload's own trial and the search's; "
                       "race: the finalists' rounds; profile: the chosen step's communication profile (an entry on "
                       "ranks); set_up_per_candidate: the median set-up of the trials after the "
                       "first (opening a candidate: building, checking and warming it up)"}};
  std::cerr << std::fixed << std::setprecision(1) << "autotune: the budget: " << set_up << " s set-up, " << search
            << " s search (" << tune.seen.size() << " trials), " << race << " s race (" << (out.race ? out.race->rounds : 0)
            << " rounds), ";
  if (tune.profile_seconds > 0) std::cerr << tune.profile_seconds << " s profile, ";
  std::cerr << now << " s of " << tune.options.budget << " s" << std::defaultfloat << std::endl;
  if (worker) {
    out.executor["worker"] = worker->to_json();
    std::cerr << "autotune: the PyTorch worker started " << worker->starts << " time" << (worker->starts == 1 ? "" : "s");
    if (worker->restarts > 0) {
      std::cerr << " (" << worker->restarts << " restart" << (worker->restarts == 1 ? "" : "s") << ":";
      for (const auto& why : worker->reasons) std::cerr << " [" << why << "]";
      std::cerr << ")";
    }
    std::cerr << std::endl;
  }
}

// An entry on ranks: the chosen configuration's step profiled on every rank (torch.profiler) for the communication
// it waits for: the time a collective is in flight while nothing computes, as a share of the step
// (scripts/trainbench/pytorch/distributed.py, exposed_communication), the rank that waited most speaking for the
// step. Two steps after the warm-up, in what the budget has left; skipped, and said, without it.
void profile_communication_step(Tune& tune) {
  EntryExecutor* entry = tune.plan.runner.entry;
  TuneOutput& out = tune.out;
  if (!entry || entry->ranks() <= 1 || !out.report.found || out.interrupted || stop_requested) return;
  constexpr int64_t kProfiledSteps = 2;
  const double left = tune.seconds_left() + profile_reserve(tune.options, tune.plan, tune.shortest);
  if (left < 0.5 * tune.shortest.seconds) {
    std::cerr << "autotune: no budget left to profile the choice's communication (" << human_seconds(std::max(left, 0.0))
              << " left, a trial takes " << human_seconds(tune.shortest.seconds) << ")" << std::endl;
    return;
  }
  const nlohmann::json p = entry->profile(out.report.best.candidate, kProfiledSteps, left);
  if (p.contains("error") || !p.contains("share")) {
    std::cerr << "autotune: profiling the choice's communication failed: " << p.value("error", p.dump()) << std::endl;
    return;
  }
  const double steps = p.value("steps", double(kProfiledSteps));
  out.communication = {
      {"share", p.at("share")},
      {"step_seconds", p.value("wall_seconds", 0.0) / steps},
      {"exposed_seconds", p.value("exposed_seconds", 0.0) / steps},
      {"communication_seconds", p.value("communication_seconds", 0.0) / steps},
      {"rank_shares", p.value("rank_shares", nlohmann::json::array())},
      {"steps", p.value("steps", kProfiledSteps)},
      {"how", "torch.profiler over the steps on every rank: the time a collective was in flight while the rank "
              "computed nothing, per step; the rank that waited most"}};
  std::cerr << "autotune: the chosen configuration's step waits " << std::fixed << std::setprecision(1)
            << 100 * p.at("share").get<double>() << "% of its time for communication ("
            << 1e3 * out.communication["exposed_seconds"].get<double>() << " ms of "
            << 1e3 * out.communication["step_seconds"].get<double>() << " ms a step, profiled on " << entry->ranks()
            << " ranks)" << std::defaultfloat << std::endl;
}

void search_and_race(Tune& tune) {
  try {
    search_step(tune);
    race_step(tune);
    tune.race_ended = tune.clock.elapsed();
    profile_communication_step(tune);
    tune.profile_seconds = tune.clock.elapsed() - tune.race_ended;
  } catch (const OutOfBudget& e) {
    // The workload's own configuration ran into the budget's end: nothing to compare with.
    settle_on_best_so_far(tune);
    tune.out.report.budget_exhausted = true;
    std::cerr << "autotune: " << e.what() << "; the budget (" << human_seconds(tune.options.budget) << ") is spent"
              << (tune.out.report.found ? ": reporting the best so far" : ": give a larger --budget") << std::endl;
  } catch (const Interrupted&) {
    tune.out.interrupted = true;
    tune.out.race.reset();
    tune.out.speedup.reset();
    settle_on_best_so_far(tune);
    std::cerr << "autotune: interrupted by " << stop_signal_name() << " after " << tune.seen.size()
              << " trials; the trial in flight was stopped; writing the best so far" << std::endl;
  }
  account_budget(tune);
}

// --predict's all-reduce on the ranks at hand, in the chosen buckets (an entry's trials in one process search no
// bucket_mb: DDP's default, the workload's): the native step's under the launcher (MPI), an entry's under torchrun
// (torch.distributed: gloo on the CPU, NCCL on GPUs).
AllreduceProbe probe_prediction_allreduce(const Tune& tune, const Candidate& best, int64_t at_hand) {
  const step::Workload& workload = tune.plan.workload;
  const auto bucket = best.switches.find("bucket_mb");
  const double bucket_mb = bucket == best.switches.end() ? workload.distributed.bucket_mb : std::stod(bucket->second);
  if (tune.plan.entry) {
    const EntryProbe& entry = *tune.plan.entry;
    std::cerr << "autotune: measuring the gradients' all-reduce (" << static_cast<double>(entry.parameters) / 1e6
              << "M floats, buckets of " << bucket_mb << " MB) on " << at_hand
              << " ranks of torch.distributed (torchrun)" << std::endl;
    return probe_torch_allreduce(entry.torch.python, entry.torch.script, at_hand, entry.parameters, bucket_mb,
                                 tune.plan.machine.use_cuda, kTorchWorkerStartSeconds, &stop_requested);
  }
  std::cerr << "autotune: measuring the gradients' all-reduce (" << workload.parameter_count() / 1e6 << "M floats) on "
            << at_hand << " ranks" << std::endl;
  return probe_allreduce(tune.plan.launcher, std::filesystem::read_symlink("/proc/self/exe").string(), at_hand,
                         workload.parameter_count(), bucket_mb, &stop_requested);
}

// An entry's check run: its worker on N ranks under torchrun (DDP, the entry validated there again), one trial of
// the prediction, with no_sync on where it accumulates (the all-reduce once per step, as the model has it). A
// group that cannot start is a failed trial, not the tune's end: the prediction stands without its check.
TrialResult run_entry_on_ranks(const Tune& tune, const Candidate& on_ranks, const MeasurePolicy& policy) {
  const AutotuneOptions& options = tune.options;
  const Machine& machine = tune.plan.machine;
  try {
    EntryExecutor ranks(options.entry, machine.use_cuda, machine.device, on_ranks.global_batch * options.ranks,
                        &stop_requested, options.memory_limit,
                        std::max(options.budget - tune.clock.elapsed(), kEntryCheckRunSeconds), options.ranks);
    return ranks.run(on_ranks, policy);
  } catch (const std::exception& e) {
    if (stop_requested) throw;
    TrialResult failed;
    failed.cls = TrialClass::error;
    failed.message = e.what();
    return failed;
  }
}

// --predict where the ranks are at hand: the predicted configuration run on them; its samples/s (0: it failed).
double measure_prediction(Tune& tune, const Candidate& best) {
  const AutotuneOptions& options = tune.options;
  MeasurePolicy policy = tune.search_options.measure;
  policy.max_seconds = options.trial_seconds;
  TrialResult r;
  if (tune.plan.entry) {
    // The tune's one-process worker ends first, its work done (its starts are in the output already): on a GPU it
    // would hold memory on the device of rank 0.
    tune.plan.runner.worker = nullptr;
    tune.plan.runner.entry = nullptr;
    tune.plan.runner.executor.reset();
    Candidate on_ranks = best;
    on_ranks.switches["no_sync"] = best.accumulation() > 1 ? "on" : "off";
    r = run_entry_on_ranks(tune, on_ranks, policy);
  } else {
    ProcessExecutor measured(std::filesystem::read_symlink("/proc/self/exe").string(), tune.plan.workload.path,
                             tune.plan.machine.use_cuda, tune.plan.machine.device, &stop_requested, options.ranks,
                             tune.plan.launcher);
    r = measured.run(best, policy);
  }
  std::cerr << "autotune: the predicted configuration on " << options.ranks << " ranks: " << result_text(r) << std::endl;
  return r.ok() ? r.samples_per_s : 0.0;
}

void predict_step(Tune& tune) {
  const AutotuneOptions& options = tune.options;
  TuneOutput& out = tune.out;
  if (!options.predict || !out.report.found || out.interrupted) return;
  const Candidate& best = out.report.best.candidate;
  const int64_t ranks = options.ranks;
  std::cerr << std::defaultfloat << std::setprecision(3);  // account_budget left the stream at one decimal
  const AllreduceProbe probe = probe_prediction_allreduce(tune, best, std::min(ranks, options.probe_ranks));
  RanksPrediction p = predict_ranks(ranks, best.global_batch * ranks, out.report.best.result.samples_per_s, probe);
  p.share_in_one_process = tune.plan.entry.has_value();
  if (ranks <= options.probe_ranks) p.measured_samples_per_s = measure_prediction(tune, best);
  std::cerr << std::fixed << std::setprecision(1) << "autotune: predicted for " << ranks << " ranks: " << p.samples_per_s
            << " samples/s (compute " << std::setprecision(2) << p.step_compute_s * 1e3 << " ms + all-reduce "
            << p.allreduce_s * 1e3 << " ms per step"
            << (p.share_in_one_process ? "; the share measured in one process" : "") << ")" << std::setprecision(1);
  if (p.measured_samples_per_s > 0)
    std::cerr << ", measured " << p.measured_samples_per_s << " samples/s" << std::endl
              << "autotune: --predict on " << ranks << " ranks: predicted " << p.samples_per_s << " samples/s, measured "
              << p.measured_samples_per_s << ", error " << std::showpos << p.error() * 100 << "%" << std::noshowpos;
  std::cerr << std::defaultfloat << std::setprecision(6) << std::endl;
  out.prediction = to_json(p);
  out.prediction["config"] = {{"micro_batch", best.micro_batch}, {"accumulation", best.accumulation()}};
  if (tune.plan.entry) out.prediction["config"]["no_sync"] = best.accumulation() > 1 ? "on" : "off";
  out.ranks = ranks;
}

int output_step(const Tune& tune) {
  const TuneOutput& out = tune.out;
  const std::string& out_path = tune.options.out_path;
  if (out.report.found) std::cerr << "autotune: " << global_batch_note(out) << std::endl;
  write_output(emit(out, tune.options.format), out_path);
  if (out.interrupted || stop_requested) {  // a stop during the output: the output is whole, the exit says so
    std::cerr << "autotune: stopped by " << stop_signal_name() << " after " << human_seconds(tune.clock.elapsed()) << ": "
              << (out.report.found ? "the best so far (" + describe(out.report.best.candidate) + ")"
                                   : "no configuration (none ran)")
              << " written to " << (out_path.empty() ? "stdout" : out_path) << "; the journal " << tune.journal_path
              << " keeps " << tune.seen.size() + tune.resumed << " finished trials (--resume goes on from them)"
              << std::endl;
    return interrupted_exit_code();
  }
  std::cerr << "autotune: " << (out.report.found ? "chose " + describe(out.report.best.candidate) : "no configuration ran")
            << " after " << tune.seen.size() << " trials"
            << (out.race ? " and " + std::to_string(out.race->rounds) + " race rounds" : "") << " in "
            << human_seconds(tune.clock.elapsed()) << "; journal " << tune.journal_path
            << (out_path.empty() ? "" : ", config " + out_path) << std::endl;
  return out.report.found ? 0 : 1;
}

// --from: the choice of a tuned file, with what the frameworks' formats need of it (ranks, the gradient clipping,
// the launcher, the device's backend); nothing is measured or probed.
static TuneOutput tuned_output(const std::string& path) {
  const TunedFile f = read_tuned_file(path);
  TuneOutput out;
  out.report.found = true;
  out.report.best.candidate = f.chosen;
  try {
    const YAML::Node t = YAML::LoadFile(path)["trainbench_autotune"];
    out.ranks = t["ranks"] ? t["ranks"].as<int64_t>() : 1;
    if (out.ranks > 1) out.report.best.candidate.global_batch = t["chosen"]["per_rank_batch"].as<int64_t>();
    if (t["measured"] && t["measured"]["samples_per_s"])
      out.report.best.result.samples_per_s = t["measured"]["samples_per_s"].as<double>();
    out.device = {{"backend", t["device"]["backend"].as<std::string>()},
                  {"name", t["device"]["name"].as<std::string>()}};
    const YAML::Node executor = t["executor"];
    out.executor = {{"name", executor["name"].as<std::string>()}};
    for (const char* key : {"launcher", "torch"})
      if (executor[key] && executor[key].IsScalar()) out.executor[key] = executor[key].as<std::string>();
    out.workload_name = t["workload"]["name"].as<std::string>();
    if (t["workload"]["grad_clip"]) out.grad_clip = t["workload"]["grad_clip"].as<double>();
    else
      std::cerr << "autotune: " << path << " does not say the gradient clipping (an older autotune wrote it): the "
                << "output clips nothing; set it by hand if the workload clips" << std::endl;
  } catch (const YAML::Exception& e) {
    throw UsageError(path + ": not a configuration autotune wrote (" + e.what() + ")");
  }
  if (out.report.best.candidate.global_batch <= 0 ||
      out.report.best.candidate.global_batch % out.report.best.candidate.micro_batch)
    throw UsageError(path + ": its micro-batch does not divide its per-rank batch");
  return out;
}

static int emit_tuned_file(const AutotuneOptions& options) {
  if (options.format == OutFormat::yaml || options.format == OutFormat::json)
    throw UsageError("--from " + options.from_file +
                     ": it is autotune's own document already; give --format deepspeed, lightning, hf or accelerate");
  write_output(emit(tuned_output(options.from_file), options.format), options.out_path);
  return 0;
}

int compare_tuned(const AutotuneOptions& options) {
  const BudgetClock clock;
  const std::vector<std::string> executors = executor_names(options.executor);
  if (options.compare_files.size() * executors.size() < 2)
    throw UsageError(
        "--compare: give two tuned files or more, or one with --executor native,torch (the C++ step "
        "against its PyTorch twin)");
  if (options.format != OutFormat::yaml && options.format != OutFormat::json)
    throw UsageError("--compare writes --format yaml or json");
  std::vector<TunedFile> tuned;
  for (const auto& p : options.compare_files) tuned.push_back(read_tuned_file(p));
  // The workload the files were tuned for, unless --workload names it; either way the files'.
  const step::Workload workload = step::load_workload(options.workload_given ? options.workload
                                                                             : tuned.front().workload_path);
  const std::string workload_digest = digest(file_text(workload.path));
  for (const auto& t : tuned)
    if (t.workload_digest != workload_digest)
      throw UsageError(t.path + " was tuned for another workload file (digest " + t.workload_digest + ", " + workload.path +
                       " has " + workload_digest + ")");
  const Machine machine = pick_machine(options.gpu);
  // One runner per executor; with two, every file's configuration is raced in each.
  TrialRunner runner = compare_runner(executors, options.executor, workload, machine);
  const auto available = available_switches(workload, machine.use_cuda);
  for (const auto& t : tuned)
    for (const auto& [name, value] : t.chosen.switches)
      if (!available.count(name))
        throw UsageError(t.path + ": its configuration sets " + name + ", which " + workload.name + " does not have on " +
                         machine.backend);
  CompareOutput out;
  out.device = machine.description;
  out.executor = runner.description;
  out.workload_name = workload.name;
  out.workload_path = workload.path;
  out.workload_digest = workload_digest;
  const std::vector<RaceEntrant> entrants = compare_entrants(tuned, executors, out);
  if (entrants.size() >= 2) race_compared(options, workload, machine, runner, tuned, entrants, clock, out);
  write_output(emit(out, options.format), options.out_path);
  print_comparisons(out);
  if (out.interrupted || stop_requested) return interrupted_exit_code();
  if (out.race && out.race->rounds == 0) return 1;
  return 0;
}

int run(int argc, char** argv) {
  // The child sides (a trial, the all-reduce probe; under mpirun, every rank): they end when their parent (autotune,
  // or the launcher) ends, however it ends, and never hold a GPU for a tune that is gone.
  const bool child_side = argc == 3 && (std::string(argv[1]) == "--trial" || std::string(argv[1]) == "--allreduce-probe");
  if (child_side) prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (argc == 3 && std::string(argv[1]) == "--trial") {  // the child side of a trial
    const TrialResult r = run_trial_here(nlohmann::json::parse(argv[2]));
    if (comm::launched_rank() == 0) std::cout << to_json(r).dump() << std::endl;  // one line, rank 0's
    return 0;
  }
  if (argc == 3 && std::string(argv[1]) == "--allreduce-probe")
    return run_allreduce_probe_here(nlohmann::json::parse(argv[2]));
  const AutotuneOptions options = parse_options(argc, argv);
  if (!options.help.empty()) {
    std::cout << options.help;
    return 0;
  }
  if (!options.from_file.empty()) {
    if (!options.out_path.empty()) check_output_path(options.out_path, "--out");
    return emit_tuned_file(options);
  }
  install_stop_handlers();
  // Where the results go is checked before anything is measured: a tune is not lost to a typo in a folder.
  if (!options.out_path.empty()) check_output_path(options.out_path, "--out");
  if (!options.journal_path.empty()) check_output_path(options.journal_path, "--journal");
  if (!options.compare_files.empty()) {
    try {
      return compare_tuned(options);
    } catch (...) {  // stopped while the executors started: nothing was raced
      if (!stop_requested) throw;
      std::cerr << "autotune: stopped by " << stop_signal_name() << " before the race; nothing was compared" << std::endl;
      return interrupted_exit_code();
    }
  }
  const BudgetClock clock;  // the budget bounds the whole run from here: the plan, probes, trials, the race, output
  std::optional<TunePlan> plan;
  std::optional<Tune> tune;
  try {
    // A stop before the first trial (the worker starting, the entry's probe) ends the run: nothing was measured.
    plan.emplace(plan_tune(options, clock));
    described_ranks = options.predict ? 1 : options.ranks;  // --predict: the trials run one rank's share
    tune.emplace(options, *plan, clock);
    if (stop_requested) throw Interrupted{};
  } catch (...) {
    if (!stop_requested) throw;
    std::cerr << "autotune: stopped by " << stop_signal_name() << " before the first trial ("
              << (options.entry.empty() ? "planning" : "starting the PyTorch worker and validating the entry")
              << "); its processes were stopped; nothing was measured, nothing written" << std::endl;
    return interrupted_exit_code();
  }
  search_and_race(*tune);
  try {
    predict_step(*tune);
  } catch (...) {
    if (!stop_requested) throw;
    tune->out.interrupted = true;  // the prediction's probe was stopped: the search's choice stands, unpredicted
  }
  return output_step(*tune);
}

}  // namespace tb::tune

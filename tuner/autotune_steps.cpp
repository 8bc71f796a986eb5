// autotune's steps once planned (autotune.h): the Tune and its journal, the search, the race of its finalists
// and what the output claims of it, where the budget went, --predict and the output; and their progress lines.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/device_info.h"
#include "runtime/error.h"
#include "runtime/files.h"
#include "runtime/python.h"
#include "runtime/stats.h"
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

bool write_output(const std::string& text, const std::string& out_path) {
  if (!out_path.empty()) {
    try {
      write_file_atomically(out_path, text);
      return true;
    } catch (const UsageError& e) {
      // A full disk at the end of a tune: what it measured goes to stdout rather than nowhere, the earlier file at
      // out_path left as it was.
      std::cerr << "autotune: " << e.what() << "; the configuration follows on stdout instead" << std::endl;
      std::cout << text << std::flush;
      return false;
    }
  }
  std::cout << text << std::flush;
  return true;
}

bool write_tune_page(const std::string& tuned_path, const std::string& journal_path, const std::string& page) {
  const std::string script = tune_page_script();
  std::vector<std::string> argv{script, tuned_path, "--out", page};
  if (!journal_path.empty()) argv.insert(argv.end(), {"--journal", journal_path});
  const int code = run_to_stderr(argv);
  if (code == 0) return true;
  if (code == 127)
    std::cerr << "autotune: the page " << page << " was not written: " << script
              << " could not be started (python3 with matplotlib and PyYAML: scripts/install-deps)" << std::endl;
  else
    std::cerr << "autotune: the page " << page << " was not written (scripts/tune-page exited with " << code << ")"
              << std::endl;
  return false;
}

namespace {

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

// The least an entry's check run of --predict is given to start its ranks and validate the entry there, when the
// budget has less left: the search's choice is not left unchecked for a second or two.
constexpr double kEntryCheckRunSeconds = 60.0;

// The finalists: the search's choice, its ties (runners-up), then the next fastest candidates by their
// best trial while there is room (kMaxSearchFinalists in all), then for each value of a switch that no
// finalist has yet, the fastest candidate with it, and the workload's own configuration when its trial
// ran (eligible to be chosen when it kept the memory headroom). The next fastest join however far
// behind they measured: a trial's interval covers the noise within it, not the drift between trials
// minutes apart (25% on the machine, 20x for seconds at a time on a busy 2-core one), so the
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

// As many finalists as kMinRoundsToDrop rounds of them fit in `seconds` (each slice as the race expects it: the
// candidate's set-up and its slice at --trial-seconds `trial_seconds`, at least `floor`): the last ones in
// finalists()' order (neighbouring micro-batches, then the best of each switch value, then the next fastest) left
// out first, never the choice nor the workload's own configuration. A race of ten finalists that affords two
// rounds gives no verdict; one of five that affords three does. Said on stderr; the entrants left out.
std::size_t fit_finalists_to_time(std::vector<RaceEntrant>& entrants, const Candidate& own, double seconds,
                                  double trial_seconds, double floor) {
  auto expected = [&](const RaceEntrant& e) {
    return std::max(floor, e.searched.setup_seconds + slice_seconds_for(trial_seconds, e.searched.pipelined)) * 1.1 +
           0.05;
  };
  std::size_t left_out = 0;
  for (;;) {
    double round = 0;
    for (const auto& e : entrants) round += expected(e);
    if (kMinRoundsToDrop * round <= seconds || entrants.size() <= 2) break;
    // the last that is neither the choice (first) nor the own configuration (under whichever reason it races)
    auto victim = entrants.end();
    for (auto it = entrants.end() - 1; it != entrants.begin(); --it)
      if (!(it->candidate == own)) {
        victim = it;
        break;
      }
    if (victim == entrants.end()) break;
    entrants.erase(victim);
    ++left_out;
  }
  return left_out;
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
            << slice_seconds_for(options.trial_seconds) << " s slices";
  const double loader_slice = slice_seconds_for(options.trial_seconds, true);
  const bool loader_fed = std::any_of(entrants.begin(), entrants.end(), [](const RaceEntrant& e) { return e.searched.pipelined; });
  if (loader_fed && loader_slice > slice_seconds_for(options.trial_seconds))
    std::cerr << " (" << loader_slice << " s for a candidate whose loader has workers)";
  std::cerr << std::endl;
}

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

// What an exhausted budget or a Ctrl-C leaves: the best of the trials so far, this run's and the
// workload's own configuration's when --resume took it from the journal rather than running it again.
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
  trial_deadline_ = options.budget - output_reserve(options.budget) - predict_reserve(options, plan, shortest);
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
  out.command = options.command_line;
  out.journal_path = journal_path;
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
  if (options.ranks > 1 && !options.trial_seconds_given)
    std::cerr << "autotune: a trial measures up to " << options.trial_seconds << " s on " << options.ranks
              << " ranks (a thirtieth of the budget, 3-10 s; --trial-seconds sets it)" << std::endl;
}

MeasurePolicy Tune::within_budget(MeasurePolicy policy) const {
  const double left = seconds_left();
  if (left < shortest.seconds) throw OutOfBudget("no time left in the budget for another trial");
  policy.max_seconds = std::min(policy.max_seconds, left);
  policy.wall_seconds = left;
  return policy;
}

// Kept from the search for the race: about kMinRoundsToDrop rounds of kExpectedFinalists at the mean slice of
// the likely finalists (the fastest measured and the workload's own: each one's set-up plus a slice or three
// steps; a busy machine makes both longer), at most `race_share` (set once the workload's own trial ran), and
// nothing while that share cannot buy one round of the choice against the workload's own configuration.
double Tune::after_race_reserve() const {
  // Nothing measured yet: nothing to profile after a race. The plan's shortest trial holds the entry's probe (its
  // first build: 20-30 s on a busy machine), and a reserve of twice that would keep the first trial from running.
  const bool measured = std::any_of(seen.begin(), seen.end(),
                                    [](const Ranked& t) { return t.result.ok() && t.result.samples_per_s > 0; });
  return measured ? profile_reserve(options, plan, slice_floor()) : 0.0;
}

double Tune::slice_floor() const {
  double floor = 0;
  for (const auto& t : seen)
    if (t.result.ok() && t.result.samples_per_s > 0) {
      const double step = static_cast<double>(t.candidate.global_batch) / t.result.samples_per_s;
      const double slice = t.result.setup_seconds + (1 + search_options.measure.min_steps) * step;
      floor = floor > 0 ? std::min(floor, slice) : slice;
    }
  return floor > 0 ? std::min(floor, shortest.seconds) : shortest.seconds;
}

double Tune::race_reserve() const {
  if (race_share <= 0 || setups.empty()) return 0.0;
  // A slice as the trials so far measured their candidates: the set-up (in the PyTorch worker, opening a
  // candidate; natively, a process), then its measuring, at least a slice and at least the three samples of
  // whole steps the measuring rule takes, with the race's safety margin. Finalists gather at the global batch
  // and micro-batch that run fastest, which are often the largest and the slowest to step (a median over all
  // of small_gpt's twin's trials, at global batches 4 to 16, kept 49 s for 3 rounds that took 75 s): their own
  // slices count. A compiling candidate's set-up is its compilation, which its slices do not pay again.
  // A slice of each likely finalist: the fastest distinct candidates measured so far (the race takes the search's
  // choice, its ties, the next fastest and the fastest of each switch value: the fast end of what ran), and the
  // workload's own configuration, which every race has. Not the slowest candidate measured: one slow micro-batch
  // (a 2-rank tune's 1 x 64 at 3.8 s a step) would keep a reserve no finalist needs, and end the search with its
  // budget a third unused.
  auto slice_of = [&](const Ranked& t) {
    const auto compiles = t.candidate.switches.find("compile");
    const bool compiled = compiles != t.candidate.switches.end() && compiles->second == "on";
    const double step = static_cast<double>(t.candidate.global_batch) / t.result.samples_per_s;
    return (compiled ? 0.0 : t.result.setup_seconds) +
           std::max(slice_seconds_for(options.trial_seconds, t.result.pipelined), 3 * std::max(step, 0.02));
  };
  std::vector<const Ranked*> ok;
  for (const auto& t : seen)
    if (t.result.ok() && t.result.samples_per_s > 0) ok.push_back(&t);
  if (ok.empty()) return 0.0;
  std::stable_sort(ok.begin(), ok.end(), [](const Ranked* a, const Ranked* b) {
    return a->result.samples_per_s > b->result.samples_per_s;
  });
  std::set<std::string> counted;
  double round = 0;
  for (const Ranked* t : ok) {  // the own configuration's slice, wherever it ranks
    if (!(t->candidate == plan.own)) continue;
    round += slice_of(*t);
    counted.insert(t->candidate.key());
    break;
  }
  // Of the others, those within kLikelyFinalist of the fastest: one far behind is no finalist (a 2-rank tune's
  // 1 x 64 ran at 4% of the fastest, and its slice would have been 13 s against 2 s for the fast ones)
  const double fastest = ok.front()->result.samples_per_s;
  for (const Ranked* t : ok) {
    if (static_cast<double>(counted.size()) >= kExpectedFinalists || t->result.samples_per_s < kLikelyFinalist * fastest)
      break;
    if (counted.insert(t->candidate.key()).second) round += slice_of(*t);
  }
  const double slice = 1.1 * std::max(slice_floor(), round / static_cast<double>(counted.size()));
  const double rounds = std::min(options.race_rounds, kMinRoundsToDrop);
  // As many finalists as the race would take of what ran (at least the choice and the workload's own, at most
  // kExpectedFinalists), at their mean slice: a search that ran few candidates is not held back for finalists it
  // has not found, and its reserve grows as it finds them.
  const double finalists = std::clamp(static_cast<double>(counted.size()), 2.0, kExpectedFinalists);
  return race_share < 2 * slice ? 0.0 : std::min(race_share, rounds * finalists * slice);
}

void Tune::note_trial(const Candidate& c, const TrialResult& r) {
  if (stop_requested) throw Interrupted{};
  seen.push_back(Ranked{c, r});
  if (r.ok()) setups.push_back(r.setup_seconds);
  std::cerr << "autotune: [trial " << seen.size() << ", " << human_seconds(clock.elapsed()) << " of "
            << human_seconds(options.budget) << " budget] " << describe(c) << " -> " << result_text(r) << std::endl;
  try {
    journal_->append(c, r);
  } catch (const JournalWriteError& e) {
    // A full disk ends the tune as a stop does, but not its measurements: this trial counts for the best so far.
    journal_error = e.what();
    journal_kept = seen.size() - 1 + resumed;
    throw JournalNotWritten{};
  }
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
  std::vector<RaceEntrant> entrants = finalists(out.report, *out.baseline, memory_limit,
                                                tune.plan.space.memory_switches);
  if (const std::size_t left_out =
          fit_finalists_to_time(entrants, out.baseline->candidate, tune.seconds_left(), tune.options.trial_seconds,
                                tune.slice_floor());
      left_out > 0)
    std::cerr << "autotune: " << left_out << " finalist" << (left_out == 1 ? "" : "s")
              << " left out of the race: " << kMinRoundsToDrop << " rounds of every one would not fit in the "
              << human_seconds(tune.seconds_left()) << " left" << std::endl;
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
                                      [&] { return tune.seconds_left(); }, tune.slice_floor(),
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
                       "race: the finalists' rounds; profile: the steps split into their parts (an entry) and the "
                       "chosen step's communication profile (an entry on ranks); unused (where more than a tenth): why; "
                       "set_up_per_candidate: the median set-up of the trials after the "
                       "first (opening a candidate: building, checking and warming it up)"}};
  std::cerr << std::fixed << std::setprecision(1) << "autotune: the budget: " << set_up << " s set-up, " << search
            << " s search (" << tune.seen.size() << " trials), " << race << " s race (" << (out.race ? out.race->rounds : 0)
            << " rounds), ";
  if (tune.profile_seconds > 0) std::cerr << tune.profile_seconds << " s profile, ";
  std::cerr << now << " s of " << tune.options.budget << " s" << std::defaultfloat << std::endl;
  // More than kGiveBackShare of the budget unused: why
  const double unused = tune.options.budget - now;
  if (unused > kGiveBackShare * tune.options.budget && !out.interrupted) {
    std::string why;
    if (out.race && out.race->budget_exhausted)
      why = "what is left is less than the race's next round would take (" + out.race->ended + ")";
    else if (!out.report.budget_exhausted)
      why = std::string("the search was exhausted: it measured every candidate its rules would try") +
            (out.race ? "; the race ended " + out.race->ended : "");
    else if (out.race)
      why = "the race ended before the budget (" + out.race->ended + ") and the search had no time left of its own";
    else
      why = "what is left is less than the next trial would take";
    out.budget_spent["unused_seconds"] = unused;
    out.budget_spent["unused_why"] = why;
    std::cerr << "autotune: " << human_seconds(unused) << " of the budget unused: " << why << std::endl;
  }
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
  const double left = tune.seconds_left() + tune.after_race_reserve();
  if (left < 0.5 * tune.slice_floor()) {
    std::cerr << "autotune: no budget left to profile the choice's communication (" << human_seconds(std::max(left, 0.0))
              << " left, opening and stepping a candidate takes " << human_seconds(tune.slice_floor()) << ")" << std::endl;
    return;
  }
  const ProfileAnswer p = read_profile_answer(entry->profile(out.report.best.candidate, kProfiledSteps, left));
  if (!p.error.empty()) {
    std::cerr << "autotune: profiling the choice's communication failed: " << p.error << std::endl;
    return;
  }
  const int64_t steps = p.steps > 0 ? p.steps : kProfiledSteps;
  out.communication = {
      {"share", p.share},
      {"step_seconds", p.wall_seconds / static_cast<double>(steps)},
      {"exposed_seconds", p.exposed_seconds / static_cast<double>(steps)},
      {"communication_seconds", p.communication_seconds / static_cast<double>(steps)},
      {"rank_shares", p.rank_shares},
      {"steps", steps},
      {"how", "torch.profiler over the steps on every rank: the time a collective was in flight while the rank "
              "computed nothing, per step; the rank that waited most"}};
  std::cerr << "autotune: the chosen configuration's step waits " << std::fixed << std::setprecision(1)
            << 100 * p.share << "% of its time for communication ("
            << 1e3 * out.communication["exposed_seconds"].get<double>() << " ms of "
            << 1e3 * out.communication["step_seconds"].get<double>() << " ms a step, profiled on " << entry->ranks()
            << " ranks)" << std::defaultfloat << std::endl;
}

// An entry: where the step's time goes, for the choice and the entry's own configuration, from a few steps timed part
// by part in the worker (scripts/trainbench/pytorch/data.py PartTimer: waiting for the next micro-batches and
// their copy to the device, forward and backward, clipping with the optimizer's step and zeroing, the loss read
// by the host; on ranks the communication a step waits for, from a profiled step), apart from the samples speed is
// judged on. Each part in ms and % of the profiled step, beside the same number of steps timed whole between the
// profiled ones (what a clock between the parts costs, and whether the parts add up) and the step the timed samples
// measured.
namespace {
// At least this many steps part by part (and as many timed whole), and as many as about kSplitSeconds hold in all
// (kLoaderSplitSeconds for a loader-fed candidate):
// a few milliseconds' steps vary with what the machine does meanwhile.
constexpr int64_t kSplitSteps = 3;
constexpr int64_t kMaxSplitSteps = 200;

nlohmann::json split_json(const Candidate& c, const SplitAnswer& said, double measured_step_seconds) {
  const double step = said.step_seconds;
  nlohmann::json parts = nlohmann::json::object();
  double sum = 0;
  for (const char* name : {"data", "forward_backward", "optimizer", "communication", "sync"}) {
    const double seconds = said.parts.at(name);
    sum += seconds;
    parts[name] = {{"ms", 1e3 * seconds}, {"percent", step > 0 ? 100 * seconds / step : 0.0}};
  }
  return {{"config", c.key()},
          {"step_ms", 1e3 * step},
          {"parts_sum_ms", 1e3 * sum},
          {"whole_step_ms", 1e3 * said.whole_step_seconds},
          {"timed_step_ms", 1e3 * measured_step_seconds},
          {"steps", said.steps > 0 ? said.steps : kSplitSteps},
          {"parts", parts}};
}

std::string split_line(const nlohmann::json& s) {
  static const std::map<std::string, std::string> words{{"data", "waiting for data"},
                                                        {"forward_backward", "forward+backward"},
                                                        {"optimizer", "clip+optimizer+zero"},
                                                        {"communication", "communication"},
                                                        {"sync", "host sync"}};
  std::ostringstream line;
  line << std::fixed << std::setprecision(1) << s["step_ms"].get<double>() << " ms a step: ";
  bool first = true;
  for (const char* name : {"data", "forward_backward", "optimizer", "communication", "sync"}) {
    const auto& p = s["parts"][name];
    line << (first ? "" : ", ") << words.at(name) << ' ' << p["ms"].get<double>() << " ms (" << std::setprecision(0)
         << p["percent"].get<double>() << "%)" << std::setprecision(1);
    first = false;
  }
  line << " [" << s["steps"].get<int64_t>() << " steps timed part by part, as many timed whole between them: "
       << s["whole_step_ms"].get<double>() << " ms; in the race: " << s["timed_step_ms"].get<double>() << " ms]";
  return line.str();
}
}  // namespace

void time_split_step(Tune& tune) {
  EntryExecutor* entry = tune.plan.runner.entry;
  TuneOutput& out = tune.out;
  if (!entry || !out.report.found || out.interrupted || stop_requested) return;
  std::vector<std::pair<std::string, Ranked>> which{{"chosen", out.report.best}};
  if (out.baseline && out.baseline->result.ok() && !(out.baseline->candidate == out.report.best.candidate))
    which.emplace_back("own", *out.baseline);
  nlohmann::json split = nlohmann::json::object();
  for (const auto& [name, ranked] : which) {
    const double left = tune.seconds_left() + tune.after_race_reserve();
    if (left < 0.5 * tune.slice_floor()) {
      std::cerr << "autotune: no budget left to split the " << name << " configuration's step into its parts"
                << std::endl;
      break;
    }
    const double timed = ranked.result.samples_per_s > 0
                             ? static_cast<double>(ranked.candidate.global_batch * out.ranks) / ranked.result.samples_per_s
                             : 0.0;
    const auto workers = ranked.candidate.switches.find("num_workers");
    const bool loader_fed = workers != ranked.candidate.switches.end() && workers->second != "0";
    const double seconds = loader_fed ? kLoaderSplitSeconds : kSplitSeconds;
    const int64_t steps =
        timed > 0 ? std::clamp<int64_t>(std::llround(seconds / (2 * timed)), kSplitSteps, kMaxSplitSteps) : kSplitSteps;
    const SplitAnswer said = read_split_answer(entry->split(ranked.candidate, steps, left));
    if (!said.error.empty()) {
      std::cerr << "autotune: splitting the " << name << " configuration's step failed: " << said.error << std::endl;
      continue;
    }
    split[name] = split_json(ranked.candidate, said, timed);
    if (name == "chosen" && !said.dataloader.is_null() && ranked.candidate.switches.count("num_workers"))
      out.dataloader = said.dataloader;
    std::cerr << "autotune: where the " << (name == "chosen" ? "chosen" : "entry's own") << " configuration's "
              << split_line(split[name]) << std::endl;
  }
  if (!split.empty()) {
    split["how"] = "a few steps after the race, each part between two reads of the clock (the device drained at each): "
                   "data is waiting for the next micro-batches (the iterable's next(), its epochs' starts spread over "
                   "their steps) and their copy to the device; communication (ranks) is the time a collective was in "
                   "flight while the rank computed nothing, taken out of forward_backward";
    out.time_split = split;
  }
}

void search_and_race(Tune& tune) {
  try {
    search_step(tune);
    race_step(tune);
    tune.race_ended = tune.clock.elapsed();
    time_split_step(tune);
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
  } catch (const JournalNotWritten&) {
    tune.out.interrupted = true;
    tune.out.race.reset();
    tune.out.speedup.reset();
    settle_on_best_so_far(tune);
    std::cerr << "autotune: " << tune.journal_error << "; the tune stops after " << tune.seen.size()
              << " trials: the journal keeps " << tune.journal_kept
              << " finished trials (--resume goes on from them once there is room); writing the best so far" << std::endl;
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

// --report after a tune: the page of the tune's own document (written beside the page for the time it takes, since
// --format may be a framework's) and its journal. A page that cannot be written costs the exit status, nothing else.
bool report_step(const Tune& tune) {
  const std::string& page = tune.options.report_path;
  if (page.empty()) return true;
  const std::string document = page + ".tuned.json.tmp";
  bool written = false;
  try {
    write_file_atomically(document, emit(tune.out, OutFormat::json));
    written = write_tune_page(document, tune.journal_path, page);
  } catch (const std::exception& e) {
    std::cerr << "autotune: the page " << page << " was not written: " << e.what() << std::endl;
  }
  std::error_code ignored;
  std::filesystem::remove(document, ignored);
  if (written) std::cerr << "autotune: the tune's page: " << page << std::endl;
  return written;
}

int output_step(const Tune& tune) {
  const TuneOutput& out = tune.out;
  const std::string& out_path = tune.options.out_path;
  if (out.report.found) std::cerr << "autotune: " << global_batch_note(out) << std::endl;
  const bool out_written = write_output(emit(out, tune.options.format), out_path);
  const std::string written_to = out_written && !out_path.empty() ? out_path : "stdout";
  const bool page_written = report_step(tune);
  if (!tune.journal_error.empty() && !stop_requested) {
    std::cerr << "autotune: stopped after " << human_seconds(tune.clock.elapsed()) << " as the journal "
              << tune.journal_path << " could not be written: "
              << (out.report.found ? "the best so far (" + describe(out.report.best.candidate) + ")"
                                   : "no configuration (none ran)")
              << " written to " << written_to << "; the journal keeps " << tune.journal_kept << " finished trials"
              << std::endl;
    return 1;
  }
  if (out.interrupted || stop_requested) {  // a stop during the output: the output is whole, the exit says so
    std::cerr << "autotune: stopped by " << stop_signal_name() << " after " << human_seconds(tune.clock.elapsed()) << ": "
              << (out.report.found ? "the best so far (" + describe(out.report.best.candidate) + ")"
                                   : "no configuration (none ran)")
              << " written to " << written_to << "; the journal " << tune.journal_path << " keeps "
              << (tune.journal_error.empty() ? tune.seen.size() + tune.resumed : tune.journal_kept)
              << " finished trials (--resume goes on from them)"
              << std::endl;
    return interrupted_exit_code();
  }
  std::cerr << "autotune: " << (out.report.found ? "chose " + describe(out.report.best.candidate) : "no configuration ran")
            << " after " << tune.seen.size() << " trials"
            << (out.race ? " and " + std::to_string(out.race->rounds) + " race rounds" : "") << " in "
            << human_seconds(tune.clock.elapsed()) << "; journal " << tune.journal_path
            << (out_path.empty() ? "" : ", config " + written_to) << std::endl;
  return out.report.found && page_written && out_written ? 0 : 1;
}

}  // namespace tb::tune

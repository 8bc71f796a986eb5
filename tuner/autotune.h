// autotune as steps: the command line parsed into options, the plan they make before any trial (the
// machine, the workload as searched, the executor, the search space), then the search, the race of
// its finalists, the --predict of more ranks and the output. run() is the command (autotune_main.cpp);
// tests call the steps.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "step/workload.h"
#include "tuner/emit.h"
#include "tuner/entry.h"
#include "tuner/journal.h"
#include "tuner/search.h"
#include "tuner/trial.h"

namespace tb::tune {

// Finalists a few percent apart on a machine with slow spells: after 6 rounds their interval often
// still spans both (a tie, settled by memory), and two tunes of one workload then chose micro-batches
// whose interleaved comparison later differed by 7% (2 pairs of 6 here); with 12, 6 of 6 agreed. A
// race ends as soon as one finalist is left, so the rounds are paid only where the call is close, and
// the race never takes more than its share of the budget.
constexpr int kDefaultRaceRounds = 12;

// The command line, parsed and checked.
struct AutotuneOptions {
  std::string gpu = "auto";
  std::string workload = "small_gpt";
  bool workload_given = false;  // --workload was on the command line (--compare reads the files' otherwise)
  int64_t batch = 0;            // --batch, 0: not given
  std::string batch_range;      // --batch-range A:B, "": not given
  int64_t micro_batch = 0;      // --micro-batch, 0: searched
  std::string strategy = "auto";
  std::string switches;  // --switches: "" all the workload has, "none", or a comma list
  OutFormat format = OutFormat::yaml;
  std::string journal_path, out_path;
  std::string executor = "native";  // native, torch, or native,torch with --compare
  int64_t memory_limit = 0;         // bytes, 0: what the device has
  std::string entry;                // --entry FILE.py:NAME or hf:MODEL (implies executor torch)
  std::string versus;               // --versus largest-batch (with --entry): the baseline the choice races
  std::vector<std::string> compare_files;
  std::string from_file;  // --from TUNED.yaml: its choice written in --format, nothing run
  std::string report_path;  // --report PAGE.html: the tune's page (scripts/tune-page), or --from's file's
  bool format_given = false;
  std::string command_line;  // how autotune was called, shell-quoted: the output says how to tune again
  int64_t ranks = 1, probe_ranks = 2;
  std::string launcher = "mpirun";
  std::string torchrun;  // --launcher 'torchrun ARGS': how an entry's ranks start ("": torchrun --standalone)
  bool predict = false, resume = false;
  double budget = 300, trial_seconds = 10;
  // --trial-seconds was given. Without it, a tune on ranks sizes its trials from the budget
  // (ranks_trial_seconds): a step on N ranks rarely gets its interval to 1%, so every trial would run the whole
  // length and the search would end before it reached the ranks' switches.
  bool trial_seconds_given = false;
  int race_rounds = kDefaultRaceRounds;
  std::string help;  // --help: the text to print, and nothing else to do
};

// A trial's longest measurement on ranks without --trial-seconds: a thirtieth of the budget, between 3 s and 10 s
// (at --budget 180, 6 s: room for the dozen trials that reach every DDP switch).
double ranks_trial_seconds(double budget);

// Throws UsageError, with one line saying what is wrong, for an unknown option, a value out of range
// or options that cannot go together.
AutotuneOptions parse_options(int argc, const char* const* argv);

// --memory-limit: "16G", "512M", "3.5GiB", or bytes. Throws UsageError naming the value.
int64_t parse_memory_limit(const std::string& text);

// The backend a run measures on, and what the output says about it.
struct Machine {
  bool use_cuda = false;
  int device = 0;
  std::string backend, name;
  nlohmann::json description;
};

// --gpu: auto, cpu or a device index (UsageError for one that does not exist).
Machine pick_machine(const std::string& gpu);

// The executor the trials run in: the C++ step in `autotune --trial` children (native), the PyTorch
// twin of the step (torch) or the user's own model (--entry) in one `scripts/torch-step --serve` worker.
struct TrialRunner {
  std::unique_ptr<Executor> executor;
  nlohmann::json description;           // the output's executor
  const WorkerStats* worker = nullptr;  // the PyTorch worker's starts and restarts (torch executors), owned by `executor`
  EntryExecutor* entry = nullptr;       // --entry: the executor (owned by `executor`), which also finds --versus's batch
  std::string journal_tag;              // keeps the executors' journals apart
  bool torch = false;
};

// A tune as the options describe it, before any trial runs.
struct TunePlan {
  Machine machine;
  step::Workload workload;            // under --ranks, one rank's share of the batch
  std::optional<EntryProbe> entry;    // --entry: the user's model, probed
  GlobalBatchPlan batches;            // the global batches searched (one rank's share under --ranks)
  std::vector<std::string> launcher;  // --ranks: the launcher's words
  TrialRunner runner;
  SearchSpace space;
  Candidate own;  // the workload's own configuration
  std::string workload_digest;
};

// --ranks N: the search works on one rank's share of each global batch. Rewrites `workload`'s batch
// and `batches` to that share; throws UsageError where the user's batch does not split over the ranks.
void share_batches_over_ranks(const AutotuneOptions& options, step::Workload& workload, GlobalBatchPlan& batches);

// --switches over the switches the workload has on this backend: the searched values per switch, the
// ones left out at the workload's own value. Throws UsageError naming an unknown switch.
SearchSpace search_space(const std::string& switch_list, const std::map<std::string, std::vector<std::string>>& available,
                         const std::string& backend);

// The budget's clock: started before the plan, so that --budget bounds the whole run.
class BudgetClock {
 public:
  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count(); }

 private:
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

// The machine, the workload (its batch shared over the ranks), the executor and the search space.
// Throws UsageError for what cannot run: a bad workload or entry, a batch that does not split, an
// unknown switch, a workload that does not fit at micro-batch 1. An entry's probe runs within what is
// left of the budget on `clock`.
TunePlan plan_tune(const AutotuneOptions& options, const BudgetClock& clock = BudgetClock());

// A tune under way: its deadlines, the journal, the trials so far and the output being filled in.
// Holds callbacks into itself: it stays where it was made.
class Tune {
 public:
  // Refuses (UsageError) a budget too small for one trial; opens the journal (--resume loads it).
  Tune(const AutotuneOptions& options, TunePlan& plan, const BudgetClock& clock);
  Tune(const Tune&) = delete;
  Tune& operator=(const Tune&) = delete;

  const AutotuneOptions& options;
  TunePlan& plan;
  const BudgetClock& clock;
  SearchOptions search_options;             // the search's settings and its callbacks
  TrialEstimate shortest;                   // the shortest trial this machine can run
  std::vector<Ranked> seen;                 // every finished trial, in order
  std::optional<Ranked> resumed_own_trial;  // the workload's own configuration, when --resume took it from the journal
  std::size_t resumed = 0;                  // trials --resume took from the journal
  std::vector<double> setups;               // of the ok trials so far, seconds
  double race_share = 0;                    // of the time left, kept for the race while the search runs (0: none)
  std::string journal_path;
  // Why a trial's line could not be journaled ("": every one was), and how many lines the journal kept then.
  std::string journal_error;
  std::size_t journal_kept = 0;
  TuneOutput out;
  bool only_own = false;  // the search ran nothing but the workload's own configuration
  // Where the budget went (seconds on the clock): the plan (probes; the twin's worker start) ends when the tune
  // starts; the search runs from search_started (after --versus's largest-batch search) to search_ended.
  double plan_seconds = 0, search_started = 0, search_ended = 0, race_ended = 0;
  double profile_seconds = 0;  // an entry: the steps' time split and, on ranks, the communication profile, after the race

  // What the search and the race may spend: the budget less the output's, --predict's and what comes after the
  // race (after_race_reserve), less what has run.
  double seconds_left() const { return trial_deadline_ - after_race_reserve() - clock.elapsed(); }
  // Kept for after the race: an entry's time split and, on ranks, its communication profile (profile_reserve);
  // nothing until a trial has measured something to profile.
  double after_race_reserve() const;
  // `policy` cut to what is left of the budget; OutOfBudget when not even the shortest trial fits.
  MeasurePolicy within_budget(MeasurePolicy policy) const;
  // The time kept from the search for the race.
  double race_reserve() const;
  // The shortest a race slice can be: the quickest measured candidate's set-up, warm-up step and fewest measured
  // steps (the plan's estimate of the shortest trial until one ran; it includes the entry's probe, which a
  // candidate opened in the running worker does not pay again).
  double slice_floor() const;
  // A finished trial: counted, said on stderr, journaled (Interrupted after a Ctrl-C; JournalNotWritten, the trial
  // counted, when its line could not be written).
  void note_trial(const Candidate& c, const TrialResult& r);

 private:
  void open_journal();
  void announce() const;
  std::unique_ptr<Journal> journal_;
  double trial_deadline_ = 0;  // seconds after the clock started
};

// The workload's own configuration, then the search (search.h).
void search_step(Tune& tune);
// The search's finalists and the workload's own configuration raced interleaved (race.h), and the
// speedup the race holds.
void race_step(Tune& tune);
// The search and the race, with what an exhausted budget or a Ctrl-C leaves: the best so far.
void search_and_race(Tune& tune);
// --predict: the all-reduce measured on the ranks at hand, and N ranks predicted from it.
void predict_step(Tune& tune);
// The configuration to stdout or --out, the summary to stderr; the exit code.
int output_step(const Tune& tune);

// `autotune --compare A B ...`: the files' choices raced interleaved, each against the first's.
int compare_tuned(const AutotuneOptions& options);

// A tuned file (autotune's own document, YAML or JSON) as --compare and --from read it. `text` is the file's
// content and `path` names it in messages; UsageError "PATH: ..." for anything that is not such a document.
// --compare's part: the chosen configuration and the workload it was tuned for.
struct TunedFile {
  std::string path;
  Candidate chosen;
  std::string workload_path, workload_digest;
};
TunedFile parse_tuned_file(const std::string& text, const std::string& path);
// --from's part: the choice with what the frameworks' formats need of it (ranks, the gradient clipping, the
// launcher, the device's backend, the loader's settings). A file without the gradient clipping is said on stderr.
TuneOutput tuned_output_from_text(const std::string& text, const std::string& path);

// The whole command; throws UsageError for bad usage (exit 2).
int run(int argc, char** argv);

}  // namespace tb::tune

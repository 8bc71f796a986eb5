// autotune's parts (options, signals, plan, steps, compare), internal: what one part of autotune.cpp's
// command uses of another. The public steps are in autotune.h; nothing outside tuner/autotune*.cpp includes this.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "step/workload.h"
#include "tuner/autotune.h"
#include "tuner/race.h"
#include "tuner/search.h"
#include "tuner/trial.h"

namespace tb::tune {

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
// A tune that leaves more than this share of its budget unused says why (budget_spent.unused_why).
constexpr double kGiveBackShare = 0.10;
// The search's, the workload's own, a switch value none of those has, the choice's neighbouring micro-batches.
constexpr double kExpectedFinalists = kMaxSearchFinalists + 4;
// An entry's time split runs a candidate's steps for about this long (at least 3 of them).
constexpr double kSplitSeconds = 1.0;
// ... and a loader-fed candidate's (num_workers > 0) for this long: its steps swing as the workers run ahead and
// fall behind, and the steps timed part by part met those timed whole between them within -10% to +13% over 1 s
// in all, -3% to +5% over 3 s (ten splits each on the 2-core Xeon).
constexpr double kLoaderSplitSeconds = 3.0;
// A loader-fed candidate's race slice measures at least this long, for the same reason. On the 2-core Xeon, the
// per-sample entry's race finalists, their slices in the same rounds as the in-memory entry's 1 s ones, spread
// 0.75-1.03x as much at 2 s (the residual standard deviation once finalist and round are taken out; scripts/
// loader-bench, docs/measured/cpu-vm-2026-12-03-whole-step.md); in races of their own, run minutes apart, 0.7-3.4x.
// At 1 s, in one such drive, 0.77x: the longer slice is a margin the noise did not show a need for there.
constexpr double kLoaderSliceSeconds = 2.0;
// A candidate measured at this share of the fastest or more may be a finalist: the race's reserve counts its slice.
constexpr double kLikelyFinalist = 0.5;
// Without a race verdict, a search's choice other than the workload's own must beat it by more than the drift
// between trials; where no candidate was measured twice, this (a shared machine's run-to-run spread, 10-20%).
constexpr double kDefaultTrialDrift = 0.15;
constexpr double kLevel = 0.95;  // of every interval the race reports

// Stop signals (autotune_signals.cpp).
// Set by SIGINT, SIGTERM or SIGHUP: every phase stops at its next look.
extern std::atomic<bool> stop_requested;
// Thrown where a stop is seen within the tune: the best so far is written.
struct Interrupted {};
// Thrown where a trial's line could not be journaled (a full disk): the tune stops, the best so far is written.
struct JournalNotWritten {};
// SIGINT, SIGTERM and SIGHUP stop a tune alike (the trial in flight stopped, the best so far written).
void install_stop_handlers();
// 128 + the first stop signal (SIGINT when none came).
int interrupted_exit_code();
// The first stop signal's name, for what autotune says on stopping.
std::string stop_signal_name();

// Progress lines (autotune_steps.cpp).
// "1.5s", or "2m05s" from a minute on.
std::string human_seconds(double s);
// --ranks: the candidates hold one rank's share of the batch; progress lines speak of all ranks.
extern int64_t described_ranks;
// A candidate as progress lines say it: the global batch as micro-batch x accumulation (x ranks), the switches.
std::string describe(const Candidate& c);
// A trial's samples/s with its interval and peak memory, or its class and message.
std::string result_text(const TrialResult& r);
// `text` to stdout, or to `out_path` atomically; where out_path cannot be written (a full disk), that is said on
// stderr, `text` goes to stdout instead, and the answer is false.
bool write_output(const std::string& text, const std::string& out_path);

// --report: the page of a tuned file (autotune's own document, YAML or JSON) and its journal ("": none), written by
// scripts/tune-page to `page` (atomically). False, its reason said on stderr by tune-page or here, when it was not.
bool write_tune_page(const std::string& tuned_path, const std::string& journal_path, const std::string& page);

// The plan (autotune_plan.cpp).
// The executor `which` names (native or torch) for `workload` on `machine`, with its output description.
TrialRunner make_runner(const std::string& which, const step::Workload& workload, const Machine& machine, int64_t ranks = 1,
                        const std::vector<std::string>& launcher = {}, bool independent = false, int64_t memory_limit = 0);
// A file's whole text ("" when it cannot be read).
std::string file_text(const std::string& path);
// --predict's share of the budget, kept from the trials: the probe and the check run where the ranks are at hand.
double predict_reserve(const AutotuneOptions& options, const TunePlan& plan, const TrialEstimate& shortest);
// An entry on ranks: the budget kept for the profile of the choice's communication after the race.
double profile_reserve(const AutotuneOptions& options, const TunePlan& plan, double slice);
// Kept back from the trials: the output, and the exit of a trial stopped at the budget's end.
double output_reserve(double budget);
// Refused (UsageError) before anything runs: a budget too small for one trial of `c`.
void refuse_budget_below_one_trial(const step::Workload& workload, const Candidate& c, const TrialEstimate& shortest,
                                   const MeasurePolicy& measure, double budget, double elapsed);
// A race slice's measuring time at --trial-seconds: of a pipelined candidate (TrialResult::pipelined), at least
// kLoaderSliceSeconds.
double slice_seconds_for(double trial_seconds, bool pipelined = false);
// The race's settings and its progress lines on stderr.
RaceOptions race_options(const SearchOptions& search, int rounds, double trial_seconds, std::function<double()> seconds_left,
                         double min_trial_seconds, std::function<double()> elapsed, double budget);

// --compare and --from (autotune_compare.cpp).
// "native,torch" -> {"native", "torch"}.
std::vector<std::string> executor_names(const std::string& text);
// --from: the tuned file's choice written in --format; nothing runs.
int emit_tuned_file(const AutotuneOptions& options);

}  // namespace tb::tune

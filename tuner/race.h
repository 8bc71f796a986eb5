// Finalists measured interleaved. Trials run one after another compare the machine's drift as much
// as the candidates: on a shared CPU one configuration moved 25% between trials minutes apart while
// each trial's own interval was +-1%. The race measures the finalists in rounds, one short trial (a
// slice) of every finalist still in each round, the order rotated and reversed from round to round,
// and judges them on their per-round throughput ratios, which a drift of the whole machine between
// rounds does not move and a linear drift within a round moves one way, then back. A finalist
// consistently behind the leader is dropped; what stays in is ranked by its ratio to the leader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "tuner/search.h"

namespace tb::tune {

// A against B over rounds both ran, as runtime/stats.h's paired_t_ratio_estimate gives it: the ratio is
// exp of the Hodges-Lehmann estimate of the per-round log ratios (robust to one wild round), the interval
// the paired t test's at `level`. Below two rounds nothing is known about the spread: the interval is
// (0, inf).
struct PairedRounds {
  // Verdicts need this many rounds: two give an interval, but its spread rests on one difference,
  // and two rounds that happen to agree would claim a speedup the third does not hold.
  static constexpr int kMinRoundsForVerdict = 3;
  int rounds = 0;
  double ratio = 1;
  double ci_low = 0;
  double ci_high = std::numeric_limits<double>::infinity();
  double level = 0.95;
  bool decides() const { return rounds >= kMinRoundsForVerdict; }
  // The interval excludes 1 by at least `margin`: A is faster (slower) than B beyond noise.
  bool faster_beyond(double margin) const { return decides() && ci_low > 1 + margin; }
  bool slower_beyond(double margin) const { return decides() && ci_high < 1 - margin; }
  // The interval lies within 1 +- margin: A and B are shown to be the same within noise.
  bool within(double margin) const { return decides() && ci_low >= 1 - margin && ci_high <= 1 + margin; }
};

// Pairs a[r] with b[r] for r < min(a.size(), b.size()); values are throughputs (> 0).
PairedRounds paired_rounds(const std::vector<double>& a, const std::vector<double>& b, double level = 0.95);

// The slice order of round `round` (0-based) over `n` finalists: that round of runtime/schedule.h's
// schedule (mirrored pairs of rounds, rotated pair to pair), asked one round at a time because
// finalists drop out between rounds.
std::vector<std::size_t> round_order(std::size_t n, int round);

struct RaceEntrant {
  Candidate candidate;
  TrialResult searched;  // what the search measured of it, when it did: set-up time and peak memory
  bool eligible = true;  // may be chosen (the workload's own configuration without the headroom may not)
  std::string why;       // why it races: "choice", "tie", "next fastest", "best optimizer=fused", "own"
  // How far it is from the workload's own configuration, for ties (the simpler one wins): the switches set
  // to a value with a cost of its own (compile=on: compilation time and memory), and the switches and
  // micro-batch changed.
  int costly = 0;
  int changed = 0;
};

struct RaceOptions {
  int max_rounds = 6;
  int min_rounds_to_drop = PairedRounds::kMinRoundsForVerdict;
  double noise_margin = 0.01;  // ratios within 1 +- this are the same configuration's speed
  double level = 0.95;
  MeasurePolicy slice;  // each slice is a short trial
  // A finalist whose searched trial was pipelined (its batches from loader workers) measures its slices at least this
  // long (0: as every other): its steps swing as the workers run ahead and fall behind.
  double pipelined_slice_seconds = 0;
  // When set, wall-clock seconds left: a round starts only when every slice of it is expected to fit,
  // and each slice must end in time (MeasurePolicy::wall_seconds).
  std::function<double()> seconds_left;
  double min_trial_seconds = 0;  // the shortest a slice can be, for that expectation
  // Progress: a round starts (1-based, with the finalists still in), a slice ended, a finalist was
  // dropped after a round. A callback may throw to stop the race (an interrupt): it propagates.
  std::function<void(int round, int max_rounds, std::size_t racing)> on_round;
  std::function<void(int round, const Candidate&, const TrialResult&)> on_slice;
  std::function<void(int round, const Candidate&, const std::string& why)> on_drop;
};

struct Finalist {
  Candidate candidate;
  bool eligible = true;
  int costly = 0, changed = 0;      // RaceEntrant's
  std::string why;                  // RaceEntrant::why
  std::vector<TrialResult> slices;  // one per complete round it ran in, in round order
  int dropped_after = 0;            // the round after which it was dropped; 0: still in at the end
  std::string why_dropped;
  PairedRounds vs_leader;  // against the leader at the end, or when it was dropped

  std::vector<double> per_round() const;  // samples/s of each slice
  int64_t peak_bytes() const;             // the most any slice used
  // The throughput over the race: the median of the rounds with its distribution-free interval
  // (the drift between rounds included: it is the run-to-run spread), the largest peak memory,
  // steps and seconds summed; one round: its slice.
  TrialResult measured(double level) const;
};

struct RaceReport {
  std::vector<Finalist> finalists;  // in the order given
  int rounds = 0;                   // complete rounds
  int max_rounds = 0;
  int leader = -1;         // the fastest still in, the machine's level each round taken out; -1: no round ran
  int choice = -1;         // of the eligible finalists still in that tie with the leader, the simplest (below)
  std::string choice_why;  // why the choice is not the leader, when it is not
  bool budget_exhausted = false;
  std::string ended;  // why the race stopped, in words
  double seconds = 0;
  // `a` against `b` over the rounds both ran.
  PairedRounds compare(std::size_t a, std::size_t b, double level) const;
};

// Races the entrants (distinct candidates, at least one; the first is the incumbent, the search's
// choice, which stays the choice when the race ends before a verdict is possible). A slice that
// fails (oom, error, ...) drops its finalist; a slice stopped at the budget's end (OutOfBudget) ends
// the race without its round.
RaceReport race(Executor& executor, const std::vector<RaceEntrant>& entrants, const RaceOptions& options);

}  // namespace tb::tune

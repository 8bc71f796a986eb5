// The race of the finalists (race.h). Rounds, each one slice of every finalist still in, in the order
// round_order gives (runtime/schedule.h's). After each complete round the leader is the finalist with
// the highest score: per round, its log throughput less the round's mean over the finalists still in
// (the machine's level that round), and over the rounds the Hodges-Lehmann estimate of those. From
// round `min_rounds_to_drop` on, a finalist whose paired interval against the leader lies wholly below
// 1 - noise_margin is dropped: it is slower beyond noise, by the same rule that grants a speedup (an
// interval wholly above 1 + noise_margin). The race ends when one finalist is left, when every
// finalist still in is shown within noise of the leader, after `max_rounds`, or when the budget has
// no room for another round of even the leader, the incumbent and the workload's own configuration (where it holds
// a round of some, those farthest behind the leader are set aside and the others race on).
//
// Estimates are Hodges-Lehmann (runtime/stats.h: the median of the pairwise averages), as in the
// interleaved compare of scripts/trainbench/tracking/interleave.py: on a shared machine one slice now
// and then runs while something else takes the cores (a tenth of the throughput, seen on a 2-core CI
// machine), which moves a mean by its share of the rounds and the median of pairwise averages hardly
// at all. The interval is the paired t test's: such a round widens it, so it makes the race more
// cautious, never bolder.
//
// The choice: of the eligible finalists still in that tie with the leader, the simplest: the fewest
// switches with a cost of their own (compile=on), then the fewest changes from the workload's own
// configuration, then the least peak memory, then the leader; else the fastest eligible. A switch with
// a cost is never chosen on a difference the rounds cannot tell from noise; with too few rounds for a verdict,
// the first entrant (the incumbent) while it is in. A tie, as in the search: a ratio to the leader within the
// noise margin, or not shown below 1 (the interval reaches it) and within kMaxTieGap x the margin,
// so that a finalist the race cannot tell from the leader is not passed over on a point estimate.
#include "tuner/race.h"

#include "runtime/schedule.h"
#include "runtime/stats.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace tb::tune {

namespace {

// A slice's expected wall time, from the last one of the same finalist: its own seconds plus this
// share and a process start.
constexpr double kSliceSafety = 1.1;
constexpr double kProcessStartSeconds = 0.05;
constexpr double kMaxTieGap = 2;  // as in search.cpp: a tie not shown slower may be this x noise_margin behind

std::string ratio_text(const PairedRounds& p) {
  std::ostringstream out;
  out.precision(3);
  out << p.ratio << "x of the leader";
  if (p.rounds >= 2) out << " (" << std::lround(100 * p.level) << "% CI " << p.ci_low << "-" << p.ci_high << ")";
  out << " over " << p.rounds << " round" << (p.rounds == 1 ? "" : "s");
  return out.str();
}

// Why `choice` is chosen over the leader it cannot be told from: what makes it the simpler.
std::string simpler_text(const Finalist& c, const Finalist& l) {
  std::ostringstream why;
  why << "the race cannot tell it from the fastest, " << l.candidate.key() << " (" << ratio_text(c.vs_leader)
      << "), and it is the simpler: ";
  if (c.costly != l.costly)
    why << c.costly << " switch" << (c.costly == 1 ? "" : "es") << " with a cost (compilation) against " << l.costly;
  else if (c.changed != l.changed)
    why << c.changed << " change" << (c.changed == 1 ? "" : "s") << " from the workload's own configuration against "
        << l.changed;
  else if (c.peak_bytes() != l.peak_bytes()) why << "less peak memory";
  else why << "a tie";
  return why.str();
}

// One race: the report it fills and what it needs between rounds.
class Race {
 public:
  Race(Executor& executor, const std::vector<RaceEntrant>& entrants, const RaceOptions& o) : executor_(executor), o_(o) {
    rep_.max_rounds = o.max_rounds;
    for (const auto& e : entrants) {
      Finalist f;
      f.candidate = e.candidate;
      f.eligible = e.eligible;
      f.costly = e.costly;
      f.changed = e.changed;
      f.why = e.why;
      rep_.finalists.push_back(f);
      const double setup = e.searched.setup_seconds > 0 ? e.searched.setup_seconds : o.min_trial_seconds;
      slice_seconds_.push_back(e.searched.pipelined ? std::max(o.slice.max_seconds, o.pipelined_slice_seconds)
                                                    : o.slice.max_seconds);
      expected_.push_back(std::max(o.min_trial_seconds, setup + slice_seconds_.back()) * kSliceSafety +
                          kProcessStartSeconds);
    }
  }

  RaceReport run() {
    const auto started = std::chrono::steady_clock::now();
    for (;;) {
      std::vector<std::size_t> racing = still_in();
      rep_.ended = why_no_round(racing);
      if (rep_.budget_exhausted && set_aside_for_time(racing)) {
        rep_.budget_exhausted = false;
        racing = still_in();
        rep_.ended = why_no_round(racing);
      }
      if (!rep_.ended.empty()) break;
      const int round = rep_.rounds + 1;
      if (o_.on_round) o_.on_round(round, o_.max_rounds, racing.size());
      if (!run_round(round, racing)) {
        rep_.budget_exhausted = true;
        rep_.ended = "the budget ended during round " + std::to_string(round) + ", which does not count";
        break;
      }
      if (judge(round) && round >= std::max(2, o_.min_rounds_to_drop) && still_in().size() >= 2) {
        rep_.ended = "the finalists still in are within noise of each other";
        break;
      }
    }
    const std::vector<std::size_t> in = still_in();
    if (rep_.rounds > 0 && !in.empty()) {
      const std::size_t leader = leader_of(in);
      rep_.leader = static_cast<int>(leader);
      for (std::size_t i : in) rep_.finalists[i].vs_leader = rep_.compare(i, leader, o_.level);
      rep_.choice = choose(in, leader);
    }
    rep_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return rep_;
  }

 private:
  std::vector<std::size_t> still_in() const {
    std::vector<std::size_t> in;
    for (std::size_t i = 0; i < rep_.finalists.size(); ++i)
      if (!rep_.finalists[i].dropped_after) in.push_back(i);
    return in;
  }

  void drop(std::size_t i, int round, const std::string& why) {
    rep_.finalists[i].dropped_after = round;
    rep_.finalists[i].why_dropped = why;
    if (o_.on_drop) o_.on_drop(round, rep_.finalists[i].candidate, why);
  }

  // The fastest of `in` (which all ran the same rounds) by its score, the machine's level each round
  // taken out.
  std::size_t leader_of(const std::vector<std::size_t>& in) const {
    const std::size_t rounds = rep_.finalists[in.front()].slices.size();
    auto log_speed = [&](std::size_t i, std::size_t r) { return std::log(rep_.finalists[i].slices[r].samples_per_s); };
    std::vector<double> level(rounds, 0);
    for (std::size_t i : in)
      for (std::size_t r = 0; r < rounds; ++r) level[r] += log_speed(i, r) / static_cast<double>(in.size());
    std::size_t best = in.front();
    double best_score = -std::numeric_limits<double>::infinity();
    for (std::size_t i : in) {
      std::vector<double> relative;
      for (std::size_t r = 0; r < rounds; ++r) relative.push_back(log_speed(i, r) - level[r]);
      const double score = hodges_lehmann(relative);
      if (score > best_score) best = i, best_score = score;
    }
    return best;
  }

  // Why the race ends before another round, or "" to run it.
  std::string why_no_round(const std::vector<std::size_t>& racing) {
    if (racing.size() < 2) return racing.empty() ? "every finalist failed" : "one finalist left";
    if (rep_.rounds >= o_.max_rounds) return "after the most rounds (" + std::to_string(o_.max_rounds) + ")";
    if (!o_.seconds_left) return "";
    const double need = round_seconds(racing);
    if (need <= o_.seconds_left()) return "";
    rep_.budget_exhausted = true;
    std::ostringstream why;
    why.precision(2);
    why << std::fixed << "no time left in the budget for round " << rep_.rounds + 1 << ", about " << need << " s";
    return why.str();
  }

  double round_seconds(const std::vector<std::size_t>& racing) const {
    double need = 0;
    for (std::size_t i : racing) need += expected_[i];
    return need;
  }

  // Where the time left holds a round of some of the finalists only: the leader, the first entrant (the incumbent),
  // the workload's own configuration and the others closest to the leader that fit race on; the rest are set
  // aside, their standing against the leader kept. One more paired round of the finalists that can still win tells
  // more than the time left unused. True when a smaller round fits.
  bool set_aside_for_time(const std::vector<std::size_t>& racing) {
    if (!o_.seconds_left || rep_.rounds < 1 || racing.size() <= 2 || rep_.rounds >= o_.max_rounds) return false;
    const double left = o_.seconds_left();
    const std::size_t leader = leader_of(racing);
    std::vector<std::size_t> keep, others;
    for (std::size_t i : racing) {
      const bool kept = i == leader || i == 0 || rep_.finalists[i].changed == 0;
      (kept ? keep : others).push_back(i);
      if (i != leader) rep_.finalists[i].vs_leader = rep_.compare(i, leader, o_.level);
    }
    double need = round_seconds(keep);
    if (keep.size() < 2 || need > left) return false;
    std::stable_sort(others.begin(), others.end(), [&](std::size_t a, std::size_t b) {
      return rep_.finalists[a].vs_leader.ratio > rep_.finalists[b].vs_leader.ratio;
    });
    std::vector<std::size_t> set_aside;
    for (std::size_t i : others) {
      if (need + expected_[i] <= left) {
        keep.push_back(i);
        need += expected_[i];
      } else {
        set_aside.push_back(i);
      }
    }
    if (set_aside.empty()) return false;
    std::ostringstream why;
    why << "set aside for time: round " << rep_.rounds + 1 << " holds " << keep.size() << " of the " << racing.size()
        << " finalists, those closest to the leader; ";
    for (std::size_t i : set_aside) drop(i, rep_.rounds, why.str() + ratio_text(rep_.finalists[i].vs_leader));
    return true;
  }

  // One slice of every finalist racing, in the round's order. The round's slices count only once all of
  // them ran, so that the rounds stay paired: false (nothing kept) when the budget ended during it.
  bool run_round(int round, const std::vector<std::size_t>& racing) {
    std::vector<std::pair<std::size_t, TrialResult>> slices;
    for (std::size_t position : round_order(racing.size(), rep_.rounds)) {
      const std::size_t i = racing[position];
      const Candidate& c = rep_.finalists[i].candidate;
      MeasurePolicy policy = o_.slice;
      policy.max_seconds = slice_seconds_[i];
      if (o_.seconds_left) {
        const double left = o_.seconds_left();
        if (left <= 0 || left < o_.min_trial_seconds) return false;
        policy.max_seconds = std::min(policy.max_seconds, left);
        policy.wall_seconds = left;
      }
      TrialResult r;
      try {
        r = executor_.run(c, policy);
      } catch (const OutOfBudget&) {
        return false;
      } catch (const std::exception& e) {
        r = TrialResult{};
        r.cls = TrialClass::error;
        r.message = std::string("the executor threw: ") + e.what();
      }
      if (o_.on_slice) o_.on_slice(round, c, r);
      slices.emplace_back(i, r);
    }
    rep_.rounds = round;
    for (const auto& [i, r] : slices) {
      if (r.ok()) {
        rep_.finalists[i].slices.push_back(r);
        expected_[i] = std::max(o_.min_trial_seconds, r.seconds) * kSliceSafety + kProcessStartSeconds;
      } else {
        drop(i, round, std::string("its slice failed (") + to_string(r.cls) + "): " + r.message);
      }
    }
    return true;
  }

  // After a complete round: each finalist against the leader, the slower beyond noise dropped. True when
  // every finalist still in is shown within noise of the leader.
  bool judge(int round) {
    const std::vector<std::size_t> in = still_in();
    if (in.empty()) return false;
    const std::size_t leader = leader_of(in);
    bool settled = true;
    for (std::size_t i : in) {
      if (i == leader) continue;
      Finalist& f = rep_.finalists[i];
      f.vs_leader = rep_.compare(i, leader, o_.level);
      if (round >= o_.min_rounds_to_drop && f.vs_leader.slower_beyond(o_.noise_margin))
        drop(i, round, "slower than the leader beyond noise: " + ratio_text(f.vs_leader));
      else settled &= f.vs_leader.within(o_.noise_margin);
    }
    return settled;
  }

  // The choice among the finalists still in (`in`, with their ratios to `leader`): the incumbent with too
  // few rounds for a verdict, else the simplest eligible tie with the leader, else the fastest eligible.
  int choose(const std::vector<std::size_t>& in, std::size_t leader) {
    const Finalist& incumbent = rep_.finalists.front();
    if (rep_.rounds < PairedRounds::kMinRoundsForVerdict && !incumbent.dropped_after && incumbent.eligible) return 0;
    auto ties = [&](const PairedRounds& p) {
      return p.ratio >= 1 - o_.noise_margin || (p.ci_high >= 1 && p.ratio >= 1 - kMaxTieGap * o_.noise_margin);
    };
    // Simpler first: fewer costly switches, fewer changes, less memory; then the faster.
    auto simpler = [&](const Finalist& a, const Finalist& b) {
      if (a.costly != b.costly) return a.costly < b.costly;
      if (a.changed != b.changed) return a.changed < b.changed;
      if (a.peak_bytes() != b.peak_bytes()) return a.peak_bytes() < b.peak_bytes();
      return a.vs_leader.ratio > b.vs_leader.ratio;
    };
    // A finalist with fewer costly switches or closer to the workload's own than the leader ties with it
    // wherever its interval against the leader holds 1 (the rounds cannot separate them): the leader's extra
    // switches are not bought on noise.
    const Finalist& lead = rep_.finalists[leader];
    auto closer = [&](const Finalist& f) {
      return f.costly < lead.costly || (f.costly == lead.costly && f.changed < lead.changed);
    };
    int choice = -1;
    for (std::size_t i : in) {
      const Finalist& f = rep_.finalists[i];
      const bool tie = i == leader || ties(f.vs_leader) || (closer(f) && f.vs_leader.decides() && f.vs_leader.ci_high >= 1);
      if (!f.eligible || !tie) continue;
      if (choice < 0 || simpler(f, rep_.finalists[choice])) choice = static_cast<int>(i);
    }
    if (choice >= 0 && choice != static_cast<int>(leader)) rep_.choice_why = simpler_text(rep_.finalists[choice], lead);
    return choice >= 0 ? choice : fastest_eligible();
  }

  // No eligible tie: the fastest eligible finalist, still in, else by its ratio when dropped.
  int fastest_eligible() const {
    int choice = -1;
    for (std::size_t i = 0; i < rep_.finalists.size(); ++i) {
      const Finalist& f = rep_.finalists[i];
      if (!f.eligible || f.slices.empty()) continue;
      const bool in_race = !f.dropped_after;
      const Finalist* c = choice < 0 ? nullptr : &rep_.finalists[choice];
      if (!c || (in_race && c->dropped_after) || (in_race == !c->dropped_after && f.vs_leader.ratio > c->vs_leader.ratio))
        choice = static_cast<int>(i);
    }
    return choice;
  }

  Executor& executor_;
  const RaceOptions& o_;
  RaceReport rep_;
  std::vector<double> slice_seconds_;  // each finalist's measuring time a slice
  std::vector<double> expected_;       // each finalist's next slice, wall seconds
};

}  // namespace

PairedRounds paired_rounds(const std::vector<double>& a, const std::vector<double>& b, double level) {
  PairedRounds out;
  out.level = level;
  out.rounds = static_cast<int>(std::min(a.size(), b.size()));
  if (out.rounds == 0) return out;
  const RatioEstimate e = paired_t_ratio_estimate(a, b, level);
  out.ratio = e.ratio;
  if (out.rounds >= 2) {
    out.ci_low = e.ci_low;
    out.ci_high = e.ci_high;
  }
  return out;
}

std::vector<std::size_t> round_order(std::size_t n, int round) {
  if (round < 0) throw std::invalid_argument("round_order: a round is 0 or more");
  const std::vector<std::size_t> rounds = schedule(n, static_cast<std::size_t>(round) + 1);
  return std::vector<std::size_t>(rounds.end() - static_cast<std::ptrdiff_t>(n), rounds.end());
}

std::vector<double> Finalist::per_round() const {
  std::vector<double> out;
  for (const auto& s : slices) out.push_back(s.samples_per_s);
  return out;
}

int64_t Finalist::peak_bytes() const {
  int64_t peak = 0;
  for (const auto& s : slices) peak = std::max(peak, s.peak_bytes);
  return peak;
}

TrialResult Finalist::measured(double level) const {
  if (slices.empty()) {
    TrialResult none;
    none.cls = TrialClass::error;
    none.message = "not measured in the race";
    return none;
  }
  TrialResult out = slices.front();
  if (slices.size() >= 2) {
    const Summary s = summarize(per_round(), 0, level);
    out.samples_per_s = s.median;
    out.ci_low = s.ci_low;
    out.ci_high = s.ci_high;
    out.steps = 0;
    out.seconds = out.setup_seconds = 0;
    for (const auto& s : slices) {
      out.steps += s.steps;
      out.seconds += s.seconds;
      out.setup_seconds += s.setup_seconds;
    }
    out.message.clear();
  }
  out.peak_bytes = peak_bytes();
  return out;
}

PairedRounds RaceReport::compare(std::size_t a, std::size_t b, double level) const {
  return paired_rounds(finalists.at(a).per_round(), finalists.at(b).per_round(), level);
}

RaceReport race(Executor& executor, const std::vector<RaceEntrant>& entrants, const RaceOptions& options) {
  return Race(executor, entrants, options).run();
}

}  // namespace tb::tune

// The race of the finalists (race.h). Rounds, each one slice of every finalist still in, in the order
// round_order gives. After each complete round the leader is the finalist with the highest score: per
// round, its log throughput less the round's mean over the finalists still in (the machine's level
// that round), and over the rounds the Hodges-Lehmann estimate of those. From round
// `min_rounds_to_drop` on, a finalist whose paired interval against the leader lies wholly below
// 1 - noise_margin is dropped: it is slower beyond noise, by the same rule that grants a speedup (an
// interval wholly above 1 + noise_margin). The race ends when one finalist is left, when every
// finalist still in is shown within noise of the leader, after `max_rounds`, or when the budget has
// no room for another round.
//
// Estimates are Hodges-Lehmann (the median of the pairwise averages), as in the interleaved compare
// of scripts/trainbench_tracking/interleave.py: on a shared machine one slice now and then runs while
// something else takes the cores (a tenth of the throughput, seen on a 2-core CI machine), which
// moves a mean by its share of the rounds and the median of pairwise averages hardly at all. The
// interval is the paired t test's: such a round widens it, so it makes the race more cautious, never
// bolder.
//
// The choice: of the eligible finalists still in that tie with the leader, the simplest: the fewest
// switches with a cost of their own (compile=on), then the fewest changes from the workload's own
// configuration, then the least peak memory, then the leader; else the fastest eligible. A switch with
// a cost is never chosen on a difference the rounds cannot tell from noise; with too few rounds for a verdict,
// the first entrant (the incumbent) while it is in. A tie, as in the search: a ratio to the leader within the
// noise margin, or not shown below 1 (the interval reaches it) and within kMaxTieGap x the margin,
// so that a finalist the race cannot tell from the leader is not passed over on a point estimate.
#include "tuner/race.h"

#include "runtime/stats.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <sstream>
#include <stdexcept>

namespace tb::tune {

namespace {

// A slice's expected wall time, from the last one of the same finalist: its own seconds plus this
// share and a process start.
constexpr double kSliceSafety = 1.1;
constexpr double kProcessStartSeconds = 0.05;
constexpr double kMaxTieGap = 2;  // as in search.cpp: a tie not shown slower may be this x noise_margin behind

// The regularised incomplete beta function I_x(a, b), by its continued fraction (modified Lentz).
double incomplete_beta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  if (x > (a + 1) / (a + b + 2)) return 1 - incomplete_beta(b, a, 1 - x);  // where the fraction converges fast
  const double front = std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x)) / a;
  constexpr double tiny = 1e-300;
  double f = 1, c = 1, d = 0;
  for (int i = 0; i <= 400; ++i) {
    const auto m = static_cast<double>(i / 2);
    double numerator = 1;
    if (i > 0 && i % 2 == 0) numerator = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m));
    else if (i > 0) numerator = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1));
    d = 1 + numerator * d;
    d = 1 / (std::abs(d) < tiny ? tiny : d);
    c = 1 + numerator / c;
    if (std::abs(c) < tiny) c = tiny;
    f *= c * d;
    if (std::abs(1 - c * d) < 1e-15) break;
  }
  return front * (f - 1);
}

double student_t_cdf(double t, double dof) {
  const double tail = 0.5 * incomplete_beta(dof / 2, 0.5, dof / (dof + t * t));
  return t >= 0 ? 1 - tail : tail;
}

// The median of the pairwise averages (x_i + x_j) / 2, i <= j.
double hodges_lehmann(const std::vector<double>& x) {
  std::vector<double> walsh;
  for (std::size_t i = 0; i < x.size(); ++i)
    for (std::size_t j = i; j < x.size(); ++j) walsh.push_back((x[i] + x[j]) / 2);
  return median_of(walsh);
}

std::string ratio_text(const PairedRounds& p) {
  std::ostringstream out;
  out.precision(3);
  out << p.ratio << "x of the leader";
  if (p.rounds >= 2) out << " (" << std::lround(100 * p.level) << "% CI " << p.ci_low << "-" << p.ci_high << ")";
  out << " over " << p.rounds << " round" << (p.rounds == 1 ? "" : "s");
  return out.str();
}

}  // namespace

double student_t_quantile(double p, double dof) {
  if (!(p > 0 && p < 1) || !(dof > 0)) throw std::invalid_argument("student_t_quantile: p in (0, 1) and dof > 0");
  if (p < 0.5) return -student_t_quantile(1 - p, dof);
  if (p == 0.5) return 0;
  double low = 0, high = 1;
  while (student_t_cdf(high, dof) < p) high *= 2;
  for (int i = 0; i < 200 && high - low > 1e-12 * high; ++i) {
    const double mid = (low + high) / 2;
    (student_t_cdf(mid, dof) < p ? low : high) = mid;
  }
  return (low + high) / 2;
}

PairedRounds paired_rounds(const std::vector<double>& a, const std::vector<double>& b, double level) {
  PairedRounds out;
  out.level = level;
  out.rounds = static_cast<int>(std::min(a.size(), b.size()));
  if (out.rounds == 0) return out;
  std::vector<double> d;
  for (int r = 0; r < out.rounds; ++r) {
    if (!(a[r] > 0 && b[r] > 0)) throw std::invalid_argument("paired_rounds: throughputs must be positive");
    d.push_back(std::log(a[r] / b[r]));
  }
  out.ratio = std::exp(hodges_lehmann(d));
  if (out.rounds == 1) return out;
  const auto k = static_cast<double>(d.size());
  const double mean = std::accumulate(d.begin(), d.end(), 0.0) / k;
  double ss = 0;
  for (double x : d) ss += (x - mean) * (x - mean);
  const double half = student_t_quantile(0.5 + level / 2, k - 1) * std::sqrt(ss / (k - 1) / k);
  out.ci_low = std::exp(mean - half);
  out.ci_high = std::exp(mean + half);
  return out;
}

std::vector<std::size_t> round_order(std::size_t n, int round) {
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (n == 0) return order;
  std::rotate(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(round / 2) % n), order.end());
  if (round % 2) std::reverse(order.begin(), order.end());
  return order;
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

RaceReport race(Executor& executor, const std::vector<RaceEntrant>& entrants, const RaceOptions& o) {
  const auto started = std::chrono::steady_clock::now();
  RaceReport rep;
  rep.max_rounds = o.max_rounds;
  std::vector<double> expected;  // each finalist's next slice, wall seconds
  for (const auto& e : entrants) {
    Finalist f;
    f.candidate = e.candidate;
    f.eligible = e.eligible;
    f.costly = e.costly;
    f.changed = e.changed;
    f.why = e.why;
    rep.finalists.push_back(f);
    const double setup = e.searched.setup_seconds > 0 ? e.searched.setup_seconds : o.min_trial_seconds;
    expected.push_back(std::max(o.min_trial_seconds, setup + o.slice.max_seconds) * kSliceSafety + kProcessStartSeconds);
  }
  auto still_in = [&] {
    std::vector<std::size_t> in;
    for (std::size_t i = 0; i < rep.finalists.size(); ++i)
      if (!rep.finalists[i].dropped_after) in.push_back(i);
    return in;
  };
  auto drop = [&](std::size_t i, int round, const std::string& why) {
    rep.finalists[i].dropped_after = round;
    rep.finalists[i].why_dropped = why;
    if (o.on_drop) o.on_drop(round, rep.finalists[i].candidate, why);
  };
  // The fastest of `in` (which all ran the same rounds) by its score, the machine's level each round
  // taken out.
  auto leader_of = [&](const std::vector<std::size_t>& in) {
    const std::size_t rounds = rep.finalists[in.front()].slices.size();
    std::vector<double> level(rounds, 0);
    for (std::size_t i : in)
      for (std::size_t r = 0; r < rounds; ++r) level[r] += std::log(rep.finalists[i].slices[r].samples_per_s) / static_cast<double>(in.size());
    std::size_t best = in.front();
    double best_score = -std::numeric_limits<double>::infinity();
    for (std::size_t i : in) {
      std::vector<double> relative;
      for (std::size_t r = 0; r < rounds; ++r) relative.push_back(std::log(rep.finalists[i].slices[r].samples_per_s) - level[r]);
      const double score = hodges_lehmann(relative);
      if (score > best_score) best = i, best_score = score;
    }
    return best;
  };

  for (;;) {
    const std::vector<std::size_t> racing = still_in();
    if (racing.size() < 2) {
      rep.ended = racing.empty() ? "every finalist failed" : "one finalist left";
      break;
    }
    if (rep.rounds >= o.max_rounds) {
      rep.ended = "after the most rounds (" + std::to_string(o.max_rounds) + ")";
      break;
    }
    const int round = rep.rounds + 1;
    if (o.seconds_left) {
      double need = 0;
      for (std::size_t i : racing) need += expected[i];
      if (need > o.seconds_left()) {
        rep.budget_exhausted = true;
        std::ostringstream why;
        why.precision(2);
        why << std::fixed << "no time left in the budget for round " << round << ", about " << need << " s";
        rep.ended = why.str();
        break;
      }
    }
    if (o.on_round) o.on_round(round, o.max_rounds, racing.size());
    // The round's slices count only once all of them ran: the rounds stay paired.
    std::vector<std::pair<std::size_t, TrialResult>> slices;
    bool out_of_budget = false;
    for (std::size_t position : round_order(racing.size(), rep.rounds)) {
      const std::size_t i = racing[position];
      const Candidate& c = rep.finalists[i].candidate;
      MeasurePolicy policy = o.slice;
      if (o.seconds_left) {
        const double left = o.seconds_left();
        if (left <= 0 || left < o.min_trial_seconds) {
          out_of_budget = true;
          break;
        }
        policy.max_seconds = std::min(policy.max_seconds, left);
        policy.wall_seconds = left;
      }
      TrialResult r;
      try {
        r = executor.run(c, policy);
      } catch (const OutOfBudget&) {
        out_of_budget = true;
        break;
      } catch (const std::exception& e) {
        r = TrialResult{};
        r.cls = TrialClass::error;
        r.message = std::string("the executor threw: ") + e.what();
      }
      if (o.on_slice) o.on_slice(round, c, r);
      slices.emplace_back(i, r);
    }
    if (out_of_budget) {
      rep.budget_exhausted = true;
      rep.ended = "the budget ended during round " + std::to_string(round) + ", which does not count";
      break;
    }
    rep.rounds = round;
    for (const auto& [i, r] : slices) {
      if (r.ok()) {
        rep.finalists[i].slices.push_back(r);
        expected[i] = std::max(o.min_trial_seconds, r.seconds) * kSliceSafety + kProcessStartSeconds;
      } else {
        drop(i, round, std::string("its slice failed (") + to_string(r.cls) + "): " + r.message);
      }
    }
    std::vector<std::size_t> in = still_in();
    if (in.empty()) continue;
    const std::size_t leader = leader_of(in);
    bool settled = true;  // every finalist still in shown within noise of the leader
    for (std::size_t i : in) {
      if (i == leader) continue;
      Finalist& f = rep.finalists[i];
      f.vs_leader = rep.compare(i, leader, o.level);
      if (round >= o.min_rounds_to_drop && f.vs_leader.slower_beyond(o.noise_margin))
        drop(i, round, "slower than the leader beyond noise: " + ratio_text(f.vs_leader));
      else
        settled &= f.vs_leader.within(o.noise_margin);
    }
    if (settled && round >= std::max(2, o.min_rounds_to_drop) && still_in().size() >= 2) {
      rep.ended = "the finalists still in are within noise of each other";
      break;
    }
  }

  const std::vector<std::size_t> in = still_in();
  if (rep.rounds > 0 && !in.empty()) {
    const std::size_t leader = leader_of(in);
    rep.leader = static_cast<int>(leader);
    for (std::size_t i : in) rep.finalists[i].vs_leader = rep.compare(i, leader, o.level);
    // Too few rounds for a verdict: the incumbent (the first entrant, the search's choice) stands
    // while it is in. Else ties go to less memory, and the leader wins equal memory.
    int choice = -1;
    const Finalist& incumbent = rep.finalists.front();
    if (rep.rounds < PairedRounds::kMinRoundsForVerdict && !incumbent.dropped_after && incumbent.eligible) {
      choice = 0;
    } else {
      auto ties = [&](const PairedRounds& p) {
        return p.ratio >= 1 - o.noise_margin || (p.ci_high >= 1 && p.ratio >= 1 - kMaxTieGap * o.noise_margin);
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
      const Finalist& lead = rep.finalists[leader];
      auto closer = [&](const Finalist& f) {
        return f.costly < lead.costly || (f.costly == lead.costly && f.changed < lead.changed);
      };
      for (std::size_t i : in) {
        const Finalist& f = rep.finalists[i];
        const bool tie = i == leader || ties(f.vs_leader) || (closer(f) && f.vs_leader.decides() && f.vs_leader.ci_high >= 1);
        if (!f.eligible || !tie) continue;
        if (choice < 0 || simpler(f, rep.finalists[choice])) choice = static_cast<int>(i);
      }
      if (choice >= 0 && choice != static_cast<int>(leader)) {
        const Finalist& c = rep.finalists[choice];
        const Finalist& l = rep.finalists[leader];
        std::ostringstream why;
        why << "the race cannot tell it from the fastest, " << l.candidate.key() << " (" << ratio_text(c.vs_leader)
            << "), and it is the simpler: ";
        if (c.costly != l.costly) why << c.costly << " switch" << (c.costly == 1 ? "" : "es") << " with a cost (compilation) against " << l.costly;
        else if (c.changed != l.changed) why << c.changed << " change" << (c.changed == 1 ? "" : "s") << " from the workload's own configuration against " << l.changed;
        else if (c.peak_bytes() != l.peak_bytes()) why << "less peak memory";
        else why << "a tie";
        rep.choice_why = why.str();
      }
    }
    // No eligible tie: the fastest eligible finalist, still in, else by its ratio when dropped.
    if (choice < 0)
      for (std::size_t i = 0; i < rep.finalists.size(); ++i) {
        const Finalist& f = rep.finalists[i];
        if (!f.eligible || f.slices.empty()) continue;
        const bool in_race = !f.dropped_after;
        const Finalist* c = choice < 0 ? nullptr : &rep.finalists[choice];
        if (!c || (in_race && c->dropped_after) || (in_race == !c->dropped_after && f.vs_leader.ratio > c->vs_leader.ratio))
          choice = static_cast<int>(i);
      }
    rep.choice = choice;
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return rep;
}

}  // namespace tb::tune

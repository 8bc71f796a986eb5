// The tuner's search (issue autotune): the largest micro-batch that fits, then micro-batch x
// accumulation x switches, measured in whole steps by an Executor.
//
// Memory. Per setting of the memory switches, `fit_largest` runs the smallest allowed micro-batch,
// then the largest one that is safe on that one point alone (peak/micro bounds bytes per sample),
// fits peak = fixed + per_sample * micro by least squares, and runs the largest allowed micro-batch
// predicted to fit under capacity * (1 - headroom) to confirm it. The confirmation's error
// (|measured - predicted| / predicted) widens the headroom; an out-of-memory lowers the bound and the
// next prediction below it is confirmed instead. Three probes on a linear model (two when the
// largest allowed fits), at most kMaxProbeAttempts. Probes are ordinary trials at real candidates, so
// the search reuses their throughput; other global batches reuse the model (one confirmation each at
// most). Other switches may change memory too (graphs keep a pool): a switch setting's feasible
// micro-batches come from the model shifted by what the nearest setting that ran measured, and an
// out-of-memory, or an ok trial without the headroom, caps that setting below it.
//
// Grid (the reference): for every global batch and every combination of switch values, every
// feasible micro-batch from the smallest up, the feasible list recomputed after each trial.
//
// Auto (the default), for each setting of the memory switches (the workload's own first; the others
// start from the best plain switches so far, since checkpointing moves the wall and with it the
// micro-batch at which bf16 or graphs pay):
//  1. A line search over the feasible micro-batches (each global batch, for the first setting).
//     Throughput is taken as unimodal in micro-batch: the best measured point (the probes count) is
//     bracketed by its measured neighbours and a golden-section point is measured in the wider side
//     until both neighbours of the best are measured.
//  2. Coordinate descent: each other value of each switch at the current micro-batch; hill-climbed
//     in micro-batch when it comes within kPromising, needs more memory than there is at the current
//     micro-batch, or frees some at the wall. Other global batches: a line search the first time,
//     later the micro-batch that was best there, hill-climbed when close.
//  3. A hill-climb in micro-batch around the current best under the new switches. Rounds (at most
//     kMaxRounds) repeat while one improves by more than kSignificant x noise_margin; any
//     improvement is kept.
// What is measured is evidence: a switch value kSwitchNotWorthRetrying worse at the same micro-batch
// in every context it ran in is not tried again, nor a micro-batch step kNotWorthRetrying worse
// (with kDistantEvidence benefit of the doubt from settings two or more switches away).
//  4. Close calls (at most kMaxRemeasures trials): a tie that would win on memory over the fastest
//     and the fastest are measured a second time, then ties whose interval stayed loose; repeated
//     trials of one candidate are pooled. When that moves the choice beyond noise (the old choice no
//     tie of the new one), the switch values are tried at the new choice, and one that wins beyond
//     noise descends from there (at most kMaxResettles times), so the choice's switches were tried
//     where it runs.
// Nothing else is run twice. Resumed results (`known`) are used the first time a candidate is asked
// for, count as measured but not as trials_run, are listed in `trials` and are not passed to
// on_trial again (they were journaled when they ran). Trials more than kClearlyBehind below the best
// so far may stop early (MeasurePolicy::stop_below); the grid measures every trial fully.
//
// Choice: among ok candidates whose peak is within capacity * (1 - headroom), the fastest; those
// within noise_margin of it, or whose intervals overlap its interval and are within kMaxTieGap x
// noise_margin of it (a loose interval alone does not make a config 5% slower a tie), are ties; the
// one with the smallest peak wins; runners_up are the other ties, fastest first.
//
// Failures: oom, error, timeout and incorrect trials are recorded and count as infeasible (throughput
// 0); an executor that throws is recorded as an error. Budget: the sum of trials' seconds (resumed
// ones excluded), or the wall clock when SearchOptions::seconds_left is set (autotune: the budget
// bounds the whole run); a trial is given at most what is left (MeasurePolicy::max_seconds and
// wall_seconds); once it is spent, or a trial is stopped by it (OutOfBudget), the search stops and
// chooses from what it has, with budget_exhausted set.
//
// Measured against the grid over 2000 seeded synthetic landscapes (tests/test_tuner_search.cpp):
// within 2% of the grid optimum on 98.7% of them (every noiseless one), 7% of the grid's trials on
// average, at most 24% where the grid runs 100 trials or more.
#include "tuner/search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "runtime/stats.h"

namespace tb::tune {

namespace {

constexpr int kMaxProbeAttempts = 6;                  // memory probes per largest_micro_batch call
constexpr int kMaxRounds = 4;                         // coordinate-descent rounds
constexpr int kMaxRemeasures = 3;                     // close calls measured again
constexpr int kMaxResettles = 2;                      // second looks at a choice the re-measures moved
constexpr double kGoldenSection = 0.381966011250105;  // (3 - sqrt 5) / 2
constexpr double kPromising = 0.02;                   // a switch this close to the best is hill-climbed in micro-batch
constexpr double kNotWorthRetrying = 0.05;  // a micro-batch step this much worse wherever it was measured is not retried
constexpr double kSwitchNotWorthRetrying = 0.02;  // the same for a switch value at the same micro-batch
constexpr double kDistantEvidence = 0.10;         // benefit of the doubt for evidence from other switch settings
constexpr double kSignificant = 0.5;              // improvements above this x noise_margin call for another round
constexpr double kClearlyBehind = 0.05;           // trials this far below the best so far may stop early
constexpr double kMaxTieGap = 2;                  // overlapping intervals are ties up to this x noise_margin apart
constexpr double kLooseInterval = 1.5;            // half-width above this x the target: a noisy trial
constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

struct BudgetExhausted {};

std::string switches_text(const std::map<std::string, std::string>& switches) {
  std::string out;
  for (const auto& [name, value] : switches) {
    if (!out.empty()) out += ' ';
    out += name + '=' + value;
  }
  return out;
}

double rel_half_width(const TrialResult& r) {
  return r.samples_per_s > 0 ? (r.ci_high - r.ci_low) / (2 * r.samples_per_s) : 0;
}

// Two measurements of one candidate as one: their median estimates pooled (runtime/stats.h), the
// narrower pooled interval, the larger peak.
TrialResult pool(const TrialResult& a, const TrialResult& b) {
  if (!a.ok()) return a;
  if (!b.ok()) return b;
  auto estimate = [](const TrialResult& r) { return Estimate{r.samples_per_s, (r.ci_high - r.ci_low) / 2}; };
  const Estimate pooled = pooled_estimate(estimate(a), estimate(b));
  TrialResult out = a;
  out.samples_per_s = pooled.value;
  out.ci_low = pooled.value - pooled.half_width;
  out.ci_high = pooled.value + pooled.half_width;
  out.peak_bytes = std::max(a.peak_bytes, b.peak_bytes);
  out.steps = a.steps + b.steps;
  out.seconds = a.seconds + b.seconds;
  return out;
}

struct Pooled {
  Candidate candidate;
  TrialResult result;
  int measurements = 0;
};

// Runs trials (or takes them from `known`), pools repeated ones, keeps the budget, the headroom and
// the out-of-memory bounds. Throws BudgetExhausted instead of starting a trial it has no time for.
class Session {
 public:
  Session(Executor& executor, const SearchOptions& options, std::vector<Ranked>& trials, double headroom)
      : headroom(std::max(headroom, options.headroom)),
        capacity_(executor.memory_capacity()),
        executor_(executor),
        options_(options),
        trials_(trials) {}

  double headroom;
  int64_t trials_run = 0;
  double seconds = 0;
  std::map<std::string, Pooled> pooled;  // by Candidate::key()

  const SearchOptions& options() const { return options_; }
  double limit() const { return static_cast<double>(capacity_) * (1 - headroom); }

  const Pooled* find(const Candidate& c) const {
    const auto it = pooled.find(c.key());
    return it == pooled.end() ? nullptr : &it->second;
  }

  // Measured once (or taken from what is known already).
  const Pooled& get(const Candidate& c, bool may_stop_early) {
    if (const Pooled* p = find(c)) return *p;
    return measure(c, may_stop_early);
  }

  // One more measurement of `c`, pooled with what there is.
  const Pooled& measure(const Candidate& c, bool may_stop_early) {
    const std::string key = c.key();
    TrialResult r;
    bool ran = false;
    const auto known = options_.known.find(key);
    std::size_t& used = known_used_[key];
    if (known != options_.known.end() && used < known->second.size()) {
      r = known->second[used++];
    } else {
      MeasurePolicy policy = options_.measure;
      if (options_.seconds_left) {
        const double left = options_.seconds_left();
        if (left <= 0 || left < options_.min_trial_seconds) throw BudgetExhausted{};
        policy.max_seconds = std::min(policy.max_seconds, left);
        policy.wall_seconds = left;
      } else {
        if (seconds >= options_.budget_seconds) throw BudgetExhausted{};
        policy.max_seconds = std::min(policy.max_seconds, options_.budget_seconds - seconds);
      }
      if (may_stop_early && best_ > 0) policy.stop_below = best_ * (1 - kClearlyBehind);
      try {
        r = executor_.run(c, policy);
      } catch (const OutOfBudget&) {
        throw BudgetExhausted{};
      } catch (const std::exception& e) {
        r = TrialResult{};
        r.cls = TrialClass::error;
        r.message = std::string("the executor threw: ") + e.what();
      } catch (...) {
        r = TrialResult{};
        r.cls = TrialClass::error;
        r.message = "the executor threw";
      }
      ran = true;
      ++trials_run;
      seconds += std::max(0.0, r.seconds);
    }
    trials_.push_back(Ranked{c, r});
    if (ran && options_.on_trial) options_.on_trial(c, r);
    // Out of memory, or ran without the headroom: nothing this large with these switches.
    if (r.cls == TrialClass::oom || (r.ok() && static_cast<double>(r.peak_bytes) > limit())) {
      auto& floor = oom_floor_.try_emplace(switches_text(c.switches), kNoLimit).first->second;
      floor = std::min(floor, c.micro_batch);
    }
    if (r.ok()) {
      auto& entry = peaks_[switches_text(c.switches)];
      entry.first = c.switches;
      entry.second.emplace_back(c.micro_batch, r.peak_bytes);
    }
    auto [it, fresh] = pooled.try_emplace(key, Pooled{c, r, 1});
    if (!fresh) {
      it->second.result = pool(it->second.result, r);
      ++it->second.measurements;
    }
    if (it->second.result.ok() && static_cast<double>(it->second.result.peak_bytes) <= limit())
      best_ = std::max(best_, it->second.result.samples_per_s);
    return it->second;
  }

  // Throughput for comparisons: 0 for a failed trial or one without the headroom.
  double value(const Pooled& p) const {
    if (!p.result.ok() || static_cast<double>(p.result.peak_bytes) > limit()) return 0;
    return p.result.samples_per_s;
  }

  // Switch settings that ran ok, each with the (micro-batch, peak) of its ok trials.
  using Peaks =
      std::map<std::string, std::pair<std::map<std::string, std::string>, std::vector<std::pair<int64_t, int64_t>>>>;
  const Peaks& peaks() const { return peaks_; }

  // The smallest micro-batch that ran out of memory with these switches.
  int64_t oom_floor(const std::map<std::string, std::string>& switches) const {
    const auto it = oom_floor_.find(switches_text(switches));
    return it == oom_floor_.end() ? kNoLimit : it->second;
  }

 private:
  int64_t capacity_;
  Executor& executor_;
  const SearchOptions& options_;
  std::vector<Ranked>& trials_;
  std::map<std::string, std::size_t> known_used_;  // measurements taken from `known`, by key
  std::map<std::string, int64_t> oom_floor_;
  Peaks peaks_;
  double best_ = 0;
};

// Peak memory against micro-batch for one setting of the memory switches.
struct MemoryModel {
  std::map<int64_t, int64_t> peaks;  // measured: micro-batch -> peak bytes
  int64_t oom_at = kNoLimit;         // the smallest micro-batch that ran out of memory
  std::set<int64_t> failed;          // probes that failed otherwise
  double fixed = 0, per_sample = 0;

  bool fitted() const { return peaks.size() >= 2; }

  void fit() {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    const double n = static_cast<double>(peaks.size());
    for (const auto& [m, p] : peaks) {
      const double x = static_cast<double>(m), y = static_cast<double>(p);
      sx += x, sy += y, sxx += x * x, sxy += x * y;
    }
    const double var = sxx - sx * sx / n;
    per_sample = var > 0 ? (sxy - sx * sy / n) / var : 0;
    if (per_sample < 0) per_sample = 0;
    fixed = per_sample > 0 ? (sy - per_sample * sx) / n : static_cast<double>(peaks.rbegin()->second);
  }

  double predict(int64_t micro) const {
    const auto it = peaks.find(micro);
    if (it != peaks.end()) return static_cast<double>(it->second);
    return fixed + per_sample * static_cast<double>(micro);
  }

  // The largest allowed micro-batch known to fit: at most the largest measured one within `limit`.
  int64_t answer(const std::vector<int64_t>& allowed, double limit) const {
    int64_t confirmed = 0;
    for (const auto& [m, p] : peaks)
      if (m < oom_at && static_cast<double>(p) <= limit) confirmed = std::max(confirmed, m);
    int64_t best = 0;
    for (int64_t a : allowed)
      if (a <= confirmed && !failed.count(a)) best = std::max(best, a);
    return best;
  }
};

std::vector<int64_t> sorted_unique_positive(std::vector<int64_t> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](int64_t x) { return x <= 0; }), v.end());
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// Probes until the largest allowed micro-batch that fits is measured (see the header comment).
int64_t fit_largest(Session& s, MemoryModel& mm, const Candidate& base, const std::vector<int64_t>& allowed,
                    bool may_stop_early) {
  const double base_headroom = s.options().headroom;
  for (int attempt = 0; attempt < kMaxProbeAttempts; ++attempt) {
    const double limit = s.limit();
    std::vector<int64_t> open;
    for (int64_t a : allowed)
      if (a < mm.oom_at && !mm.failed.count(a)) open.push_back(a);
    if (open.empty()) break;

    int64_t target = 0;
    double predicted = 0;
    if (mm.peaks.empty()) {
      target = open.front();
    } else if (!mm.fitted()) {
      // One point: bytes per sample are at most peak / micro, so micro * limit / peak is safe.
      const auto [m1, p1] = *mm.peaks.begin();
      if (static_cast<double>(p1) > limit) break;
      const double safe = p1 > 0 ? static_cast<double>(m1) * limit / static_cast<double>(p1)
                                 : std::numeric_limits<double>::infinity();
      for (int64_t a : open)
        if (a > m1 && static_cast<double>(a) <= safe) target = a;
      if (!target) {
        const auto above = std::upper_bound(open.begin(), open.end(), m1);
        if (above == open.end()) break;
        target = *above;
      }
    } else {
      mm.fit();
      for (int64_t a : open)
        if (mm.predict(a) <= limit) target = a;
      if (!target || mm.peaks.count(target)) break;  // confirmed (or nothing fits)
      predicted = mm.predict(target);
    }

    Candidate c = base;
    c.micro_batch = target;
    const TrialResult& r = s.get(c, may_stop_early).result;
    if (r.cls == TrialClass::oom) {
      mm.oom_at = std::min(mm.oom_at, target);
    } else if (r.ok()) {
      mm.peaks[target] = r.peak_bytes;
      if (predicted > 0)
        s.headroom = std::max(s.headroom,
                              base_headroom + std::abs(static_cast<double>(r.peak_bytes) - predicted) / predicted);
    } else {
      mm.failed.insert(target);
    }
  }
  if (mm.fitted()) mm.fit();
  return mm.answer(allowed, s.limit());
}

struct Point {
  int64_t global_batch = 0;
  std::map<std::string, std::string> switches;
  int64_t micro_batch = 0;
  double value = -1;  // -1: nothing measured
};

// The space as the strategies see it: allowed and feasible micro-batches, memory models per setting
// of the memory switches.
class Planner {
 public:
  Planner(Session& s, const SearchSpace& space, bool may_stop_early)
      : s_(s), space_(space), may_stop_early_(may_stop_early) {
    for (const auto& [name, values] : space.switches) {
      if (values.empty()) throw std::invalid_argument("search: switch '" + name + "' has no values");
      (is_memory(name) ? memory_ : plain_).emplace_back(name, values);
      own_[name] = values.front();
    }
    // The switches a descent tries first (SearchSpace::tried_first), in that order; the others by name
    auto rank = [&](const std::string& name) {
      const auto it = std::find(space.tried_first.begin(), space.tried_first.end(), name);
      return it == space.tried_first.end() ? space.tried_first.size() : std::size_t(it - space.tried_first.begin());
    };
    std::stable_sort(plain_.begin(), plain_.end(), [&](const auto& a, const auto& b) { return rank(a.first) < rank(b.first); });
  }

  const std::map<std::string, std::string>& own() const { return own_; }
  const std::vector<std::pair<std::string, std::vector<std::string>>>& plain_switches() const { return plain_; }
  const std::vector<std::pair<std::string, std::vector<std::string>>>& memory_switches() const { return memory_; }

  std::vector<int64_t> allowed(int64_t g) const {
    if (space_.micro_batches.empty()) return divisors(g, g);
    std::vector<int64_t> out;
    for (int64_t m : space_.micro_batches)
      if (m > 0 && g % m == 0) out.push_back(m);
    return sorted_unique_positive(out);
  }

  // The largest micro-batch that fits for (g, the memory switches of `switches`); probes the first
  // time, with `switches` as the probes' base.
  int64_t max_micro(int64_t g, const std::map<std::string, std::string>& switches) {
    const std::string setting = memory_setting(switches);
    const auto key = std::make_pair(g, setting);
    const auto it = max_.find(key);
    if (it != max_.end()) return it->second;
    Candidate base{g, 0, switches};
    const int64_t m = fit_largest(s_, models_[setting], base, allowed(g), may_stop_early_);
    max_[key] = m;
    return m;
  }

  int64_t max_micro_if_known(int64_t g, const std::map<std::string, std::string>& switches) const {
    const auto it = max_.find(std::make_pair(g, memory_setting(switches)));
    return it == max_.end() ? 0 : it->second;
  }

  // Allowed micro-batches predicted to fit, below any out-of-memory with these switches. Switches
  // other than the memory switches may still change memory (graphs keep a pool): the model is
  // shifted by the largest difference between its prediction and the peaks measured with the
  // nearest switch setting that ran (these switches, or the fewest switches apart), which may allow
  // more than the probes' largest or less.
  std::vector<int64_t> feasible(int64_t g, const std::map<std::string, std::string>& switches) {
    const int64_t mx = max_micro(g, switches);
    const std::string setting = memory_setting(switches);
    const MemoryModel& mm = models_[setting];
    const int64_t floor = s_.oom_floor(switches);
    bool shifted = false;
    double offset = 0;
    int nearest_distance = std::numeric_limits<int>::max();
    if (mm.fitted())
      for (const auto& [key, entry] : s_.peaks()) {
        const auto& [other, points] = entry;
        int distance = 0, memory_distance = 0;
        for (const auto& [name, value] : other) distance += switches.at(name) != value;
        for (const auto& [name, values] : memory_) memory_distance += switches.at(name) != other.at(name);
        if (memory_distance) continue;
        if (distance > nearest_distance) continue;
        if (distance < nearest_distance) shifted = false;
        nearest_distance = distance;
        for (const auto& [micro, peak] : points) {
          const double d = static_cast<double>(peak) - mm.predict(micro);
          offset = shifted ? std::max(offset, d) : d;
          shifted = true;
        }
      }
    std::vector<int64_t> out;
    for (int64_t a : allowed(g)) {
      if (a >= floor) continue;
      if (shifted ? mm.predict(a) + offset <= s_.limit() : a <= mx && (!mm.fitted() || mm.predict(a) <= s_.limit()))
        out.push_back(a);
    }
    return out;
  }

  // Switches that mean nothing at a candidate (a loader's prefetch without workers, no_sync without
  // accumulation) are measured at their first value: the same configuration is never run twice.
  double eval(int64_t g, const std::map<std::string, std::string>& switches, int64_t micro) {
    return s_.value(s_.get(canonical(space_, Candidate{g, micro, switches}), may_stop_early_));
  }

  // The measured value, if any, without running anything.
  const Pooled* measured(int64_t g, const std::map<std::string, std::string>& switches, int64_t micro) const {
    return s_.find(canonical(space_, Candidate{g, micro, switches}));
  }

  bool applies(const std::string& name, const std::map<std::string, std::string>& switches, int64_t g,
               int64_t micro) const {
    return switch_applies(space_, name, Candidate{g, micro, switches});
  }

  // Golden-section search for the best micro-batch of (g, switches), from what is measured; when
  // nothing is, it starts at the feasible micro-batch nearest `hint` (0: the largest).
  Point line_search(int64_t g, const std::map<std::string, std::string>& switches, int64_t hint) {
    const std::vector<int64_t> list = feasible(g, switches);
    Point best{g, switches, 0, -1};
    if (list.empty()) return best;
    const int n = static_cast<int>(list.size());
    std::vector<double> v(list.size(), -1);
    bool any = false;
    for (int i = 0; i < n; ++i)
      if (const Pooled* p = measured(g, switches, list[i])) v[i] = s_.value(*p), any = true;
    if (!any) {
      const int start = hint > 0 ? nearest(list, hint) : n - 1;
      v[start] = eval(g, switches, list[start]);
    }
    for (;;) {
      int k = -1;
      for (int i = 0; i < n; ++i)
        if (v[i] >= 0 && (k < 0 || v[i] > v[k])) k = i;
      int left = k - 1, right = k + 1;
      while (left >= 0 && v[left] < 0) --left;  // the bracket: measured neighbours (or the ends)
      while (right < n && v[right] < 0) ++right;
      const int gap_left = k - left - 1, gap_right = right - k - 1;
      if (gap_left == 0 && gap_right == 0) {
        best.micro_batch = list[k];
        best.value = v[k];
        return best;
      }
      int x;
      if (gap_right >= gap_left) {
        x = k + std::max(1, static_cast<int>(std::lround(kGoldenSection * (right - k))));
        x = std::min(x, right - 1);
      } else {
        x = k - std::max(1, static_cast<int>(std::lround(kGoldenSection * (k - left))));
        x = std::max(x, left + 1);
      }
      v[x] = eval(g, switches, list[x]);
    }
  }

  // What the measurements say about moving from micro-batch `from` to `to` at global batch g under
  // `switches`: the best ratio value(to) / value(from) over the settings where both ran, raised by
  // kDistantEvidence for settings that differ from `switches` in more than one switch (bf16 and
  // graphs change the shape in micro-batch); -1 without evidence.
  double micro_evidence(int64_t g, const std::map<std::string, std::string>& switches, int64_t from, int64_t to) const {
    double best = -1;
    for (const auto& [key, pooled] : s_.pooled) {
      const Candidate& c = pooled.candidate;
      if (c.global_batch != g || c.micro_batch != to || !pooled.result.ok()) continue;
      int differ = 0;
      for (const auto& [name, value] : c.switches) differ += switches.at(name) != value;
      const Pooled* partner = measured(g, c.switches, from);
      if (partner && s_.value(*partner) > 0)
        best = std::max(best, s_.value(pooled) / s_.value(*partner) + (differ > 1 ? kDistantEvidence : 0));
    }
    return best;
  }

  // The same for switching `name` from `from` to `to` at micro-batch `micro`, over the (global
  // batch, other switches) where both ran.
  double switch_evidence(int64_t micro, const std::string& name, const std::string& from, const std::string& to) const {
    double best = -1;
    for (const auto& [key, pooled] : s_.pooled) {
      const Candidate& c = pooled.candidate;
      if (c.micro_batch != micro || c.switches.at(name) != to || !pooled.result.ok()) continue;
      auto other = c.switches;
      other[name] = from;
      const Pooled* partner = measured(c.global_batch, other, c.micro_batch);
      if (partner && s_.value(*partner) > 0) best = std::max(best, s_.value(pooled) / s_.value(*partner));
    }
    return best;
  }

  // The micro-batch of the best measured candidate at g with the memory switches of `switches`; 0: none.
  int64_t best_micro_seen(int64_t g, const std::map<std::string, std::string>& switches) const {
    const std::string setting = memory_setting(switches);
    int64_t micro = 0;
    double best = 0;
    for (const auto& [key, pooled] : s_.pooled)
      if (pooled.candidate.global_batch == g && s_.value(pooled) > best &&
          memory_setting(pooled.candidate.switches) == setting)
        best = s_.value(pooled), micro = pooled.candidate.micro_batch;
    return micro;
  }

  // The fastest micro-batch measured with exactly `switches` at g where switch `name` means something (0: none):
  // where a switch that means nothing at the current micro-batch (no_sync without accumulation) is tried instead.
  int64_t best_micro_where_applies(int64_t g, const std::map<std::string, std::string>& switches,
                                   const std::string& name) const {
    int64_t micro = 0;
    double best = 0;
    for (const auto& [key, pooled] : s_.pooled) {
      const Candidate& c = pooled.candidate;
      if (c.global_batch != g || c.switches != canonical(space_, Candidate{g, c.micro_batch, switches}).switches ||
          !switch_applies(space_, name, c) || s_.value(pooled) <= best)
        continue;
      best = s_.value(pooled), micro = c.micro_batch;
    }
    return micro;
  }

  static bool clearly_worse(double evidence, double by = kNotWorthRetrying) { return evidence >= 0 && evidence < 1 - by; }

  // Moves to a better neighbouring micro-batch while there is one; a neighbour that was clearly worse
  // wherever it was compared is not tried.
  Point hill_climb(int64_t g, const std::map<std::string, std::string>& switches, int64_t micro) {
    const std::vector<int64_t> list = feasible(g, switches);
    Point best{g, switches, 0, -1};
    if (list.empty()) return best;
    int k = nearest(list, micro);
    double vk = eval(g, switches, list[k]);
    for (;;) {
      int next = k;
      double vn = vk;
      for (int i : {k - 1, k + 1}) {
        if (i < 0 || i >= static_cast<int>(list.size())) continue;
        if (!measured(g, switches, list[i]) && clearly_worse(micro_evidence(g, switches, list[k], list[i]))) continue;
        const double vi = eval(g, switches, list[i]);
        if (vi > vn) next = i, vn = vi;
      }
      if (next == k) break;
      k = next, vk = vn;
    }
    best.micro_batch = list[k];
    best.value = vk;
    return best;
  }

 private:
  bool is_memory(const std::string& name) const {
    return std::find(space_.memory_switches.begin(), space_.memory_switches.end(), name) != space_.memory_switches.end();
  }

  std::string memory_setting(const std::map<std::string, std::string>& switches) const {
    std::string out;
    for (const auto& [name, values] : memory_) {
      const auto it = switches.find(name);
      out += name + '=' + (it == switches.end() ? values.front() : it->second) + ' ';
    }
    return out;
  }

  static int nearest(const std::vector<int64_t>& list, int64_t micro) {
    int best = 0;
    for (int i = 0; i < static_cast<int>(list.size()); ++i)
      if (std::llabs(list[i] - micro) < std::llabs(list[best] - micro) ||
          (std::llabs(list[i] - micro) == std::llabs(list[best] - micro) && list[i] < list[best]))
        best = i;
    return best;
  }

  Session& s_;
  const SearchSpace& space_;
  bool may_stop_early_;
  std::vector<std::pair<std::string, std::vector<std::string>>> plain_, memory_;
  std::map<std::string, std::string> own_;
  std::map<std::string, MemoryModel> models_;
  std::map<std::pair<int64_t, std::string>, int64_t> max_;
};

// Every combination of switch values, the memory switches varying slowest.
std::vector<std::map<std::string, std::string>> combinations(const Planner& p) {
  std::vector<std::pair<std::string, std::vector<std::string>>> all = p.memory_switches();
  all.insert(all.end(), p.plain_switches().begin(), p.plain_switches().end());
  std::vector<std::map<std::string, std::string>> out{{}};
  for (const auto& [name, values] : all) {
    std::vector<std::map<std::string, std::string>> next;
    for (const auto& partial : out)
      for (const auto& v : values) {
        auto c = partial;
        c[name] = v;
        next.push_back(std::move(c));
      }
    out = std::move(next);
  }
  return out;
}

// Smallest micro-batch first; the feasible list is recomputed after each trial, since a trial's
// peak shifts the memory model for its switches (up to an out-of-memory, or beyond the probes'
// largest when these switches need less memory than the probes' did).
void run_grid(Planner& p, const SearchSpace& space) {
  for (int64_t g : space.global_batches)
    for (const auto& switches : combinations(p))
      for (;;) {
        const std::vector<int64_t> list = p.feasible(g, switches);
        const auto next = std::find_if(list.begin(), list.end(), [&](int64_t m) { return !p.measured(g, switches, m); });
        if (next == list.end()) break;
        p.eval(g, switches, *next);
      }
}

bool intervals_overlap(const TrialResult& a, const TrialResult& b) { return a.ci_low <= b.ci_high && b.ci_low <= a.ci_high; }

// The fastest (`top`), its ties fastest first, and among them the one with the smallest peak.
struct Choice {
  const Pooled* top = nullptr;
  const Pooled* best = nullptr;
  std::vector<const Pooled*> ties;
};

Choice choose(const Session& s) {
  Choice c;
  std::vector<const Pooled*> ok;
  for (const auto& [key, pooled] : s.pooled)
    if (s.value(pooled) > 0) ok.push_back(&pooled);
  if (ok.empty()) return c;
  std::sort(ok.begin(), ok.end(), [](const Pooled* a, const Pooled* b) {
    if (a->result.samples_per_s != b->result.samples_per_s) return a->result.samples_per_s > b->result.samples_per_s;
    return a->result.peak_bytes < b->result.peak_bytes;
  });
  c.top = ok.front();
  const TrialResult& top = c.top->result;
  const double margin = s.options().noise_margin;
  for (const Pooled* p : ok)
    if (p->result.samples_per_s >= top.samples_per_s * (1 - margin) ||
        (intervals_overlap(p->result, top) && p->result.samples_per_s >= top.samples_per_s * (1 - kMaxTieGap * margin)))
      c.ties.push_back(p);
  c.best = c.ties.front();
  for (const Pooled* p : c.ties)
    if (p->result.peak_bytes < c.best->result.peak_bytes) c.best = p;
  return c;
}

// Close calls, measured once more before choosing (at most kMaxRemeasures): a tie that would win
// on memory over the fastest, the fastest itself, then contenders whose interval stayed loose.
void remeasure_close_calls(Session& s) {
  const double margin = s.options().noise_margin;
  for (int k = 0; k < kMaxRemeasures; ++k) {
    const Choice c = choose(s);
    if (!c.top) return;
    const Pooled* next = nullptr;
    if (c.best != c.top && c.best->measurements < 2) next = c.best;
    else if (c.best != c.top && c.top->measurements < 2) next = c.top;
    else
      for (const Pooled* p : c.ties)  // fastest first
        if (p->measurements == 1 && s.value(*p) >= s.value(*c.top) * (1 - 2 * margin) &&
            rel_half_width(p->result) > kLooseInterval * s.options().measure.target_rel_ci) {
          next = p;
          break;
        }
    if (!next) return;
    const Candidate candidate = next->candidate;
    s.measure(candidate, false);
  }
}

// Where a descent stands, and how it moves: any improvement is kept; one beyond noise calls for
// another round.
struct Position {
  Point cur;
  double significant;  // 1 + kSignificant x noise_margin
  Position(Point from, const Session& s) : cur(std::move(from)), significant(1 + kSignificant * s.options().noise_margin) {}
  bool consider(const Point& r) {
    if (r.value <= cur.value) return false;
    const bool beyond_noise = r.value > cur.value * significant;
    cur = r;
    return beyond_noise;
  }
};

// Each other value of each plain switch at the current micro-batch, hill-climbed in micro-batch when
// it comes close, needs more memory than there is at the current micro-batch, or frees some at the
// wall. True when one improved beyond noise.
bool try_switch_values(Planner& p, Position& at) {
  bool improved = false;
  for (const auto& [name, values] : p.plain_switches())
    for (const auto& v : values) {
      const Point& cur = at.cur;
      if (cur.switches.at(name) == v) continue;
      if (Planner::clearly_worse(p.switch_evidence(cur.micro_batch, name, cur.switches.at(name), v),
                                 kSwitchNotWorthRetrying))
        continue;
      auto alt = cur.switches;
      alt[name] = v;
      if (!p.applies(name, alt, cur.global_batch, cur.micro_batch)) {
        // The same configuration here: tried once at the fastest micro-batch measured where it means something
        const int64_t there = p.best_micro_where_applies(cur.global_batch, cur.switches, name);
        if (there && !p.measured(cur.global_batch, alt, there))
          improved |= at.consider(Point{cur.global_batch, alt, there, p.eval(cur.global_batch, alt, there)});
        continue;
      }
      auto fits = [&] {
        const auto list = p.feasible(cur.global_batch, alt);
        return std::binary_search(list.begin(), list.end(), cur.micro_batch);
      };
      Point r;
      if (!fits()) {  // this value needs more memory: from the nearest micro-batch that fits
        r = p.hill_climb(cur.global_batch, alt, cur.micro_batch);
      } else {
        r = Point{cur.global_batch, alt, cur.micro_batch, p.eval(cur.global_batch, alt, cur.micro_batch)};
        // Hill-climbed when close, when its trial showed it needs more memory (fits() asked again), or when
        // it frees memory at the wall.
        const auto before = p.feasible(cur.global_batch, cur.switches), after = p.feasible(cur.global_batch, alt);
        const bool frees = !before.empty() && !after.empty() && after.back() > before.back();
        if (!fits() || frees || r.value > cur.value * (1 - kPromising))
          r = p.hill_climb(cur.global_batch, alt, cur.micro_batch);
      }
      improved |= at.consider(r);
    }
  return improved;
}

// Coordinate descent from `cur` with the memory switches fixed: each plain switch value at the
// current micro-batch, the other global batches, a hill-climb in micro-batch; rounds until none
// improves beyond noise.
Point descend(Planner& p, Session& s, const SearchSpace& space, Point from) {
  Position at(std::move(from), s);
  // One trial at `anchor` (the nearest feasible micro-batch), hill-climbed when it comes close.
  auto retry = [&](int64_t g, const std::map<std::string, std::string>& alt, int64_t anchor) {
    const auto list = p.feasible(g, alt);
    if (list.empty()) return Point{};
    Point r{g, alt, list.front(), -1};
    for (int64_t m : list)
      if (std::llabs(m - anchor) < std::llabs(r.micro_batch - anchor)) r.micro_batch = m;
    r.value = p.eval(g, alt, r.micro_batch);
    if (r.value > at.cur.value * (1 - kPromising)) r = p.hill_climb(g, alt, r.micro_batch);
    return r;
  };
  for (int round = 0; round < kMaxRounds; ++round) {
    bool improved = try_switch_values(p, at);
    for (int64_t g : space.global_batches)
      if (g != at.cur.global_batch) {
        const int64_t seen = p.best_micro_seen(g, at.cur.switches);
        improved |= at.consider(seen ? retry(g, at.cur.switches, seen)
                                     : p.line_search(g, at.cur.switches, at.cur.micro_batch));
      }
    improved |= at.consider(p.hill_climb(at.cur.global_batch, at.cur.switches, at.cur.micro_batch));
    if (!improved) break;
  }
  return at.cur;
}

void run_auto(Planner& p, Session& s, const SearchSpace& space) {
  // Each setting of the memory switches moves the memory wall and with it the best micro-batch and
  // the switches that pay there (bf16 at large micro-batches, graphs at small ones), so each gets its
  // own line search and descent; the workload's own setting first, the others starting from the best
  // plain switches so far.
  std::vector<std::map<std::string, std::string>> settings{{}};
  for (const auto& [name, values] : p.memory_switches()) {
    std::vector<std::map<std::string, std::string>> next;
    for (const auto& partial : settings)
      for (const auto& v : values) {
        auto c = partial;
        c[name] = v;
        next.push_back(std::move(c));
      }
    settings = std::move(next);
  }
  Point best{space.global_batches.front(), p.own(), 0, -1};
  for (std::size_t i = 0; i < settings.size(); ++i) {
    auto switches = i == 0 ? p.own() : best.switches;
    for (const auto& [name, value] : settings[i]) switches[name] = value;
    Point cur{best.global_batch, switches, 0, -1};
    if (i == 0) {
      for (int64_t g : space.global_batches) {
        const Point r = p.line_search(g, switches, 0);
        if (r.value > cur.value) cur = r;
      }
    } else {
      cur = p.line_search(best.global_batch, switches, best.micro_batch);
    }
    if (cur.micro_batch == 0) continue;  // nothing fits with this setting
    cur = descend(p, s, space, cur);
    if (cur.value > best.value) best = cur;
  }

  // A second measurement can move the choice to a point the descent passed by without searching from
  // it: a micro-batch whose first trial ran high led the descent, the switches were tried there, and
  // measured again it fell behind beyond noise a micro-batch that never had them (two tunes of one
  // workload chose per_tensor at one micro-batch and foreach at the other). Then the switch values
  // are tried at the new choice, and one that wins beyond noise descends from there. A choice that
  // only moved among ties (the old one within noise of it) is left as it is.
  const Choice searched = choose(s);
  std::string settled = searched.best ? searched.best->candidate.key() : "";
  remeasure_close_calls(s);
  for (int k = 0; k < kMaxResettles; ++k) {
    const Choice c = choose(s);
    if (!c.best || c.best->candidate.key() == settled) break;
    if (std::any_of(c.ties.begin(), c.ties.end(), [&](const Pooled* t) { return t->candidate.key() == settled; }))
      break;
    settled = c.best->candidate.key();
    const Candidate& at = c.best->candidate;
    Position moved(Point{at.global_batch, at.switches, at.micro_batch, s.value(*c.best)}, s);
    if (try_switch_values(p, moved)) descend(p, s, space, moved.cur);
    remeasure_close_calls(s);
  }
}

}  // namespace

bool switch_applies(const SearchSpace& space, const std::string& name, const Candidate& candidate) {
  const auto rule = space.applies_when.find(name);
  if (rule == space.applies_when.end()) return true;
  if (rule->second == "accumulation") return candidate.accumulation() > 1;
  if (rule->second == "workers") {
    const auto workers = candidate.switches.find("num_workers");
    return workers != candidate.switches.end() && workers->second != "0";
  }
  throw std::invalid_argument("search: switch '" + name + "' applies when '" + rule->second +
                              "', which is neither 'workers' nor 'accumulation'");
}

Candidate canonical(const SearchSpace& space, Candidate candidate) {
  for (auto& [name, value] : candidate.switches) {
    const auto values = space.switches.find(name);
    if (values != space.switches.end() && !values->second.empty() && !switch_applies(space, name, candidate))
      value = values->second.front();
  }
  return candidate;
}

std::string Candidate::key() const {
  std::ostringstream out;
  out << "g=" << global_batch << " mb=" << micro_batch;
  for (const auto& [name, value] : switches) out << ' ' << name << '=' << value;
  return out.str();
}

const char* to_string(TrialClass c) {
  switch (c) {
    case TrialClass::ok:
      return "ok";
    case TrialClass::oom:
      return "oom";
    case TrialClass::error:
      return "error";
    case TrialClass::timeout:
      return "timeout";
    case TrialClass::incorrect:
      return "incorrect";
  }
  return "error";
}

TrialClass trial_class_from_string(const std::string& s) {
  for (TrialClass c : {TrialClass::ok, TrialClass::oom, TrialClass::error, TrialClass::timeout, TrialClass::incorrect})
    if (s == to_string(c)) return c;
  throw std::invalid_argument("unknown trial class '" + s + "' (ok, oom, error, timeout, incorrect)");
}

std::vector<int64_t> divisors(int64_t global, int64_t max_micro) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d * d <= global; ++d) {
    if (global % d) continue;
    if (d <= max_micro) out.push_back(d);
    if (global / d != d && global / d <= max_micro) out.push_back(global / d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {
// lo, 2 lo, 4 lo ... up to hi, and hi itself.
std::vector<int64_t> doubling(int64_t lo, int64_t hi) {
  std::vector<int64_t> out;
  for (int64_t g = lo; g <= hi; g *= 2) out.push_back(g);
  if (out.empty() || out.back() != hi) out.push_back(hi);
  return out;
}
}  // namespace

GlobalBatchPlan plan_global_batches(int64_t own, BatchRange workload_range, int64_t pinned, BatchRange option) {
  GlobalBatchPlan plan;
  if (pinned > 0) {
    plan.batches = {pinned};
    plan.source = "--batch " + std::to_string(pinned);
    plan.pinned = true;
  } else if (option.given()) {
    plan.batches = doubling(option.lo, option.hi);
    plan.source = "--batch-range " + std::to_string(option.lo) + ":" + std::to_string(option.hi);
  } else if (workload_range.given()) {
    plan.batches = doubling(workload_range.lo, workload_range.hi);
    if (own >= workload_range.lo && own <= workload_range.hi) plan.batches.push_back(own);
    plan.source = "the workload's global_range [" + std::to_string(workload_range.lo) + ", " +
                  std::to_string(workload_range.hi) + "]";
  } else {
    plan.batches = {own};
    plan.source = "the workload's global batch (it declares no global_range)";
  }
  std::sort(plan.batches.begin(), plan.batches.end());
  plan.batches.erase(std::unique(plan.batches.begin(), plan.batches.end()), plan.batches.end());
  return plan;
}

std::vector<GlobalBatchResult> per_global_batch(const std::vector<Ranked>& trials, const std::vector<int64_t>& batches) {
  std::vector<GlobalBatchResult> out;
  for (int64_t g : batches) {
    GlobalBatchResult r;
    r.global_batch = g;
    for (const auto& t : trials)
      if (t.candidate.global_batch == g && t.result.ok()) {
        ++r.ok_trials;
        r.best_samples_per_s = std::max(r.best_samples_per_s, t.result.samples_per_s);
      }
    out.push_back(r);
  }
  return out;
}

int64_t largest_micro_batch(Executor& executor, const Candidate& base, const std::vector<int64_t>& allowed,
                            SearchOptions& options, std::vector<Ranked>& trials, double& headroom) {
  Session s(executor, options, trials, headroom);
  MemoryModel mm;
  const std::vector<int64_t> list = sorted_unique_positive(allowed);
  int64_t best = 0;
  try {
    best = fit_largest(s, mm, base, list, false);
  } catch (const BudgetExhausted&) {
    if (mm.fitted()) mm.fit();
    best = mm.answer(list, s.limit());
  }
  headroom = s.headroom;
  return best;
}

SearchReport search(Executor& executor, const SearchSpace& space, SearchOptions options) {
  SearchReport rep;
  if (space.global_batches.empty()) throw std::invalid_argument("search: no global batch to search");
  for (int64_t g : space.global_batches)
    if (g <= 0) throw std::invalid_argument("search: global batch " + std::to_string(g) + " is not positive");
  const bool grid = options.strategy == SearchOptions::Strategy::grid;
  Session s(executor, options, rep.trials, options.headroom);
  Planner planner(s, space, /*may_stop_early=*/!grid);
  try {
    if (grid) run_grid(planner, space);
    else run_auto(planner, s, space);
  } catch (const BudgetExhausted&) {
    rep.budget_exhausted = true;
  }
  const Choice c = choose(s);
  if (c.best) {
    rep.found = true;
    rep.best = Ranked{c.best->candidate, c.best->result};
    for (const Pooled* p : c.ties)
      if (p != c.best) rep.runners_up.push_back(Ranked{p->candidate, p->result});
  }
  for (int64_t g : space.global_batches)
    rep.max_micro_batch = std::max(rep.max_micro_batch, planner.max_micro_if_known(g, planner.own()));
  rep.trials_run = s.trials_run;
  rep.headroom = s.headroom;
  rep.seconds = s.seconds;
  return rep;
}

}  // namespace tb::tune

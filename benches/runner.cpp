#include "runner.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <memory>
#include <new>
#include <regex>
#include <set>
#include <sstream>

#include "disturbance.h"
#include "groups.h"
#include "progress.h"
#include "runtime/error.h"
#include "runtime/schedule.h"
#include "sampling.h"

namespace tb {

std::string signal_name(int signal) {
  return signal == SIGINT ? "SIGINT" : signal == SIGTERM ? "SIGTERM" : signal == SIGHUP ? "SIGHUP"
                                                                                     : "signal " + std::to_string(signal);
}

namespace {

std::string describe_bad_alloc(const Entry& e) {
  return "out of memory while setting up " + e.name + " (try a smaller --axis value)";
}

// A row before it runs: what it is, the work one call does, and, when it cannot run, why.
Row initial_row(const Entry& e, const Settings& settings) {
  Row r;
  r.name = e.name;
  r.stage = e.stage->name;
  r.variant = e.variant->id;
  r.backend = e.backend_name.empty() ? to_string(e.variant->backend) : e.backend_name;
  r.problem = e.problem.params();
  r.mode = settings.cold ? "cold" : "hot";
  const Work w = e.variant->work(e.problem);
  r.bytes = w.bytes;
  r.flops = w.flops;
  r.bound = w.bound == Work::Bound::compute ? "compute" : "memory";
  r.counters = w.counters;
  r.peak_key = w.peak_key == e.variant->provides_peak ? "" : w.peak_key;  // a peak is not % of itself
  r.footprint = w.footprint_bytes > 0 ? w.footprint_bytes : w.bytes;
  if (!e.unsupported.empty()) {
    r.disposition = Disposition::unsupported;
    r.reason = e.unsupported;
  }
  return r;
}

// Google Benchmark's --benchmark_filter, as it applies it to its benchmarks' names: an extended regular
// expression searched in the row's name, negated by a leading "-"; empty or "all": every row.
std::function<bool(const std::string&)> benchmark_filter() {
  std::string spec = benchmark::GetBenchmarkFilter();
  if (spec.empty() || spec == "all") return [](const std::string&) { return true; };
  const bool negative = spec.front() == '-';
  if (negative) spec.erase(0, 1);
  std::regex re;
  try {
    re = std::regex(spec, std::regex::extended);
  } catch (const std::regex_error& e) {
    throw UsageError("--benchmark_filter '" + spec + "' is not a valid regular expression: " + e.what());
  }
  return [re, negative](const std::string& name) { return std::regex_search(name, re) != negative; };
}

void mark_not_timed(Row& row, const std::string& when) {
  row.disposition = Disposition::unsupported;
  row.reason = "not timed: interrupted " + when;
}

class Runner {
 public:
  Runner(const std::vector<Entry>& entries, const Settings& settings, std::ostream& progress)
      : entries_(entries), settings_(settings), progress_(progress, entries.size(), settings.noise_target) {
    for (const Entry& e : entries) rows_.push_back(initial_row(e, settings));
  }

  std::vector<Row> run() {
    for (const Row& row : rows_)
      if (row.disposition == Disposition::unsupported) progress_.announce(row);
    const auto selected = benchmark_filter();
    std::size_t timed_rows = 0;
    for (Row& row : rows_) {
      if (row.disposition != Disposition::pending) continue;
      if (selected(row.name)) {
        ++timed_rows;
      } else {
        row.disposition = Disposition::unsupported;
        row.reason = "not run (excluded by --benchmark_filter)";
      }
    }
    progress_.expect_timed_rows(timed_rows);
    progress_.start();
    for (const auto& group : measuring_groups(entries_, rows_, settings_.interleave_pairs)) measure(group);
    return std::move(rows_);
  }

 private:
  // One row of the group in hand: how it is sampled, and what watches it while it is.
  struct Member {
    Member(const Entry& e, const Settings& s, std::ostream& out, bool each_round)
        : sampler(e, s), watch(e, s), progress(out, e.name, s.progress_every_s), observations(each_round) {}
    RowSampler sampler;
    DisturbanceWatch watch;
    RowProgress progress;
    RoundObservations observations;
    double setup_s = 0;  // instance, first call, reference check, warm-up (Settings::on_row_done)
  };
  // The group in hand: its rows (indices into rows_, in entry order) and each one's member, null where
  // the row is not measuring (not timed, or failed: its buffers freed).
  struct Group {
    std::vector<std::size_t> rows;
    std::vector<std::unique_ptr<Member>> members;
    std::size_t size() const { return rows.size(); }
    // The processes whose calls its rows make (PyTorch rows' scripts): the measurement, not a load.
    std::vector<int> processes() const {
      std::set<int> pids;
      for (const auto& m : members)
        if (m && m->sampler.process_id() > 0) pids.insert(m->sampler.process_id());
      return {pids.begin(), pids.end()};
    }
  };

  void measure(const std::vector<std::size_t>& rows);
  void prepare(Group& group);
  bool take_round(Group& group, const std::size_t* order);
  bool take_sample(Group& group, std::size_t k);
  void say_how_far(const Group& group);
  void interrupt(const Group& group);
  void cut_short(const Group& group);
  void finish(Group& group);
  void tell_costs(const Group& group, double measuring_s) const;

  bool measuring(const Group& group, std::size_t k) const {
    return group.members[k] && rows_[group.rows[k]].disposition == Disposition::passed;
  }
  std::size_t measuring_rows(const Group& group) const {
    std::size_t n = 0;
    for (std::size_t k = 0; k < group.size(); ++k) n += measuring(group, k);
    return n;
  }
  void fail(Row& row, const std::string& why) {
    row.disposition = Disposition::failed;
    row.reason = why;
    row.samples_ns.clear();
  }

  const std::vector<Entry>& entries_;
  const Settings& settings_;
  std::vector<Row> rows_;
  RunProgress progress_;
};

// The group's rows are prepared (checked and warmed up) side by side, then measured in rounds of one
// sample each, in tb::schedule's order, until --repetitions rounds, --max-time (each row's budget, the
// group's the sum, checked between rounds) or a stop request.
void Runner::measure(const std::vector<std::size_t>& rows) {
  Group group{rows, {}};
  prepare(group);
  const auto since = std::chrono::steady_clock::now();
  const std::size_t n = group.size();
  const std::vector<std::size_t> order = schedule(n, static_cast<std::size_t>(settings_.repetitions));
  const bool hears_stop = std::all_of(group.members.begin(), group.members.end(),
                                      [](const auto& m) { return !m || m->sampler.hears_stop(); });
  for (int round = 0; round < settings_.repetitions; ++round) {
    const std::size_t measuring = measuring_rows(group);
    if (measuring == 0) break;
    if (hears_stop && stop_requested()) {
      interrupt(group);
      break;
    }
    const double budget_s = settings_.max_time_s * static_cast<double>(measuring);
    if (settings_.max_time_s > 0 && round > 0 && seconds_since(since) > budget_s) {
      cut_short(group);
      break;
    }
    if (!take_round(group, &order[static_cast<std::size_t>(round) * n])) break;
  }
  finish(group);
  tell_costs(group, seconds_since(since));
}

// Each row set up: its set-up, and its share of the group's measuring (the rounds, the retakes).
void Runner::tell_costs(const Group& group, double measuring_s) const {
  if (!settings_.on_row_done || stop_requested()) return;  // an interrupted row's time says nothing
  const auto set_up = static_cast<double>(
      std::count_if(group.members.begin(), group.members.end(), [](const auto& m) { return m != nullptr; }));
  for (std::size_t k = 0; k < group.size(); ++k)
    if (const Member* m = group.members[k].get())
      settings_.on_row_done(entries_[group.rows[k]], m->setup_s, measuring_s / set_up);
}

void Runner::prepare(Group& group) {
  group.members.resize(group.size());
  for (std::size_t k = 0; k < group.size(); ++k) {
    const Entry& e = entries_[group.rows[k]];
    Row& row = rows_[group.rows[k]];
    if (stop_requested()) {
      row.disposition = Disposition::unsupported;
      row.reason = "not run: interrupted";
      continue;
    }
    const bool each_round = group.size() > 1 && RoundObservations::wanted(e);
    auto member = std::make_unique<Member>(e, settings_, progress_.out(), each_round);
    const auto started = std::chrono::steady_clock::now();
    try {
      if (member->sampler.prepare(row, [&](const std::string& what) { member->progress.say(what); })) {
        member->setup_s = seconds_since(started);
        group.members[k] = std::move(member);
      }
    } catch (const std::bad_alloc&) {
      fail(row, describe_bad_alloc(e) + (group.size() > 1 ? " beside the other rows of its pairs" : ""));
    } catch (const std::exception& ex) {
      fail(row, ex.what());
    }
  }
  // The rows' load is watched from the first round on, once every row is ready.
  const std::vector<int> pids = group.processes();
  for (auto& m : group.members)
    if (m) m->watch.start(pids);
}

// One round: a sample of each row still measuring. False: a stop request ended it.
bool Runner::take_round(Group& group, const std::size_t* order) {
  for (std::size_t k = 0; k < group.size(); ++k) {
    if (!measuring(group, order[k])) continue;
    if (take_sample(group, order[k])) {
      interrupt(group);
      return false;
    }
  }
  say_how_far(group);
  return true;
}

// The next sample of the group's k-th row. True: a stop request ended it.
bool Runner::take_sample(Group& group, std::size_t k) {
  Member& member = *group.members[k];
  Row& row = rows_[group.rows[k]];
  try {
    const Taken taken = member.sampler.next_sample();
    row.iterations = member.sampler.iterations();
    if (taken.calls > 0) {  // a sample a stop request cut short keeps the calls it made
      row.samples_ns.push_back(taken.seconds / static_cast<double>(taken.calls) * 1e9);
      if (settings_.on_sample) settings_.on_sample(row.name, row.samples_ns.size() - 1);
    }
    if (taken.stopped) return true;
    member.observations.after_sample(member.sampler.instance());
  } catch (const std::bad_alloc&) {  // the row cannot go on; the others carry on
    group.members[k].reset();
    fail(row, describe_bad_alloc(entries_[group.rows[k]]));
  } catch (const std::exception& ex) {
    group.members[k].reset();
    fail(row, ex.what());
  }
  return false;
}

void Runner::say_how_far(const Group& group) {
  const std::size_t rows = measuring_rows(group);
  const std::string with = group.size() < 2
                               ? ""
                               : " (rounds with " + std::to_string(rows - 1) + " other row" + (rows == 2 ? "" : "s") + ")";
  for (std::size_t k = 0; k < group.size(); ++k)
    if (measuring(group, k))
      group.members[k]->progress.say("sample " + std::to_string(rows_[group.rows[k]].samples_ns.size()) + "/" +
                                     std::to_string(settings_.repetitions) + with);
}

// A stop request ended the group's rounds: each row keeps the samples it took (the one in hand, the calls
// it made) and says how many; one with none has no time.
void Runner::interrupt(const Group& group) {
  for (std::size_t k = 0; k < group.size(); ++k) {
    if (!measuring(group, k)) continue;
    Row& row = rows_[group.rows[k]];
    row.interrupted = signal_name(stop_signal()) + " after " + std::to_string(row.samples_ns.size()) + " of " +
                      std::to_string(settings_.repetitions) + " samples";
    if (row.samples_ns.empty()) mark_not_timed(row, "before its first sample");
  }
}

// --max-time ended the rounds: each row says how many samples it kept, or, with none, why it has no time.
void Runner::cut_short(const Group& group) {
  for (std::size_t k = 0; k < group.size(); ++k) {
    if (!measuring(group, k)) continue;
    Row& row = rows_[group.rows[k]];
    std::ostringstream text;
    text << "--max-time " << settings_.max_time_s << " s: " << row.samples_ns.size() << " of " << settings_.repetitions
         << " samples";
    row.cut_short = text.str();
    if (row.samples_ns.empty()) {
      row.disposition = Disposition::unsupported;
      row.reason = "not timed: " + row.cut_short;
    }
  }
}

// The group's measurement is over: what the machine's load did to each row, what it observed, its
// progress line, and the rows each was measured in rounds with.
void Runner::finish(Group& group) {
  const std::vector<int> pids = group.processes();
  for (std::size_t k = 0; k < group.size(); ++k) {
    Row& row = rows_[group.rows[k]];
    if (Member* m = group.members[k].get(); m && row.timed()) {
      m->watch.finish(row, m->sampler, pids);
      row.configuration = m->sampler.instance().configuration();
      for (const auto& [key, value] : m->observations.counters(m->sampler.instance())) {
        // `key` captured under a name: a C++17 lambda cannot capture a structured binding (clang refuses).
        const auto same = std::find_if(row.counters.begin(), row.counters.end(),
                                       [&name = key](const auto& c) { return c.first == name; });
        if (same != row.counters.end()) same->second = value;
        else row.counters.emplace_back(key, value);
      }
    }
    progress_.announce(row);
  }
  for (std::size_t i : group.rows)
    for (std::size_t other : group.rows)
      if (other != i && rows_[i].timed() && rows_[other].timed()) rows_[i].interleaved_with.push_back(rows_[other].name);
}

}  // namespace

std::vector<Row> measure_entries(const std::vector<Entry>& entries, const Settings& settings, std::ostream& progress) {
  return Runner(entries, settings, progress).run();
}

}  // namespace tb

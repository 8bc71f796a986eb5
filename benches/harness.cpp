#include "harness.h"

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <ctime>
#include <iomanip>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <ostream>
#include <regex>
#include <set>
#include <sstream>

#include "runtime/comm.h"
#include "runtime/cpu_load.h"
#include "runtime/defaults.h"
#include "runtime/device_info.h"
#include "runtime/error.h"
#include "runtime/gpu_monitor.h"
#include "runtime/session.h"
#include "trainbench/build_info.h"

namespace tb {

static volatile std::sig_atomic_t stop_flag = 0;  // the signal that asked, 0: none
void request_stop(int signal) {
  if (!stop_flag) stop_flag = signal > 0 ? signal : SIGINT;  // the first one says how it ended
}
bool stop_requested() { return stop_flag != 0; }
int stop_signal() { return stop_flag; }
void clear_stop_request() { stop_flag = 0; }

static std::string signal_name(int signal) {
  return signal == SIGINT ? "SIGINT" : signal == SIGTERM ? "SIGTERM" : "signal " + std::to_string(signal);
}

// ---- selection ---------------------------------------------------------------------------------

static bool wants(const Settings& s, Backend b) {
  return std::find(s.backends.begin(), s.backends.end(), b) != s.backends.end();
}

static std::string unavailable_reason(const Variant& v) {
  if (v.backend == Backend::cuda) {
    if (!v.make || !cuda_status().built) return cuda_status().unavailable_reason.empty() ? "built without CUDA"
                                                                                         : cuda_status().unavailable_reason;
    if (!cuda_status().available()) return cuda_status().unavailable_reason;
  }
  if (!v.make) return "not built";
  return "";
}

static Entry make_entry(const Stage& stage, const Variant& variant, const Problem& problem) {
  Entry e{&stage, &variant, problem, benchmark_name(stage, variant, problem), unavailable_reason(variant)};
  // Under mpirun the ranks share the machine: a row of one rank would be timed while the others wait
  // in their next collective, on the same cores. Only the collective stages run there.
  if (e.unsupported.empty() && !variant.collective && comm::launched_ranks() > 1)
    e.unsupported = "runs on one rank (this run has " + std::to_string(comm::launched_ranks()) +
                    " ranks): run it without mpirun";
  if (e.unsupported.empty() && variant.unsupported) e.unsupported = variant.unsupported(problem);
  return e;
}

// Stages in registry order, but `peak` first: its rows are what the others are measured against.
static std::vector<const Stage*> ordered_stages(const Registry& registry) {
  std::vector<const Stage*> order;
  if (const Stage* peak = registry.find("peak")) order.push_back(peak);
  for (const auto& s : registry.stages())
    if (s.name != "peak") order.push_back(&s);
  return order;
}

std::vector<Entry> select_entries(const Registry& registry, const Settings& settings) {
  std::regex filter;
  try {
    filter = std::regex(settings.filter.empty() ? "." : settings.filter, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw UsageError("--filter '" + settings.filter + "' is not a valid regular expression: " + e.what());
  }
  std::vector<Entry> selected;
  for (const Stage* stage : ordered_stages(registry))
    for (const auto& variant : stage->variants) {
      if (!wants(settings, variant.backend)) continue;
      for (const auto& problem : expand_problems(*stage, variant, settings.overrides, settings.quick)) {
        Entry e = make_entry(*stage, variant, problem);
        if (std::regex_search(e.name, filter)) selected.push_back(std::move(e));
      }
    }
  if (selected.empty()) {
    // A filter that names only variants of a backend that cannot run here (a GPU-only stage on a
    // CPU-only machine) is not bad usage: those become unsupported rows that say why.
    for (const Stage* stage : ordered_stages(registry))
      for (const auto& variant : stage->variants) {
        if (wants(settings, variant.backend) || unavailable_reason(variant).empty()) continue;
        for (const auto& problem : expand_problems(*stage, variant, settings.overrides, settings.quick)) {
          Entry e = make_entry(*stage, variant, problem);
          if (std::regex_search(e.name, filter)) selected.push_back(std::move(e));
        }
      }
    if (!selected.empty()) return selected;
    std::ostringstream msg;
    msg << "no benchmark matches --filter '" << settings.filter << "' with --backend";
    for (Backend b : settings.backends) msg << " " << to_string(b);
    msg << ". Benchmarks are named stage/backend/variant/problem; stages and variants:";
    for (const Stage* stage : ordered_stages(registry)) {
      msg << "\n  " << stage->name << ":";
      for (const auto& v : stage->variants) msg << " " << to_string(v.backend) << "/" << v.id;
    }
    throw UsageError(msg.str());
  }
  if (!settings.peak_prepass) return selected;

  // Peaks the selected rows are compared with but that the filter left out: measure them first.
  std::set<std::string> provided, needed;
  for (const auto& e : selected) {
    if (!e.unsupported.empty()) continue;
    if (!e.variant->provides_peak.empty()) provided.insert(e.variant->provides_peak);
    const std::string key = e.variant->work(e.problem).peak_key;
    if (!key.empty()) needed.insert(key);
  }
  // (The peak stage's ceilings, and a stage's own: the all-reduce's link.)
  std::vector<Entry> prepass;
  for (const Stage* stage : ordered_stages(registry))
    for (const auto& variant : stage->variants) {
      if (variant.provides_peak.empty() || !needed.count(variant.provides_peak) || provided.count(variant.provides_peak))
        continue;
      for (const auto& problem : expand_problems(*stage, variant, settings.overrides, settings.quick)) {
        Entry e = make_entry(*stage, variant, problem);
        if (e.unsupported.empty()) prepass.push_back(std::move(e));
      }
    }
  selected.insert(selected.begin(), prepass.begin(), prepass.end());
  return selected;
}

// The row a declared pair compares an improved row with: the baseline at the improved row's problem;
// failing that (no row of that name: `exists`), at its values of the axes the baseline has (a bucketed
// all-reduce against one call per tensor: bucket_mb is its own).
static std::string pair_baseline_name(const Stage& stage, const Pair& pair, const Row& improved,
                                      const std::function<bool(const std::string&)>& exists) {
  const std::string prefix = improved.stage + "/" + improved.backend + "/";
  const std::string same_problem = prefix + pair.baseline + improved.name.substr(prefix.size() + improved.variant.size());
  const Variant* baseline = stage.find_variant(pair.baseline, backend_from_string(improved.backend));
  if (exists(same_problem) || !baseline) return same_problem;
  std::vector<std::pair<std::string, std::string>> shared;
  for (const auto& kv : improved.problem)
    if (std::find(baseline->axes.begin(), baseline->axes.end(), kv.first) != baseline->axes.end()) shared.push_back(kv);
  return benchmark_name(stage, *baseline, Problem(shared));
}

// ---- running -----------------------------------------------------------------------------------

namespace {

// The message of a repetition --max-time skipped (not an error of the row).
constexpr const char* kCutShort = "cut short by --max-time";

// A pair group's row takes at most this many batches a sample (Google Benchmark's own limit).
constexpr int64_t kMaxSampleIterations = 1000000000;

// "4m10s", "12.3s".
std::string human_duration(double s) {
  std::ostringstream out;
  if (s >= 3600) out << static_cast<int>(s / 3600) << "h" << std::setw(2) << std::setfill('0') << static_cast<int>(s / 60) % 60 << "m";
  else if (s >= 60) out << static_cast<int>(s / 60) << "m" << std::setw(2) << std::setfill('0') << static_cast<int>(s) % 60 << "s";
  else out << std::fixed << std::setprecision(1) << s << "s";
  return out.str();
}

std::string describe_bad_alloc(const Entry& e) {
  return "out of memory while setting up " + e.name + " (try a smaller --axis value)";
}

// The message of a repetition a stop request ended or left out (not an error of the row).
constexpr const char* kInterrupted = "interrupted";

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// A flush that returns once it is done (CacheFlusher::wait), for a row another process times.
class FlushThenWait final : public CacheFlusher {
 public:
  explicit FlushThenWait(CacheFlusher& inner) : inner_(inner) {}
  void flush() override {
    inner_.flush();
    inner_.wait();
  }

 private:
  CacheFlusher& inner_;
};

class Runner {
 public:
  Runner(const std::vector<Entry>& entries, const Settings& settings, std::ostream& progress)
      : entries_(entries), settings_(settings), progress_(progress), rows_(entries.size()) {
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const Entry& e = entries[i];
      Row& r = rows_[i];
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
    }
  }

  std::vector<Row> run() {
    benchmark::ClearRegisteredBenchmarks();
    if (settings_.interleave_pairs) find_groups();
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (rows_[i].disposition == Disposition::unsupported) continue;
      ++timed_rows_;
      if (const auto g = group_of_row_.find(i); g != group_of_row_.end()) {
        // A group runs where its first row would: each call of its function is one round.
        const std::size_t group = g->second;
        if (groups_[group].members.front() != i) continue;
        group_of_name_[groups_[group].name] = group;
        benchmark::RegisterBenchmark(groups_[group].name.c_str(),
                                     [this, group](benchmark::State& st) { group_round(st, group); })
            ->UseManualTime()
            ->Iterations(1)
            ->Repetitions(settings_.repetitions)
            ->Unit(benchmark::kMillisecond);
        continue;
      }
      index_of_[entries_[i].name] = i;
      benchmark::RegisterBenchmark(entries_[i].name.c_str(), [this, i](benchmark::State& st) { body(st, i); })
          ->UseManualTime()
          ->Repetitions(settings_.repetitions)
          ->MinTime(settings_.min_time_s)
          ->Unit(benchmark::kMillisecond);
    }
    for (std::size_t i = 0; i < rows_.size(); ++i)
      if (rows_[i].disposition == Disposition::unsupported) announce(i);
    run_started_ = row_started_ = std::chrono::steady_clock::now();
    Reporter reporter(*this);
    if (timed_rows_ > 0) benchmark::RunSpecifiedBenchmarks(&reporter);
    lives_.clear();
    for (const Group& group : groups_)
      for (std::size_t i : group.members)
        for (std::size_t other : group.members)
          if (other != i && rows_[i].timed() && rows_[other].timed()) rows_[i].interleaved_with.push_back(rows_[other].name);
    benchmark::ClearRegisteredBenchmarks();
    for (auto& r : rows_)
      if (r.disposition == Disposition::pending) {  // Google Benchmark's own filter skipped it
        r.disposition = Disposition::unsupported;
        r.reason = "not run (excluded by --benchmark_filter)";
      }
    return std::move(rows_);
  }

 private:
  // Everything one benchmark keeps alive across Google Benchmark's calls (it calls the function
  // once per repetition, and more while it picks the iteration count).
  struct Live {
    std::size_t index = 0;
    std::unique_ptr<BackendSession> session;
    std::unique_ptr<Instance> instance;
    // A stop request ended this row: the calls and seconds of the repetition it cut short (its last
    // sample, when it got to a call). The repetitions taken whole, and when the progress line last spoke.
    bool interrupted = false;
    int64_t partial_calls = 0;
    double partial_seconds = 0;
    int samples_taken = 0;
    std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now(), said_at = started;
    std::unique_ptr<SampleTimer> agreed;  // a collective's timer under mpirun (AgreedTimer)
    // Cold mode's flush before each sample, or null. A row timed by another process's clock waits for
    // the flush to end: that process's calls would not queue behind it on this process's stream.
    CacheFlusher* flusher(bool cold) {
      if (!cold) return nullptr;
      if (!instance || !instance->own_timer()) return &session->flusher();
      if (!waiting_flusher) waiting_flusher = std::make_unique<FlushThenWait>(session->flusher());
      return waiting_flusher.get();
    }
    std::unique_ptr<CacheFlusher> waiting_flusher;
    SampleTimer& timer() {
      if (agreed) return *agreed;
      if (injected) return *injected;
      if (SampleTimer* own = instance ? instance->own_timer() : nullptr) return *own;  // another process's calls
      return session->timer();
    }
    std::string gpu_uuid;   // CUDA rows: the device NVML is asked about
    struct Mark {           // what the rest of the machine had done by some moment
      CpuTicks cpu;         // CPU rows: all CPUs' and this process's ticks (/proc/stat)
      GpuThrottleState gpu; // CUDA rows: the GPU's throttling counters and clock (NVML)
    };
    Mark measuring_from;    // when this row's first sample began
    std::chrono::steady_clock::time_point measuring_since;  // the same, for --max-time
    int whole_samples = 0;  // body calls that lasted a sample (--min-time): one exists before --max-time cuts
    std::unique_ptr<SampleTimer> injected;  // Settings::sample_timer's, when a test gave one
    // A row of a pair group: the calls of `batch` each a sample makes (found by its first sample, as
    // Google Benchmark finds a single row's iteration count) ...
    int64_t iterations = 0;
    // ... and, where a pair compares it with a model's prediction timed inside the row (cg's lazy gate),
    // what it observed after each of its samples, so that the model's parts are timed in the same
    // rounds as what they predict: the row keeps each counter's median.
    bool observe_each_round = false;
    std::map<std::string, std::vector<double>> observed_rounds;
    std::vector<std::string> observed_order;  // the counters in the order the instance gave them
  };

  // The rows a stage's declared pairs join at one problem (adamw's per-tensor, foreach and fused at one
  // size), measured together in rounds: round r takes one sample of each, in entry order when r is even
  // and in reverse when odd (A B, B A, ...), so that whatever slows the machine for a while slows both
  // sides of the rounds it lasts, and each pair's ratio comes from its rounds.
  struct Group {
    std::vector<std::size_t> members;  // rows, in entry order
    std::string name;                  // Google Benchmark's: the members' names joined by " + "
    bool prepared = false;
    int rounds_done = 0;
    std::chrono::steady_clock::time_point measuring_since;  // --max-time: each member's budget, summed
  };

  class Reporter final : public benchmark::BenchmarkReporter {
   public:
    explicit Reporter(Runner& runner) : runner_(runner) {}
    bool ReportContext(const Context&) override { return true; }
    void ReportRuns(const std::vector<Run>& runs) override {
      for (const auto& run : runs) {
        if (run.run_type != Run::RT_Iteration) continue;
        const auto it = runner_.index_of_.find(run.run_name.function_name);
        if (it == runner_.index_of_.end()) continue;
        Row& row = runner_.rows_[it->second];
        if (run.report_label == kCutShort) continue;  // --max-time: the samples taken stand
        if (run.error_occurred) {
          if (run.error_message == kInterrupted) {  // the repetition a stop request cut short, those it left out
            runner_.note_interrupted(it->second);
            continue;
          }
          if (row.disposition == Disposition::pending || row.disposition == Disposition::passed) {
            row.disposition = Disposition::failed;
            row.reason = run.error_message;
          }
          continue;
        }
        if (run.iterations > 0 && row.disposition == Disposition::passed) {
          row.iterations = run.iterations;
          row.samples_ns.push_back(run.real_accumulated_time / static_cast<double>(run.iterations) /
                                   static_cast<double>(row.batch) * 1e9);
        }
      }
      // Aggregates come in a call of their own; announce each benchmark once, with its samples.
      if (!runs.empty() && runs.front().run_type == Run::RT_Iteration) {
        const auto group = runner_.group_of_name_.find(runs.front().run_name.function_name);
        if (group != runner_.group_of_name_.end())  // its rows' samples are in already
          for (std::size_t i : runner_.groups_[group->second].members) runner_.finish_row(i);
        const auto it = runner_.index_of_.find(runs.front().run_name.function_name);
        if (it != runner_.index_of_.end()) runner_.finish_row(it->second);
      }
    }

   private:
    Runner& runner_;
  };

  // A row's measurement is over: what --max-time and the machine's load did to it, what it observed,
  // and its progress line.
  void finish_row(std::size_t i) {
    note_cut_short(i);
    check_disturbance(i);
    add_observed(i);
    announce(i);
  }

  // The row in hand (or one of the pair group's rows in hand), null when i is not.
  Live* live_of(std::size_t i) const {
    for (const auto& live : lives_)
      if (live->index == i) return live.get();
    return nullptr;
  }

  // What the rest of the machine had done by now, for `live`'s window. The processes whose calls the
  // rows in hand make (a PyTorch row's script) are the measurement too, whichever row's window it is:
  // in a pair group with a PyTorch row, the script's time is the group's other samples, not a load.
  Live::Mark mark(const Live& live, bool gpu) const {
    Live::Mark m;
    if (gpu) {
      m.gpu = GpuMonitor::instance().read(live.gpu_uuid);
      return m;
    }
    m.cpu = read_cpu_ticks();
    // A collective row's "self" is every rank on this host: they are the measurement, not others.
    if (live.agreed) m.cpu.self = static_cast<uint64_t>(comm::world().local_sum(static_cast<double>(m.cpu.self)));
    std::set<int> elsewhere;
    if (live.instance && live.instance->process_id() > 0) elsewhere.insert(live.instance->process_id());
    for (const auto& other : lives_)
      if (other->instance && other->instance->process_id() > 0) elsewhere.insert(other->instance->process_id());
    for (const int pid : elsewhere) m.cpu.self += process_cpu_ticks(pid);
    return m;
  }
  // The share of the window between two marks that was disturbed: CPU rows, the other processes' (and
  // steal's) share of all CPUs; CUDA rows, the share the GPU spent throttled. -1: not known.
  static double disturbed_part(bool gpu, const Live::Mark& a, const Live::Mark& b) {
    return gpu ? throttled_share(a.gpu, b.gpu) : others_share(a.cpu, b.cpu);
  }
  static void note_clock(Row& row, const GpuThrottleState& s) {
    if (!s.valid) return;
    const int mhz = static_cast<int>(s.sm_clock_mhz);
    row.sm_clock_min_mhz = row.sm_clock_min_mhz ? std::min(row.sm_clock_min_mhz, mhz) : mhz;
    row.sm_clock_max_mhz = std::max(row.sm_clock_max_mhz, mhz);
    row.clock_reasons |= s.reasons & ~uint64_t{0x1};  // GpuIdle: between samples, says nothing
  }

  // A row measured while the machine was busy with something else (a CPU row while other processes
  // held the cores; a CUDA row while the GPU was thermally throttled, as nvbench checks): its samples
  // are taken again, each one watched, up to disturbed_retakes times; one that stays disturbed marks
  // the row, whose pairs are then withheld.
  void check_disturbance(std::size_t i) {
    Row& row = rows_[i];
    Live* const live = live_of(i);
    if (!live || !row.timed()) return;
    const bool gpu = entries_[i].variant->backend == Backend::cuda;
    const double limit = gpu ? settings_.throttled_share : settings_.disturbed_share;
    double& seen = gpu ? row.throttled_share : row.others_share;
    const Live::Mark end = mark(*live, gpu);
    if (gpu) {
      note_clock(row, live->measuring_from.gpu);
      note_clock(row, end.gpu);
    }
    seen = agreed(i, disturbed_part(gpu, live->measuring_from, end));
    if (seen <= limit) return;  // clean, or unknown (-1)
    // No time to take them again: --max-time is spent, or a stop was asked for (not in a collective's
    // row under mpirun, as in prepare). The samples stand, and the row says it was disturbed.
    const bool hear_stop = !live->agreed;
    if ((hear_stop && stop_requested()) || cut_.count(i)) {
      row.disturbed = true;
      return;
    }
    SampleTimer& timer = live->timer();
    CacheFlusher* flusher = live->flusher(settings_.cold);
    const int64_t calls = std::max<int64_t>(row.iterations, 1);
    double worst_kept = 0;
    for (double& sample : row.samples_ns) {
      for (int attempt = 0; attempt < defaults::disturbed_retakes; ++attempt) {
        const Live::Mark before = mark(*live, gpu);
        double seconds = 0;
        int64_t k = 0;
        for (; k < calls && !(hear_stop && stop_requested()); ++k)
          seconds += time_sample(timer, [&] { live->instance->run(); }, row.batch, flusher);
        if (k < calls) {  // a stop request: this sample and those not yet taken again stand, marked
          row.disturbed = true;
          worst_kept = std::max(worst_kept, seen);
          break;
        }
        const Live::Mark after = mark(*live, gpu);
        if (gpu) note_clock(row, after.gpu);
        const double share = agreed(i, disturbed_part(gpu, before, after));
        sample = seconds / static_cast<double>(calls * row.batch) * 1e9;
        ++row.retaken;
        if (share <= limit) {
          worst_kept = std::max(worst_kept, std::max(share, 0.0));
          break;
        }
        if (attempt + 1 == defaults::disturbed_retakes) {
          row.disturbed = true;
          worst_kept = std::max(worst_kept, share);
        }
      }
    }
    seen = worst_kept;
  }

  // A collective row's decisions are every rank's: the most disturbed rank's share decides.
  double agreed(std::size_t i, double value) const {
    return entries_[i].variant->collective ? comm::agree_max(value) : value;
  }

  void add_observed(std::size_t i) {
    Live* const live = live_of(i);
    if (!live || !rows_[i].timed()) return;
    rows_[i].configuration = live->instance->configuration();
    std::vector<std::pair<std::string, double>> observed;
    if (live->observed_order.empty()) {
      observed = live->instance->observed();
    } else {
      for (const auto& key : live->observed_order) observed.emplace_back(key, median_of(live->observed_rounds[key]));
    }
    for (const auto& [key, value] : observed) {
      auto& counters = rows_[i].counters;
      const auto same = std::find_if(counters.begin(), counters.end(), [&](const auto& c) { return c.first == key; });
      if (same != counters.end()) same->second = value;
      else counters.emplace_back(key, value);
    }
  }

  // --max-time ended the row: how many samples it kept, or, with none, why it has no time.
  void note_cut_short(std::size_t i) {
    Row& row = rows_[i];
    if (!cut_.count(i)) return;
    std::ostringstream text;
    text << "--max-time " << settings_.max_time_s << " s: " << row.samples_ns.size() << " of " << settings_.repetitions
         << " samples";
    row.cut_short = text.str();
    if (row.disposition == Disposition::passed && row.samples_ns.empty()) {
      row.disposition = Disposition::unsupported;
      row.reason = "not timed: " + row.cut_short;
    }
  }

  // The time a row is expected to take from what the rows so far took, for the ETA.
  std::string eta_text(std::size_t i) {
    const auto now = std::chrono::steady_clock::now();
    if (rows_[i].disposition != Disposition::unsupported || cut_.count(i)) {
      ++rows_done_;
      const double row_s = std::chrono::duration<double>(now - row_started_).count();
      seconds_done_ += row_s;
    }
    row_started_ = now;
    const std::size_t left = timed_rows_ > rows_done_ ? timed_rows_ - rows_done_ : 0;
    if (rows_done_ == 0) return "";
    double per_row = seconds_done_ / static_cast<double>(rows_done_);
    const double elapsed = std::chrono::duration<double>(now - run_started_).count();
    std::ostringstream out;
    out << "  [" << human_duration(elapsed) << " elapsed";
    if (left) out << ", ETA " << human_duration(per_row * static_cast<double>(left));
    out << "]";
    return out.str();
  }

  void announce(std::size_t i) {
    Row& r = rows_[i];
    const std::string eta = r.disposition == Disposition::unsupported && !cut_.count(i) ? std::string() : eta_text(i);
    progress_ << "[" << std::setw(3) << ++announced_ << "/" << rows_.size() << "] " << r.name << "  ";
    if (r.timed()) {
      const Summary s = summarize(r.samples_ns, settings_.noise_target);
      progress_ << std::fixed << std::setprecision(3) << s.median / 1e6 << " ms +-" << std::setprecision(1)
                << 100 * s.rel_half_width << "%";
      if (r.bound == "memory" && r.bytes > 0) progress_ << "  " << std::setprecision(2) << r.bytes / s.median << " GB/s";
      if (r.bound == "compute" && r.flops > 0) progress_ << "  " << std::setprecision(3) << r.flops / s.median * 1e-3 << " TFLOP/s";
      if (s.noisy) progress_ << "  (noisy)";
      if (r.disturbed)
        progress_ << "  (disturbed: " << disturbance_text(r)
                  << (!r.interrupted.empty() && r.retaken == 0 ? ", not taken again: interrupted)"
                                                               : " after " + std::to_string(r.retaken) + " retakes)");
      else if (r.retaken)
        progress_ << "  (" << r.retaken << " samples taken again: "
                  << (r.throttled_share >= 0 ? "the GPU throttled" : "other processes held the CPUs") << ")";
      if (!r.interrupted.empty()) progress_ << "  (interrupted: " << r.interrupted << ")";
      for (const auto& [key, value] : r.counters) progress_ << "  " << key << "=" << counter_text(value);
      if (!r.cut_short.empty()) progress_ << "  (cut short: " << r.cut_short << ")";
    } else {
      progress_ << r.disposition << (r.reason.empty() ? "" : ": " + r.reason);
    }
    progress_ << eta << std::endl;
  }

  // First call for an entry: instantiate, run once, check against the reference, warm up, and pick
  // the batch. Returns null when the variant must not be timed (the row says why). A pair group's rows
  // keep each other alive (`beside_others`); a single row frees the previous benchmark's buffers first.
  Live* prepare(std::size_t i, bool beside_others = false) {
    if (Live* live = live_of(i)) return live;
    if (!beside_others) lives_.clear();
    const Entry& e = entries_[i];
    Row& row = rows_[i];
    auto live = std::make_unique<Live>();
    live->index = i;
    live->session = make_session(e.variant->backend, settings_.cuda_device);
    if (settings_.sample_timer) live->injected = settings_.sample_timer();
    if (e.variant->collective && comm::launched_ranks() > 1) live->agreed = std::make_unique<comm::AgreedTimer>(live->session->timer());
    try {
      live->instance = e.variant->make(e.problem, live->session->context());
    } catch (const CannotRun& why) {  // it looked, and cannot run this problem here
      row.disposition = Disposition::unsupported;
      row.reason = why.what();
      return nullptr;
    }
    // (A collective's row under mpirun does not stop halfway: its ranks would hear it at different calls.)
    auto stopping = [&] { return !live->agreed && stop_requested(); };
    if (stopping()) return not_timed(row, "before its first call");
    SampleTimer& timer = live->timer();
    const double first_s = time_sample(timer, [&] { live->instance->run(); }, 1);
    if (stopping()) return not_timed(row, "before its check against the reference");
    say(i, *live, "first call done; checking it against the reference");
    const Verdict verdict = live->instance->check();
    row.max_error = verdict.max_error;
    if (!verdict.passed) {
      row.disposition = Disposition::incorrect;
      row.reason = verdict.detail.empty() ? "output differs from the reference" : verdict.detail;
      return nullptr;
    }
    row.disposition = Disposition::passed;
    // Warm-up: at least a few calls and a few milliseconds, so clocks, caches and lazy library
    // initialisation (cuBLAS heuristics, page faults) are behind us before the first sample.
    double call_s = first_s;
    double spent = first_s;
    for (int k = 0; k < defaults::warmup_calls || spent < defaults::warmup_s; ++k) {
      if (stopping()) return not_timed(row, "during its warm-up (its check passed)");
      call_s = time_sample(timer, [&] { live->instance->run(); }, 1);
      spent += call_s;
      if (k > 1000) break;
    }
    // Cold mode flushes the cache before every call, so each sample is one call.
    row.batch = settings_.cold ? 1 : batch_for(call_s, live->session->min_sample_s(), defaults::max_batch);
    if (e.variant->backend == Backend::cuda)
      for (const auto& g : cuda_status().devices)
        if (g.index == settings_.cuda_device) live->gpu_uuid = g.uuid;
    say(i, *live, "warmed up; sample 1/" + std::to_string(settings_.repetitions) + " next");
    live->measuring_from = mark(*live, e.variant->backend == Backend::cuda);
    live->measuring_since = std::chrono::steady_clock::now();
    lives_.push_back(std::move(live));
    return lives_.back().get();
  }

  // A stop request before the row's first sample: it has no time.
  static Live* not_timed(Row& row, const std::string& when) {
    row.disposition = Disposition::unsupported;
    row.reason = "not timed: interrupted " + when;
    return nullptr;
  }

  // A row that takes long says how far it is, at most every Settings::progress_every_s.
  void say(std::size_t i, Live& live, const std::string& what) {
    if (seconds_since(live.said_at) < settings_.progress_every_s) return;
    live.said_at = std::chrono::steady_clock::now();
    progress_ << "      " << rows_[i].name << "  " << what << " (" << std::fixed << std::setprecision(1)
              << seconds_since(live.started) << " s in this row)" << std::endl;
  }

  // A stop request ended the row in hand: the repetition it cut short is its last sample (the calls
  // made: each is whole), the row says how many samples it has, and with none it has no time.
  void note_interrupted(std::size_t i) {
    Row& row = rows_[i];
    Live* const live = live_of(i);
    if (!live || !live->interrupted || row.disposition != Disposition::passed) return;
    if (live->partial_calls > 0) {
      row.samples_ns.push_back(live->partial_seconds / static_cast<double>(live->partial_calls) * 1e9);
      live->partial_calls = 0;
    }
    row.interrupted = signal_name(stop_signal()) + " after " + std::to_string(row.samples_ns.size()) + " of " +
                      std::to_string(settings_.repetitions) + " samples";
    if (row.samples_ns.empty()) not_timed(row, "before its first sample");
  }

  // The row in hand stops: the samples it took stand (note_interrupted), its repetitions left end at once.
  // Called inside the iteration loop: Google Benchmark's statistics over the repetitions need each to
  // report the iteration count, and one that never entered the loop reports none.
  static void stop_row(benchmark::State& st, Live& live) {
    live.interrupted = true;
    st.SkipWithError(kInterrupted);
  }

  void body(benchmark::State& st, std::size_t i) {
    Row& row = rows_[i];
    if (stop_requested() && row.disposition == Disposition::pending) {
      row.disposition = Disposition::unsupported;
      row.reason = "not run: interrupted";
    }
    if (row.disposition != Disposition::pending && row.disposition != Disposition::passed) {
      st.SkipWithError((to_string(row.disposition) + (": " + row.reason)).c_str());
      return;
    }
    try {
      Live* live = prepare(i);
      if (!live) {
        st.SkipWithError((to_string(row.disposition) + (": " + row.reason)).c_str());
        return;
      }
      // A stop request is heard between the calls of a batch and between samples; the repetition it
      // cuts short keeps the calls it made. (Not in a collective's row under mpirun, as in prepare.)
      bool (*const stop)() = live->agreed ? nullptr : &stop_requested;
      if (stop && stop())  // between two repetitions; inside the loop, so that it has its iteration count
        for (auto _ : st) return stop_row(st, *live);
      // --max-time: once a whole sample is in (the first repetition, which fixes the iteration count
      // the others run), a row past its time stops with the samples it has. Each repetition left runs
      // its iterations empty, labelled kCutShort, and the reporter drops it: Google Benchmark's
      // statistics need every repetition's iteration count, so a skipped (errored) one would not do.
      if (settings_.max_time_s > 0 && live->whole_samples > 0 &&
          std::chrono::duration<double>(std::chrono::steady_clock::now() - live->measuring_since).count() >
              settings_.max_time_s) {
        cut_.insert(i);
        st.SetLabel(kCutShort);
        for (auto _ : st) st.SetIterationTime(0);
        return;
      }
      CacheFlusher* flusher = live->flusher(settings_.cold);
      SampleTimer& timer = live->timer();
      Instance& instance = *live->instance;
      const int64_t batch = row.batch;
      double measured = 0;
      int64_t calls = 0;
      benchmark::IterationCount iterations_done = 0;
      for (auto _ : st) {
        int64_t made = batch;
        const double seconds = time_sample(timer, [&] { instance.run(); }, batch, flusher, stop, &made);
        measured += seconds;
        calls += made;
        ++iterations_done;
        if (stop && stop() && (made < batch || iterations_done < st.max_iterations)) {
          live->partial_calls = calls;
          live->partial_seconds = measured;
          return stop_row(st, *live);
        }
        st.SetIterationTime(seconds);
      }
      if (measured >= settings_.min_time_s) ++live->whole_samples;  // --max-time cuts only after one
      // Google Benchmark keeps every repetition after the first, and the first once it lasted --min-time.
      if (live->samples_taken > 0 || measured >= settings_.min_time_s) {
        if (settings_.on_sample) settings_.on_sample(row.name, static_cast<std::size_t>(live->samples_taken));
        ++live->samples_taken;
        say(i, *live, "sample " + std::to_string(live->samples_taken) + "/" + std::to_string(settings_.repetitions));
      }
    } catch (const std::bad_alloc&) {
      fail(st, row, describe_bad_alloc(entries_[i]));
    } catch (const std::exception& ex) {
      fail(st, row, ex.what());
    }
  }

  // ---- pair groups ---------------------------------------------------------------------------------

  // Joins the rows each declared pair compares (the improved row and its baseline, as finish_results
  // finds it) into groups, transitively. Under mpirun a collective row keeps its ranks in step on its
  // own, so it joins none.
  void find_groups() {
    std::map<std::string, std::size_t> runnable;
    for (std::size_t i = 0; i < rows_.size(); ++i)
      if (rows_[i].disposition == Disposition::pending) runnable[rows_[i].name] = i;
    std::vector<std::size_t> parent(rows_.size());
    for (std::size_t i = 0; i < parent.size(); ++i) parent[i] = i;
    auto root = [&](std::size_t i) {
      while (parent[i] != i) i = parent[i] = parent[parent[i]];
      return i;
    };
    const bool ranks = comm::launched_ranks() > 1;
    for (const auto& [name, i] : runnable) {
      const Entry& e = entries_[i];
      if (ranks && e.variant->collective) continue;
      for (const auto& pair : e.stage->pairs) {
        if (pair.improved != e.variant->id) continue;
        const auto baseline = runnable.find(pair_baseline_name(
            *e.stage, pair, rows_[i], [&](const std::string& other) { return runnable.count(other) > 0; }));
        if (baseline == runnable.end() || (ranks && entries_[baseline->second].variant->collective)) continue;
        parent[root(baseline->second)] = root(i);
      }
      for (const auto& other : e.measured_with)
        if (const auto with = runnable.find(other); with != runnable.end()) parent[root(with->second)] = root(i);
    }
    std::map<std::size_t, std::vector<std::size_t>> members;
    for (const auto& [name, i] : runnable) members[root(i)].push_back(i);
    for (auto& [r, rows] : members) {
      if (rows.size() < 2) continue;
      std::sort(rows.begin(), rows.end());
      Group group;
      group.members = rows;
      for (std::size_t i : rows) {
        group.name += (group.name.empty() ? "" : " + ") + rows_[i].name;
        group_of_row_[i] = groups_.size();
      }
      groups_.push_back(std::move(group));
    }
    // The improved rows whose pair shows a model's prediction time the model's parts every round.
    for (const Group& group : groups_)
      for (std::size_t i : group.members)
        for (const auto& pair : entries_[i].stage->pairs)
          if (pair.improved == entries_[i].variant->id && !pair.predicted_ns.empty()) observed_each_round_.insert(i);
  }

  // What one sample of a row took: the seconds of the calls it made, and whether a stop request
  // ended it early (its calls are then fewer than iterations x batch).
  struct Taken {
    double seconds = 0;
    int64_t calls = 0;
    bool stopped = false;
  };
  Taken take_sample(Live& live, int64_t iterations) {
    CacheFlusher* flusher = live.flusher(settings_.cold);
    bool (*const stop)() = live.agreed ? nullptr : &stop_requested;
    const int64_t batch = rows_[live.index].batch;
    Taken taken;
    for (int64_t k = 0; k < iterations; ++k) {
      int64_t made = batch;
      taken.seconds += time_sample(live.timer(), [&] { live.instance->run(); }, batch, flusher, stop, &made);
      taken.calls += made;
      if (stop && stop() && (made < batch || k + 1 < iterations)) {
        taken.stopped = true;
        break;
      }
    }
    return taken;
  }

  // A group row's first sample also finds how many batches its samples take, as Google Benchmark does
  // for a single row: more until one lasts --min-time; that one is its first sample.
  Taken first_sample(Live& live) {
    int64_t iterations = 1;
    for (;;) {
      const Taken taken = take_sample(live, iterations);
      if (taken.stopped || taken.seconds >= settings_.min_time_s || iterations >= kMaxSampleIterations) {
        live.iterations = iterations;
        return taken;
      }
      const double grow = taken.seconds > 0 ? std::min(10.0, 1.4 * settings_.min_time_s / taken.seconds) : 10.0;
      iterations = std::max(iterations + 1, static_cast<int64_t>(std::ceil(static_cast<double>(iterations) * grow)));
    }
  }

  // A group row that cannot go on (its call threw) leaves the group; the others carry on.
  void drop_member(std::size_t i, const std::string& why) {
    lives_.erase(std::remove_if(lives_.begin(), lives_.end(), [&](const auto& live) { return live->index == i; }),
                 lives_.end());
    rows_[i].disposition = Disposition::failed;
    rows_[i].reason = why;
    rows_[i].samples_ns.clear();
  }

  void prepare_group(Group& group) {
    lives_.clear();  // the previous benchmark's buffers
    for (std::size_t i : group.members) {
      Row& row = rows_[i];
      if (stop_requested()) {
        if (row.disposition == Disposition::pending) {
          row.disposition = Disposition::unsupported;
          row.reason = "not run: interrupted";
        }
        continue;
      }
      try {
        if (Live* live = prepare(i, /*beside_others=*/true)) live->observe_each_round = observed_each_round_.count(i) > 0;
      } catch (const std::bad_alloc&) {
        drop_member(i, describe_bad_alloc(entries_[i]) + " beside the other rows of its pairs");
      } catch (const std::exception& ex) {
        drop_member(i, ex.what());
      }
    }
    // The rows' time and load are watched from the first round on, once every row is ready.
    group.measuring_since = std::chrono::steady_clock::now();
    for (auto& live : lives_) {
      live->measuring_from = mark(*live, entries_[live->index].variant->backend == Backend::cuda);
      live->measuring_since = group.measuring_since;
    }
    group.prepared = true;
  }

  // A stop request ended the group's rounds: each row keeps the samples it took (the one in hand, the
  // calls it made) and says how many.
  void interrupt_group(const Group& group) {
    for (std::size_t i : group.members) {
      Row& row = rows_[i];
      if (row.disposition != Disposition::passed || !live_of(i)) continue;
      row.interrupted = signal_name(stop_signal()) + " after " + std::to_string(row.samples_ns.size()) + " of " +
                        std::to_string(settings_.repetitions) + " samples";
      if (row.samples_ns.empty()) not_timed(row, "before its first sample");
    }
  }

  // One call of a group's benchmark: one round, a sample of each of its rows.
  void group_round(benchmark::State& st, std::size_t g) {
    Group& group = groups_[g];
    if (!group.prepared) prepare_group(group);
    std::vector<std::size_t> order;
    for (std::size_t i : group.members)
      if (rows_[i].disposition == Disposition::passed && live_of(i)) order.push_back(i);
    if (stop_requested() || order.empty()) {  // between two rounds: inside the loop, for its iteration count
      if (stop_requested()) interrupt_group(group);
      for (auto _ : st) {
        if (stop_requested()) st.SkipWithError(kInterrupted);
        else st.SetIterationTime(0);
      }
      return;
    }
    // --max-time: each row has its budget, and the group the sum of its rows', checked between rounds.
    if (settings_.max_time_s > 0 && group.rounds_done > 0 &&
        seconds_since(group.measuring_since) > settings_.max_time_s * static_cast<double>(order.size())) {
      for (std::size_t i : order) cut_.insert(i);
      st.SetLabel(kCutShort);
      for (auto _ : st) st.SetIterationTime(0);
      return;
    }
    if (group.rounds_done % 2) std::reverse(order.begin(), order.end());
    double round_seconds = 0;
    for (auto _ : st) {
      for (std::size_t i : order) {
        Live& live = *live_of(i);
        Row& row = rows_[i];
        try {
          const Taken taken = group.rounds_done == 0 ? first_sample(live) : take_sample(live, live.iterations);
          row.iterations = live.iterations;
          if (taken.calls > 0) {
            row.samples_ns.push_back(taken.seconds / static_cast<double>(taken.calls) * 1e9);
            if (settings_.on_sample) settings_.on_sample(row.name, row.samples_ns.size() - 1);
          }
          round_seconds += taken.seconds;
          if (taken.stopped) {
            interrupt_group(group);
            st.SkipWithError(kInterrupted);
            return;
          }
          if (live.observe_each_round)
            for (const auto& [key, value] : live.instance->observed()) {
              auto& values = live.observed_rounds[key];
              if (values.empty()) live.observed_order.push_back(key);
              values.push_back(value);
            }
        } catch (const std::bad_alloc&) {
          drop_member(i, describe_bad_alloc(entries_[i]));
        } catch (const std::exception& ex) {
          drop_member(i, ex.what());
        }
      }
      st.SetIterationTime(round_seconds);
    }
    ++group.rounds_done;
    for (std::size_t i : order)
      if (Live* live = live_of(i))
        say(i, *live, "sample " + std::to_string(rows_[i].samples_ns.size()) + "/" + std::to_string(settings_.repetitions) +
                          " (rounds with " + std::to_string(order.size() - 1) + " other row" + (order.size() == 2 ? "" : "s") + ")");
    if (stop_requested() && group.rounds_done < settings_.repetitions) interrupt_group(group);
  }

  void fail(benchmark::State& st, Row& row, const std::string& why) {
    lives_.clear();
    row.disposition = Disposition::failed;
    row.reason = why;
    row.samples_ns.clear();
    st.SkipWithError(why.c_str());
  }

  const std::vector<Entry>& entries_;
  const Settings& settings_;
  std::ostream& progress_;
  std::vector<Row> rows_;
  std::map<std::string, std::size_t> index_of_;
  std::vector<std::unique_ptr<Live>> lives_;  // the row in hand, or a pair group's rows
  std::vector<Group> groups_;
  std::map<std::size_t, std::size_t> group_of_row_;     // row -> its group
  std::map<std::string, std::size_t> group_of_name_;    // Google Benchmark's name -> group
  std::set<std::size_t> observed_each_round_;           // rows whose pair shows a model's prediction
  std::size_t announced_ = 0;
  std::set<std::size_t> cut_;  // rows --max-time cut short
  // The ETA on the progress line: the rows to time, those done and the seconds they took.
  std::size_t timed_rows_ = 0, rows_done_ = 0;
  double seconds_done_ = 0;
  std::chrono::steady_clock::time_point run_started_ = std::chrono::steady_clock::now(), row_started_ = run_started_;
};

std::string iso_date_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S%z", &tm);
  std::string s = buf;
  if (s.size() > 5) s.insert(s.size() - 2, ":");  // +0000 -> +00:00 as Google Benchmark writes it
  return s;
}

}  // namespace

std::string expected_time_text(const std::vector<Entry>& entries, const Settings& settings) {
  std::size_t rows = 0;
  for (const auto& e : entries)
    if (e.unsupported.empty()) ++rows;
  // Google Benchmark finds each row's iteration count on a first run of at least --min-time, then
  // takes --repetitions samples of at least --min-time each; the warm-up comes before them.
  // With --max-time a row stops after its first whole sample once S have passed.
  const double all_samples = (settings.repetitions + 1) * settings.min_time_s;
  const double capped = settings.max_time_s > 0 ? std::min(all_samples, settings.max_time_s + settings.min_time_s) : all_samples;
  const double at_least = static_cast<double>(rows) * (capped + defaults::warmup_s);
  std::ostringstream out;
  out << rows << " row" << (rows == 1 ? "" : "s") << " to time, " << settings.repetitions << " samples of at least "
      << settings.min_time_s << " s each: expect at least " << human_duration(at_least);
  if (settings.max_time_s > 0)
    out << ", at most about "
        << human_duration(static_cast<double>(rows) *
                          (std::min(all_samples, settings.max_time_s + 2 * settings.min_time_s) + defaults::warmup_s))
        << " with --max-time " << settings.max_time_s << " (plus each row's set-up and check, and a call that outlasts a sample)";
  else
    out << " (a row whose one call outlasts a sample takes longer: --max-time S caps each row)";
  out << "; the progress lines give an ETA";
  return out.str();
}

Results run_entries(const Registry& registry, const std::vector<Entry>& entries, const Settings& settings,
                    std::ostream& progress) {
  Results results;
  results.context = run_context(settings);
  results.rows = Runner(entries, settings, progress).run();
  if (stop_requested()) results.context["interrupted"] = signal_name(stop_signal());
  finish_results(registry, settings, results);
  return results;
}

nlohmann::json run_context(const Settings& settings) {
  using nlohmann::json;
  const auto& cpu = benchmark::CPUInfo::Get();
  json caches = json::array();
  for (const auto& c : cpu.caches)
    caches.push_back({{"type", c.type}, {"level", c.level}, {"size", c.size}, {"num_sharing", c.num_sharing}});
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  json context = {{"date", iso_date_now()},
                  {"host_name", host},
                  {"executable", "benchsuite"},
                  {"num_cpus", cpu.num_cpus},
                  {"mhz_per_cpu", static_cast<int64_t>(cpu.cycles_per_second / 1e6)},
                  {"cpu_scaling_enabled", cpu.scaling == benchmark::CPUInfo::ENABLED},
                  {"caches", caches},
                  {"load_avg", cpu.load_avg},
                  {"library_build_type", std::string(build::build_type) == "Debug" ? "debug" : "release"}};
  context["trainbench"] = {{"version", build::version},
                           {"git_commit", build::git_commit},
                           {"build_type", build::build_type},
                           {"cuda_built", cuda_status().built},
                           {"cuda_architectures", cuda_status().built ? build::cuda_architectures : ""}};
  const HostInfo h = host_info();
  context["host"] = {{"cpu_model", h.cpu_model}, {"cores", h.cores},       {"threads", h.threads},
                     {"omp_threads", h.omp_threads}, {"compiler", h.compiler}, {"blas", h.blas},
                     {"l3_bytes", h.l3_bytes}};
  json devices = json::array();
  for (const auto& g : cuda_status().devices)
    devices.push_back({{"index", g.index},
                       {"name", g.name},
                       {"uuid", g.uuid},
                       {"compute_capability", g.compute_capability},
                       {"sms", g.sms},
                       {"memory_bytes", g.memory_bytes},
                       {"l2_bytes", g.l2_bytes},
                       {"sm_clock_mhz", g.sm_clock_mhz},
                       {"memory_clock_mhz", g.memory_clock_mhz},
                       {"memory_bus_bits", g.memory_bus_bits},
                       {"driver_version", g.driver_version},
                       {"runtime_version", g.runtime_version},
                       {"cublas_version", g.cublas_version},
                       {"cusparse_version", g.cusparse_version}});
  context["devices"] = devices;
  context["cuda_unavailable_reason"] = cuda_status().unavailable_reason;
  context["cache_thresholds"] = cache_thresholds_json(settings);
  json backends = json::array();
  for (Backend b : settings.backends) backends.push_back(to_string(b));
  context["settings"] = {{"mode", settings.cold ? "cold" : "hot"},
                         {"repetitions", settings.repetitions},
                         {"min_time_s", settings.min_time_s},
                         {"quick", settings.quick},
                         {"noise_target", settings.noise_target},
                         {"backends", backends},
                         {"cuda_device", settings.cuda_device},
                         {"filter", settings.filter},
                         {"ranks", comm::launched_ranks()}};
  return context;
}

static std::string mib_text(double bytes) {
  std::ostringstream out;
  out << std::setprecision(3) << bytes / (1 << 20) << " MiB";
  return out.str();
}

// The working set below which a hot memory-bound row's back-to-back calls may run from a cache, and in
// words how it was found: on a CPU where the copy's bandwidth fell to DRAM's in this machine's size
// sweep (Settings::cpu_cache_bytes), else twice the reported last-level cache (what cold mode's flush
// writes); on a GPU twice its L2. 0 when unknown.
struct CacheLimit {
  double bytes = 0;
  std::string how;
};
static CacheLimit cache_limit(const std::string& backend, const Settings& settings) {
  if (backend == "cuda" || backend == "torch_cuda") {  // PyTorch's rows on the GPU too
    for (const auto& g : cuda_status().devices)
      if (g.index == settings.cuda_device)
        return {2.0 * static_cast<double>(g.l2_bytes), "twice the GPU's " + mib_text(static_cast<double>(g.l2_bytes)) + " L2"};
    return {};
  }
  if (settings.cpu_cache_bytes > 0) return {settings.cpu_cache_bytes, settings.cpu_cache_how};
  const double l3 = static_cast<double>(host_info().l3_bytes);
  if (l3 <= 0) return {};
  return {2 * l3, "twice the " + mib_text(l3) + " last-level cache the CPU reports"};
}

nlohmann::json cache_thresholds_json(const Settings& settings) {
  nlohmann::json out = nlohmann::json::object();
  for (Backend b : settings.backends) {
    const CacheLimit limit = cache_limit(to_string(b), settings);
    if (limit.bytes > 0) out[to_string(b)] = {{"bytes", limit.bytes}, {"how", limit.how}};
  }
  return out;
}

// A peak row's own samples agree with the best figure of its work measured beside it in the run when
// they reach this share of it; below, the peak says what they reached.
constexpr double kPeakAgreement = 0.98;

// The measured DRAM bandwidths (STREAM copy and triad); transfers over PCIe are not cache-bound.
static bool is_dram_peak(const std::string& key) {
  auto ends_with = [&](const std::string& tail) {
    return key.size() > tail.size() && key.compare(key.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends_with(".copy") || ends_with(".triad");
}

// A hot memory-bound row whose working set is below twice the last-level cache (what cold mode's
// flush writes) may be served from that cache, so a DRAM peak is no ceiling for it.
static bool may_run_from_cache(const Row& r, const Settings& settings) {
  if (r.mode != "hot" || r.bound != "memory") return false;
  const double limit = cache_limit(r.backend, settings).bytes;
  return limit > 0 && r.footprint < limit;
}

// "95%", or "75-98%" when the rows' levels differ (their sample counts do).
static std::string level_range_text(std::vector<double> levels) {
  if (levels.empty()) return "";
  std::sort(levels.begin(), levels.end());
  auto pct = [](double v) {
    std::ostringstream out;
    out << std::setprecision(3) << 100 * v;
    return out.str();
  };
  const std::string lo = pct(levels.front()), hi = pct(levels.back());
  return (lo == hi ? lo : lo + "-" + hi) + "%";
}

std::string table_key(const Results& results, const Settings& settings) {
  std::vector<double> row_levels, pair_levels;
  bool noisy = false, disturbed = false, cache = false, above = false, dash = false;
  std::map<std::string, double> cache_threshold;  // "CPU rows, <how>": bytes, of the rows shown
  for (const auto& r : results.rows) {
    if (!r.timed()) continue;
    row_levels.push_back(r.summary.ci_level);
    noisy |= r.summary.noisy;
    disturbed |= r.disturbed;
    cache |= r.pct_note == "cache";
    above |= r.pct_note == "above peak";
    dash |= !r.pct_of_peak && r.pct_note.empty();
    const bool gpu = r.backend == "cuda" || r.backend == "torch_cuda";
    const CacheLimit limit = cache_limit(r.backend, settings);
    if (limit.bytes > 0) cache_threshold[(gpu ? "GPU rows, " : "CPU rows, ") + limit.how] = limit.bytes;
  }
  for (const auto& p : results.pairs) pair_levels.push_back(p.ratio.ci_level);
  std::ostringstream out;
  out << "\nKey:\n";
  if (!results.pairs.empty() || !results.withheld_pairs.empty())
    out << "  Pairs (above): read them first. Each is baseline time / improved time with its confidence interval"
        << (pair_levels.empty() ? "" : " (level " + level_range_text(pair_levels) + ")")
        << ": what the faster variant buys on this machine.\n";
  out << "  median: of the " << (settings.max_time_s > 0 ? "up to " : "") << settings.repetitions << " samples per row (each sample " << settings.min_time_s
      << " s or more; fast calls batched).\n";
  if (!row_levels.empty())
    out << "  +-CI: half-width of the median's distribution-free confidence interval, in % of the median; its level in "
           "this run: "
        << level_range_text(row_levels) << " (set by the samples per row: --quick's 3 give 75% for a row and 90% for a pair, "
        << "10 give 98% and 95%).\n";
  out << "  (noisy): +-CI above the noise target (" << 100 * settings.noise_target
      << "%, --noise-target): run it with more --repetitions before trusting it" << (noisy ? "" : " (none in this run)") << ".\n";
  if (disturbed)
    out << "  (disturbed): other processes held the CPUs (or the GPU throttled) while it ran, and taking its samples "
           "again did not help; its pairs are withheld.\n";
  out << "  rate: GB/s (memory-bound rows) or GFLOP/s, TFLOP/s (compute-bound), from the stage's work model; "
         "% peak: of the peak this run measured (listed under the table).\n";
  out << "  cache: a hot memory-bound row whose working set is below where the cache ends (CPU: where a copy's "
         "bandwidth falls to DRAM's in a size sweep of this machine; GPU: twice its L2), so it may run from the "
         "cache and a DRAM peak is no ceiling for it";
  if (!cache_threshold.empty()) {
    out << " (here:";
    bool first = true;
    for (const auto& [what, bytes] : cache_threshold) {
      out << (first ? " " : "; ") << "below " << mib_text(bytes) << " for " << what;
      first = false;
    }
    out << ")";
  }
  out << "; --cold measures any size from DRAM" << (cache ? "" : " (none in this run)") << ".\n";
  out << "  above peak: faster than the peak it is compared with (that peak is low, or the data is cached)"
      << (above ? "" : " (none in this run)") << ".\n";
  out << "  -: no % peak applies (a peak row itself, or a row with no peak of its kind measured)"
      << (dash ? "" : " (none in this run)") << ".\n";
  if (settings.max_time_s > 0)
    out << "  (cut short): --max-time " << settings.max_time_s
        << " s ended its measurement with fewer samples than --repetitions; its interval is wider.\n";
  return out.str();
}

std::string table_key_help() {
  return "Reading the table (a key is printed under it):\n"
         "  Pairs: baseline time / improved time with its confidence interval: the answer to read first.\n"
         "  +-CI: half-width of the median's distribution-free confidence interval, in % of the median. Its level\n"
         "        depends on the samples per row: 98% with the default 10 (pairs 95%), 75% with --quick's 3 (pairs 90%).\n"
         "  (noisy): +-CI above --noise-target (5%): run with more --repetitions.\n"
         "  cache: a hot memory-bound row whose working set is below where the cache ends (CPU: where a copy's\n"
         "        bandwidth falls to DRAM's in a size sweep, kept per machine; GPU: twice its L2): it may run from\n"
         "        the cache, so a DRAM peak is no ceiling for it (--cold measures from DRAM).\n"
         "  above peak: faster than the measured peak it is compared with.\n"
         "  -: no % peak applies (a peak row itself, or no peak of its kind measured).\n";
}

static const double* find_counter(const Row& r, const std::string& key) {
  for (const auto& [k, v] : r.counters)
    if (k == key) return &v;
  return nullptr;
}

// A time in ms as the pair's reasons show it.
static std::string ms_text(double ms) {
  std::ostringstream out;
  out << std::setprecision(3) << ms << " ms";
  return out.str();
}

// The pair's row: the ratio of the timed regions, or, when the improved variant moved a cost out of
// its timed region, the amortised ratio baseline / (improved + that cost per call), its interval
// from the samples with the cost added to each (the cost is one measurement: its own spread is not
// in the interval). Null, with `why`, when no ratio would be an answer: a side that moves nothing
// in its timed region compared by that time alone, or an amortised cost the row does not report.
std::optional<PairRow> compare_pair(const Pair& pair, const Row& baseline, const Row& improved, std::string& why) {
  PairRow out{improved.stage, pair.label, baseline.name, improved.name};
  // Sides measured in the same rounds: the ratio of each round's two samples, so that a drift of the
  // machine that slowed both within a round cancels; sides measured apart: of the two sample sets.
  const bool paired = std::find(baseline.interleaved_with.begin(), baseline.interleaved_with.end(), improved.name) !=
                      baseline.interleaved_with.end();
  auto ratio_of = [&](const std::vector<double>& b, const std::vector<double>& i, int& rounds) {
    if (!paired) return ratio_estimate(b, i);
    rounds = static_cast<int>(std::min(b.size(), i.size()));
    return paired_ratio_estimate(b, i);
  };
  out.baseline_ns = baseline.summary.median;
  out.improved_ns = improved.summary.median;
  const std::string nothing = " moves nothing in its timed region (no bytes, no FLOPs)";
  if (baseline.moves_nothing()) {
    why = baseline.name + nothing + ": it is no baseline to divide by";
    return std::nullopt;
  }
  if (pair.moved_out.declared()) {
    const MovedOutCost& declared = pair.moved_out;
    const double* per_call_ms = find_counter(improved, declared.ms_per_call);
    if (!per_call_ms || !std::isfinite(*per_call_ms) || *per_call_ms < 0) {
      why = improved.name + " does not report its " + declared.what + " (counter " + declared.ms_per_call +
            "): its timed region alone is not its cost";
      return std::nullopt;
    }
    if (*per_call_ms == 0 && improved.moves_nothing()) {
      why = improved.name + nothing + " and pays nothing per " + (declared.call.empty() ? "call" : declared.call) +
            " outside it (" + declared.ms_per_call + " = 0): it saves the baseline's " +
            ms_text(baseline.summary.median * 1e-6) + " whole, which is no ratio";
      return std::nullopt;
    }
    const double moved_ns = *per_call_ms * 1e6;
    const double* each_ms = declared.ms_each.empty() ? nullptr : find_counter(improved, declared.ms_each);
    std::vector<double> amortised = improved.samples_ns;
    for (double& t : amortised) t += moved_ns;
    out.kind = "amortised";
    out.ratio = ratio_of(baseline.samples_ns, amortised, out.rounds);
    out.moved_out = MovedOut{declared.what,      declared.ms_per_call, moved_ns, each_ms ? *each_ms * 1e6 : 0.0,
                             declared.paid_per, declared.call};
  } else if (improved.moves_nothing()) {
    why = improved.name + nothing + " and the pair names no cost moved out of it: a ratio of its time would "
                              "divide the baseline's work by no work";
    return std::nullopt;
  } else {
    out.ratio = ratio_of(baseline.samples_ns, improved.samples_ns, out.rounds);
  }
  if (!pair.predicted_ns.empty())
    if (const double* predicted = find_counter(improved, pair.predicted_ns); predicted && *predicted > 0)
      out.predicted = Prediction{pair.predicted_ns, *predicted, baseline.summary.median / *predicted};
  return out;
}

void judge_pair(const Pair& pair, const Row& baseline, const Row& improved, Results& results) {
  if (baseline.disturbed || improved.disturbed) {
    const Row& d = improved.disturbed ? improved : baseline;
    results.withheld_pairs.push_back(WithheldPair{improved.stage, pair.label, baseline.name, improved.name,
                                                  d.name + " was disturbed: " + disturbance_text(d) +
                                                      " during its samples"});
    return;
  }
  std::string why;
  if (auto row = compare_pair(pair, baseline, improved, why)) results.pairs.push_back(std::move(*row));
  else results.withheld_pairs.push_back(WithheldPair{improved.stage, pair.label, baseline.name, improved.name, why});
}

// % of peak only where the peak is a ceiling, so that no row can claim more than 100%.
void attach_pct_of_peak(const Settings& settings, Results& results) {
  for (auto& r : results.rows) {
    if (!r.timed() || r.peak_key.empty()) continue;
    if (is_dram_peak(r.peak_key) && may_run_from_cache(r, settings)) {
      r.pct_note = "cache";
      continue;
    }
    const auto it = results.peaks.find(r.peak_key);
    if (it == results.peaks.end() || it->second.value <= 0) continue;
    const double pct = 100.0 * r.rate() / it->second.value;
    if (pct > 100.0) r.pct_note = "above peak";
    else r.pct_of_peak = pct;
  }
}

void finish_results(const Registry& registry, const Settings& settings, Results& results) {
  std::map<std::string, const Row*> by_name;
  for (auto& r : results.rows) {
    if (r.timed()) r.summary = summarize(r.samples_ns, settings.noise_target);
    by_name[r.name] = &r;
  }
  // A counter "X_per_call" (samples per call) gets its rate "X_per_s" from the row's median time,
  // unless the timed region does no work: samples "delivered" by a pointer bump are no rate.
  for (auto& r : results.rows) {
    if (!r.timed() || r.summary.median <= 0 || r.moves_nothing()) continue;
    std::vector<std::pair<std::string, double>> rates;
    for (const auto& [key, value] : r.counters) {
      const std::string suffix = "_per_call";
      if (key.size() > suffix.size() && key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0)
        rates.emplace_back(key.substr(0, key.size() - suffix.size()) + "_per_s", value / (r.summary.median * 1e-9));
    }
    for (auto& rate : rates) {
      const auto same = std::find_if(r.counters.begin(), r.counters.end(), [&](const auto& c) { return c.first == rate.first; });
      if (same == r.counters.end()) r.counters.push_back(std::move(rate));
    }
  }
  // Peaks: the fastest sample each peak variant reached in this run. A ceiling is what the machine
  // can do; interference only ever slows a sample down, so the median would understate it.
  // A DRAM peak measured on data that fits in the cache is the cache's bandwidth: not a ceiling.
  // Figures of the same work measured beside the peak row in this run count too: the fastest call of
  // the row's own search (its counter search_best_ns) and the fastest sample of a row of the same stage
  // doing the same work another way (the triad on one thread). The peak is the best of them; when that
  // is not the row's own samples by more than kPeakAgreement, the peak says what its samples reached.
  std::map<std::string, double> own_samples;                  // by peak key: its rows' fastest sample
  std::map<std::string, std::vector<const Row*>> peak_rows;    // by peak key: the rows that provide it
  auto rate_at = [](const Row& r, double ns) { return (r.bound == "compute" ? r.flops : r.bytes) / (ns * 1e-9); };
  auto offer = [&](const std::string& key, double rate, const Row& r, const std::string& configuration) {
    PeakValue& peak = results.peaks[key];
    if (rate > peak.value) peak = PeakValue{rate, r.bound == "compute" ? "FLOP/s" : "B/s", r.name, configuration};
  };
  // Rows of other backends (PyTorch's: torch_rows.h) set no peak and join none of the registry's pairs.
  const auto registry_row = [](const Row& r) { return r.backend == "cpu" || r.backend == "cuda"; };
  for (auto& r : results.rows) {
    if (!r.timed() || !registry_row(r)) continue;
    const Stage* stage = registry.find(r.stage);
    const Variant* v = stage ? stage->find_variant(r.variant, backend_from_string(r.backend)) : nullptr;
    if (!v || v->provides_peak.empty()) continue;
    if (is_dram_peak(v->provides_peak) && may_run_from_cache(r, settings)) {
      r.pct_note = "cache";
      continue;
    }
    const double rate = rate_at(r, *std::min_element(r.samples_ns.begin(), r.samples_ns.end()));
    own_samples[v->provides_peak] = std::max(own_samples[v->provides_peak], rate);
    offer(v->provides_peak, rate, r, r.configuration);
    if (const double* search_ns = find_counter(r, "search_best_ns"); search_ns && *search_ns > 0)
      offer(v->provides_peak, rate_at(r, *search_ns), r,
            (r.configuration.empty() ? std::string("its search") : r.configuration) + ", the fastest call of its search");
    peak_rows[v->provides_peak].push_back(&r);
  }
  for (const auto& r : results.rows) {
    const auto providers = peak_rows.find(r.peak_key);
    if (!r.timed() || !registry_row(r) || providers == peak_rows.end() || may_run_from_cache(r, settings)) continue;
    const bool same_work = std::any_of(providers->second.begin(), providers->second.end(), [&](const Row* p) {
      return p->stage == r.stage && p->bytes == r.bytes && p->flops == r.flops;
    });
    if (same_work) offer(r.peak_key, rate_at(r, *std::min_element(r.samples_ns.begin(), r.samples_ns.end())), r, r.variant);
  }
  for (auto& [key, peak] : results.peaks) {
    const double own = own_samples[key];
    peak.own_samples_value = own > 0 && own < kPeakAgreement * peak.value ? own : 0;
  }
  attach_pct_of_peak(settings, results);
  // Pairs: at every problem both variants ran at on the same backend.
  for (const auto& r : results.rows) {
    if (!r.timed() || !registry_row(r)) continue;
    const Stage* stage = registry.find(r.stage);
    if (!stage) continue;
    for (const auto& pair : stage->pairs) {
      if (pair.improved != r.variant) continue;
      const std::string baseline_name =
          pair_baseline_name(*stage, pair, r, [&](const std::string& name) { return by_name.count(name) > 0; });
      const auto it = by_name.find(baseline_name);
      if (it == by_name.end() || !it->second->timed()) continue;
      judge_pair(pair, *it->second, r, results);
    }
  }
}

int exit_code_for(const Results& results) {
  for (const auto& r : results.rows)
    if (r.disposition == Disposition::incorrect || r.disposition == Disposition::failed) return 1;
  return 0;
}

}  // namespace tb

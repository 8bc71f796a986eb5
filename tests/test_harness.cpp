// The harness end to end on a synthetic stage: check before timing, dispositions, samples, peaks,
// pairs and the exit code. Real Google Benchmark, real timer, tiny work. Then the rows and pairs that
// must not lie: a timed region that moves nothing gets no rate, and its pairs are amortised with the
// cost it moved out of the loop or not reported at all.
#include <benchmark/benchmark.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <map>
#include <sstream>
#include <thread>
#include <utility>

#include "cache_threshold.h"
#include "harness.h"
#include "runtime/cpu_load.h"
#include "runtime/device_info.h"
#include "runtime/error.h"
#include "time_estimate.h"

namespace tb {
namespace {

std::atomic<int> wrong_runs{0};

// Spins over `work` additions: a CPU "kernel" whose time scales with its size.
class Spin final : public Instance {
 public:
  Spin(int64_t work, bool correct, std::atomic<int>* runs = nullptr) : work_(work), correct_(correct), runs_(runs) {}
  void run() override {
    if (runs_) ++*runs_;
    double acc = 0;
    for (int64_t i = 0; i < work_; ++i) acc += 1.0;
    result_ = acc;
  }
  Verdict check() override {
    const double want = static_cast<double>(work_);
    const double got = correct_ ? result_ : result_ + 1;
    return got == want ? Verdict{true, 0, ""} : Verdict{false, 1, "sum is " + std::to_string(got)};
  }
  std::vector<std::pair<std::string, double>> observed() const override {
    return {{"last_sum", result_}, {"items_per_call", 1000.0}};
  }

 private:
  int64_t work_;
  bool correct_;
  std::atomic<int>* runs_;
  volatile double result_ = 0;
};

Variant spin_variant(const std::string& id, int64_t scale, bool correct, std::string peak_key, std::string provides = "") {
  Variant v;
  v.id = id;
  v.backend = Backend::cpu;
  v.rationale = "test";
  v.axes = {"n"};
  v.work = [peak_key](const Problem& p) { return Work{8.0 * p.get_int("n"), 0, Work::Bound::memory, peak_key, {}}; };
  v.make = [scale, correct, id](const Problem& p, const RunContext&) -> std::unique_ptr<Instance> {
    return std::make_unique<Spin>(p.get_int("n") * scale, correct, id == "wrong" ? &wrong_runs : nullptr);
  };
  v.provides_peak = std::move(provides);
  return v;
}

Registry toy_registry() {
  Registry r;
  Stage peak;
  peak.name = "peak";
  peak.question = peak.source = "test";
  peak.axes = {Axis{"n", AxisKind::positive_int, {"20000"}, {}, "", {}}};
  peak.variants = {spin_variant("ceiling", 1, true, "cpu.toy", "cpu.toy")};
  r.add(peak);

  Stage s;
  s.name = "toy";
  s.question = s.source = "test";
  s.axes = {Axis{"n", AxisKind::positive_int, {"20000"}, {}, "", {}}};
  s.variants = {spin_variant("slow", 8, true, "cpu.toy"), spin_variant("fast", 1, true, "cpu.toy"),
                spin_variant("wrong", 1, false, "cpu.toy")};
  Variant throws = spin_variant("throws", 1, true, "");
  throws.make = [](const Problem&, const RunContext&) -> std::unique_ptr<Instance> {
    throw CallError("toy.cpp", 1, "toyMalloc(...)", "out of toys");
  };
  Variant huge = spin_variant("huge", 1, true, "");
  huge.unsupported = [](const Problem&) { return std::string("needs more toys than this machine has"); };
  s.variants.push_back(throws);
  s.variants.push_back(huge);
  s.pairs = {Pair{"slow", "fast", "fast vs slow"}};
  r.add(s);
  return r;
}

class Harness : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    static char name[] = "test_harness";
    char* argv[] = {name, nullptr};
    int argc = 1;
    benchmark::Initialize(&argc, argv);
  }
  static Settings quick_settings(const std::string& filter) {
    Settings s;
    s.repetitions = 5;
    s.min_time_s = 0.002;
    s.filter = filter;
    return s;
  }
  static const Row& row(const Results& r, const std::string& name) {
    for (const auto& row : r.rows)
      if (row.name == name) return row;
    throw std::runtime_error("no row " + name);
  }
};

TEST_F(Harness, ChecksBeforeTimingAndGivesEveryRowADisposition) {
  const Registry reg = toy_registry();
  const Settings settings = quick_settings("");
  std::ostringstream progress;
  wrong_runs = 0;
  const Results results = run_entries(reg, select_entries(reg, settings), settings, progress);

  const Row& slow = row(results, "toy/cpu/slow/n=20000");
  const Row& fast = row(results, "toy/cpu/fast/n=20000");
  EXPECT_EQ(slow.disposition, Disposition::passed);
  EXPECT_EQ(fast.disposition, Disposition::passed);
  EXPECT_EQ(slow.samples_ns.size(), 5u);
  EXPECT_GT(slow.summary.median, fast.summary.median);
  ASSERT_EQ(fast.counters.size(), 3u);
  EXPECT_EQ(fast.counters[0], (std::pair<std::string, double>{"last_sum", 20000.0}));
  EXPECT_EQ(fast.counters[2].first, "items_per_s");  // derived from items_per_call and the median
  EXPECT_DOUBLE_EQ(fast.counters[2].second, 1000.0 / (fast.summary.median * 1e-9));
  // The ceiling runs the same work as `fast`: a %, or, when noise made `fast`'s median beat the
  // ceiling's best sample, "above peak" (no row may read above 100%). How far below 100% it reads is
  // the machine's load (the ceiling was measured earlier, alone): no verdict of this test.
  ASSERT_EQ(results.peaks.count("cpu.toy"), 1u);
  ASSERT_TRUE(slow.pct_of_peak.has_value());  // 8 times the work: far below the ceiling
  if (fast.pct_of_peak) {
    EXPECT_GT(*fast.pct_of_peak, 0.0);
    EXPECT_LE(*fast.pct_of_peak, 100.0);
    EXPECT_LT(*slow.pct_of_peak, *fast.pct_of_peak);  // measured in the same rounds: 8x the work
  } else {
    EXPECT_EQ(fast.pct_note, "above peak");
  }

  const Row& wrong = row(results, "toy/cpu/wrong/n=20000");
  EXPECT_EQ(wrong.disposition, Disposition::incorrect);
  EXPECT_NE(wrong.reason.find("sum is"), std::string::npos);
  EXPECT_TRUE(wrong.samples_ns.empty());
  EXPECT_FALSE(wrong.timed());
  EXPECT_EQ(wrong_runs.load(), 1) << "an incorrect variant must not be timed";

  const Row& throws = row(results, "toy/cpu/throws/n=20000");
  EXPECT_EQ(throws.disposition, Disposition::failed);
  EXPECT_NE(throws.reason.find("out of toys"), std::string::npos);

  const Row& huge = row(results, "toy/cpu/huge/n=20000");
  EXPECT_EQ(huge.disposition, Disposition::unsupported);
  EXPECT_EQ(huge.reason, "needs more toys than this machine has");

  ASSERT_EQ(results.pairs.size(), 1u);
  EXPECT_EQ(results.pairs[0].baseline, "toy/cpu/slow/n=20000");
  EXPECT_GT(results.pairs[0].ratio.ratio, 2.0);  // 8x the work
  EXPECT_EQ(results.peaks.count("cpu.toy"), 1u);
  EXPECT_EQ(exit_code_for(results), 1);
  EXPECT_NE(progress.str().find("incorrect"), std::string::npos);
}

// Every row that was set up tells what it took, once, when its measurement is over: the announced time
// of the next run is made of these.
TEST_F(Harness, EachRowSetUpTellsItsSetUpAndMeasuringOnce) {
  const Registry reg = toy_registry();
  Settings settings = quick_settings("toy/cpu/(slow|fast|wrong)");
  std::map<std::string, std::pair<double, double>> told;
  int calls = 0;
  settings.on_row_done = [&](const Entry& e, double setup_s, double measure_s) {
    ++calls;
    told[e.name] = {setup_s, measure_s};
  };
  std::ostringstream progress;
  const Results results = run_entries(reg, select_entries(reg, settings), settings, progress);
  for (const char* name : {"toy/cpu/slow/n=20000", "toy/cpu/fast/n=20000"}) {
    ASSERT_TRUE(told.count(name)) << name;
    EXPECT_GT(told[name].first, 0.0) << name;
    EXPECT_GT(told[name].second, 0.0) << name;
  }
  // The incorrect row was never measured: nothing of it is kept. The peak row was measured too.
  EXPECT_FALSE(told.count("toy/cpu/wrong/n=20000"));
  EXPECT_EQ(calls, static_cast<int>(told.size()));
}

TEST_F(Harness, MeasuresTheNeededPeakFirstWhenTheFilterLeavesItOut) {
  const Registry reg = toy_registry();
  const auto entries = select_entries(reg, quick_settings("toy/cpu/fast"));
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].name, "peak/cpu/ceiling/n=20000");
  Settings no_prepass = quick_settings("toy/cpu/fast");
  no_prepass.peak_prepass = false;
  EXPECT_EQ(select_entries(reg, no_prepass).size(), 1u);

  std::ostringstream progress;
  const Results results = run_entries(reg, entries, quick_settings("toy/cpu/fast"), progress);
  EXPECT_EQ(exit_code_for(results), 0);
  ASSERT_EQ(results.peaks.count("cpu.toy"), 1u);  // measured first, though the filter left it out
  const Row& fast = row(results, "toy/cpu/fast/n=20000");
  EXPECT_TRUE(fast.pct_of_peak.has_value() || fast.pct_note == "above peak") << fast.pct_note;
}

TEST_F(Harness, FilterErrorsAreUsageErrorsThatSayWhatExists) {
  const Registry reg = toy_registry();
  try {
    select_entries(reg, quick_settings("nothing-like-this"));
    FAIL() << "expected a UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("cpu/slow"), std::string::npos) << e.what();
  }
  EXPECT_THROW(select_entries(reg, quick_settings("(")), UsageError);
}

// A GPU-only stage on a machine that cannot run it: the filter is not bad usage, the rows say why.
TEST_F(Harness, FilterMatchingOnlyUnavailableVariantsListsThemWithTheReason) {
  Registry reg = toy_registry();
  Stage gpu_only;
  gpu_only.name = "gpuonly";
  gpu_only.question = gpu_only.source = "test";
  gpu_only.axes = {Axis{"n", AxisKind::positive_int, {"20000"}, {}, "", {}}};
  Variant v = spin_variant("kernel", 1, true, "");
  v.backend = Backend::cuda;
  v.make = nullptr;  // not built: unavailable on every machine
  gpu_only.variants = {v};
  reg.add(gpu_only);
  Settings settings = quick_settings("gpuonly");  // backends: cpu only
  const auto entries = select_entries(reg, settings);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].name, "gpuonly/cuda/kernel/n=20000");
  EXPECT_FALSE(entries[0].unsupported.empty());
  std::ostringstream progress;
  const Results results = run_entries(reg, entries, settings, progress);
  EXPECT_EQ(row(results, "gpuonly/cuda/kernel/n=20000").disposition, Disposition::unsupported);
  EXPECT_EQ(exit_code_for(results), 0);
  EXPECT_NE(progress.str().find("unsupported"), std::string::npos) << progress.str();
  // A filter that matches nothing anywhere is still bad usage.
  EXPECT_THROW(select_entries(reg, quick_settings("gpuonly/cuda/nothing")), UsageError);
}

// The share of the CPUs others used: busy ticks that were not this process's, over all ticks.
// A stop request (SIGTERM) in the middle of a run, asked for by a slow variant's own call: one call of
// at least a millisecond, so that its row's calls are countable whatever the machine's speed. The
// warm-up makes at most about 22 of them (it ends once 20 ms were spent), a row at least one a sample.
std::atomic<int> sleeper_calls{0};
int sleeper_stop_at = 0;  // the call that asks for the stop; 0: none

class Sleeper final : public Instance {
 public:
  void run() override {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (++sleeper_calls == sleeper_stop_at) request_stop(SIGTERM);
  }
  Verdict check() override { return Verdict{true, 0, ""}; }
};

Registry stop_registry() {
  Registry r;
  Stage s;
  s.name = "stoptoy";
  s.question = s.source = "test";
  s.axes = {Axis{"n", AxisKind::positive_int, {"2000"}, {}, "", {}}};
  Variant sleeper = spin_variant("sleeper", 1, true, "");
  sleeper.make = [](const Problem&, const RunContext&) -> std::unique_ptr<Instance> { return std::make_unique<Sleeper>(); };
  s.variants = {spin_variant("before", 1, true, ""), sleeper, spin_variant("after", 1, true, "")};
  r.add(s);
  return r;
}

class Stop : public Harness {
 protected:
  void SetUp() override {
    clear_stop_request();
    sleeper_calls = 0;
  }
  void TearDown() override {
    clear_stop_request();
    sleeper_stop_at = 0;
  }
  Results run_until_stop(int stop_at, std::ostringstream& progress) {
    Settings settings = quick_settings("stoptoy");
    settings.repetitions = 100;  // the sleeper's row cannot end before its 40th call
    settings.min_time_s = 0.005;
    settings.progress_every_s = 0;  // a progress line after every sample
    sleeper_stop_at = stop_at;
    return run_entries(stop_registry(), select_entries(stop_registry(), settings), settings, progress);
  }
};

TEST_F(Stop, AStopInARowEndsItAtOnceAndKeepsItsSamplesAndEveryFinishedRow) {
  std::ostringstream progress;
  const Results results = run_until_stop(40, progress);  // past the warm-up: while the row measures
  ASSERT_TRUE(stop_requested());
  EXPECT_EQ(stop_signal(), SIGTERM);
  // No call after the one that asked: the stop is heard between calls.
  EXPECT_EQ(sleeper_calls.load(), 40);

  const Row& before = row(results, "stoptoy/cpu/before/n=2000");
  EXPECT_EQ(before.disposition, Disposition::passed);
  EXPECT_EQ(before.samples_ns.size(), 100u);
  EXPECT_TRUE(before.interrupted.empty());

  const Row& sleeper = row(results, "stoptoy/cpu/sleeper/n=2000");
  EXPECT_EQ(sleeper.disposition, Disposition::passed);
  ASSERT_TRUE(sleeper.timed());
  EXPECT_LT(sleeper.samples_ns.size(), 100u);
  EXPECT_EQ(sleeper.interrupted, "SIGTERM after " + std::to_string(sleeper.samples_ns.size()) + " of 100 samples");
  for (double ns : sleeper.samples_ns) EXPECT_GE(ns, 1e6);  // each a mean of whole calls of 1 ms or more
  EXPECT_FALSE(sleeper.summary.n == 0);

  const Row& after = row(results, "stoptoy/cpu/after/n=2000");
  EXPECT_EQ(after.disposition, Disposition::unsupported);
  EXPECT_EQ(after.reason, "not run: interrupted");

  // The run says it was stopped; nothing failed.
  EXPECT_EQ(results.context.value("interrupted", ""), "SIGTERM");
  EXPECT_EQ(exit_code_for(results), 0);
  // The file keeps all of it: the row in hand with its samples, marked.
  const nlohmann::json doc = to_json(results);
  bool marked = false;
  for (const auto& b : doc["benchmarks"])
    if (b["name"] == "stoptoy/cpu/sleeper/n=2000") {
      marked = true;
      EXPECT_EQ(b["disposition"], "passed");
      EXPECT_EQ(b["interrupted"], sleeper.interrupted);
      EXPECT_EQ(b["samples_ns"].size(), sleeper.samples_ns.size());
    } else {
      EXPECT_FALSE(b.contains("interrupted")) << b["name"];
    }
  EXPECT_TRUE(marked);
  EXPECT_EQ(doc["context"]["interrupted"], "SIGTERM");
  const Results back = results_from_json(doc);
  EXPECT_EQ(row(back, "stoptoy/cpu/sleeper/n=2000").interrupted, sleeper.interrupted);

  // A long row says how far it is while it measures, and the row's line says it was interrupted.
  const std::string said = progress.str();
  EXPECT_NE(said.find("stoptoy/cpu/sleeper/n=2000  sample 1/100"), std::string::npos) << said;
  EXPECT_NE(said.find("(interrupted: " + sleeper.interrupted + ")"), std::string::npos) << said;
}

TEST_F(Stop, AStopBeforeTheFirstSampleLeavesTheRowWithoutATime) {
  for (int stop_at : {1, 2}) {  // the first call (before the check), the first warm-up call
    SetUp();
    std::ostringstream progress;
    const Results results = run_until_stop(stop_at, progress);
    EXPECT_EQ(sleeper_calls.load(), stop_at) << "no call after the one that asked";
    const Row& sleeper = row(results, "stoptoy/cpu/sleeper/n=2000");
    EXPECT_EQ(sleeper.disposition, Disposition::unsupported);
    EXPECT_EQ(sleeper.reason, stop_at == 1 ? "not timed: interrupted before its check against the reference"
                                           : "not timed: interrupted during its warm-up (its check passed)");
    EXPECT_FALSE(sleeper.timed());
    EXPECT_EQ(row(results, "stoptoy/cpu/before/n=2000").disposition, Disposition::passed);
    EXPECT_EQ(row(results, "stoptoy/cpu/after/n=2000").reason, "not run: interrupted");
    EXPECT_EQ(exit_code_for(results), 0);
  }
}

TEST(CpuLoad, OthersShareIsTheBusyTimeThatWasNotOurs) {
  const CpuTicks before{1000, 100, 50, true}, after{1100, 180, 100, true};
  EXPECT_DOUBLE_EQ(others_share(before, after), 0.3);
  EXPECT_DOUBLE_EQ(others_share(before, CpuTicks{1100, 150, 100, true}), 0.0);  // all of it ours
  EXPECT_EQ(others_share(before, CpuTicks{1004, 104, 52, true}), -1.0);         // too few ticks to tell
  EXPECT_EQ(others_share(CpuTicks{}, after), -1.0);                             // /proc unreadable
  const CpuTicks now = read_cpu_ticks();
  EXPECT_TRUE(now.valid);
  EXPECT_GE(now.total, now.busy);
}

// Another process's CPU time (a PyTorch row's script: its time is the measurement, not a disturbance).
TEST(CpuLoad, AnotherProcesssTimeIsReadByItsId) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(60);                                 // never outlives a test that died
    while (process_cpu_ticks(getpid()) < 5) {  // spins until its own /proc entry shows 5 ticks
    }
    for (;;) pause();
  }
  uint64_t ticks = 0;
  for (int waited = 0; waited < 5000 && ticks < 5; waited += 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ticks = process_cpu_ticks(child);
  }
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_GE(ticks, 5u);
  EXPECT_EQ(process_cpu_ticks(child), 0u);  // gone: nothing to read
}

// A memory-bound row gets a % of a DRAM peak only when that peak is a ceiling for it: not when its
// working set fits in the last-level cache (hot), and never above 100%.
Row timed_row(const std::string& name, const std::string& stage, const std::string& variant, double bytes, double footprint,
              double ns) {
  Row r;
  r.name = name;
  r.stage = stage;
  r.variant = variant;
  r.backend = "cpu";
  r.disposition = Disposition::passed;
  r.samples_ns = {ns, ns, ns};
  r.bytes = bytes;
  r.footprint = footprint;
  return r;
}

TEST(PercentOfPeak, NeverAboveTheCeilingAndNotForCacheResidentRows) {
  const double llc = static_cast<double>(host_info().l3_bytes);
  ASSERT_GT(llc, 0);
  const double big = 8 * llc;  // DRAM-sized: a working set far above the cache
  Results results;
  // The triad peak: 1e9 bytes per ms = 1e12 B/s.
  Row peak = timed_row("peak/cpu/triad/n=big", "peak", "triad", 1e9, big, 1e6);
  Row dram = timed_row("adamw/cpu/fused/a", "adamw", "fused", 5e8, big, 1e6);        // half the peak
  Row cached = timed_row("adamw/cpu/fused/b", "adamw", "fused", 5e8, llc / 4, 1e6);  // fits in the cache
  Row faster = timed_row("adamw/cpu/fused/c", "adamw", "fused", 3e9, big, 1e6);      // 3x the peak
  for (Row* r : {&dram, &cached, &faster}) r->peak_key = "cpu.triad";
  results.rows = {peak, dram, cached, faster};
  Settings settings;
  finish_results(builtin_registry(), settings, results);
  ASSERT_EQ(results.peaks.count("cpu.triad"), 1u);
  EXPECT_DOUBLE_EQ(results.peaks["cpu.triad"].value, 1e12);
  ASSERT_TRUE(results.rows[1].pct_of_peak.has_value());
  EXPECT_NEAR(*results.rows[1].pct_of_peak, 50.0, 1e-9);
  EXPECT_FALSE(results.rows[2].pct_of_peak.has_value());
  EXPECT_EQ(results.rows[2].pct_note, "cache");
  EXPECT_FALSE(results.rows[3].pct_of_peak.has_value());
  EXPECT_EQ(results.rows[3].pct_note, "above peak");
  for (const auto& r : results.rows) {
    if (r.pct_of_peak) {
      EXPECT_LE(*r.pct_of_peak, 100.0) << r.name;
    }
  }

  // Cold mode flushes the cache before each call: the same small row is compared with DRAM.
  Results cold;
  Row cold_cached = cached;
  cold_cached.mode = "cold";
  cold.rows = {peak, cold_cached};
  finish_results(builtin_registry(), settings, cold);
  ASSERT_TRUE(cold.rows[1].pct_of_peak.has_value());
  EXPECT_NEAR(*cold.rows[1].pct_of_peak, 50.0, 1e-9);

  // A peak measured on cache-resident data is the cache's bandwidth: no ceiling, so no % at all.
  Results small;
  small.rows = {timed_row("peak/cpu/triad/n=small", "peak", "triad", 1e9, llc / 4, 1e6), dram};
  finish_results(builtin_registry(), settings, small);
  EXPECT_EQ(small.peaks.count("cpu.triad"), 0u);
  EXPECT_EQ(small.rows[0].pct_note, "cache");
  EXPECT_FALSE(small.rows[1].pct_of_peak.has_value());
}

// The CPU's memory ceiling (the best of the stages' access mixes) and the CPU all-reduce's link (MPI
// reduces in host memory) are DRAM figures too: a row whose buffers fit in the cache is not % of them.
TEST(PercentOfPeak, TheMemoryCeilingAndTheCpuAllReduceLinkAreDramPeaks) {
  const double llc = static_cast<double>(host_info().l3_bytes);
  ASSERT_GT(llc, 0);
  const double big = 8 * llc;
  Settings settings;
  Results results;
  Row memory = timed_row("peak/cpu/memory/n=big", "peak", "memory", 1e9, big, 1e6);
  Row link = timed_row("allreduce/cpu/link/link_mb=big", "allreduce", "link", 1e9, big, 1e6);
  Row adamw = timed_row("adamw/cpu/fused/small", "adamw", "fused", 3e9, llc / 4, 1e6);
  Row bucketed = timed_row("allreduce/cpu/bucketed/small", "allreduce", "bucketed", 3e9, llc / 4, 1e6);
  Row flat = timed_row("allreduce/cpu/flat/big", "allreduce", "flat", 5e8, big, 1e6);
  adamw.peak_key = "cpu.memory";
  bucketed.peak_key = flat.peak_key = "cpu.allreduce";
  results.rows = {memory, link, adamw, bucketed, flat};
  finish_results(builtin_registry(), settings, results);
  EXPECT_DOUBLE_EQ(results.peaks["cpu.memory"].value, 1e12);
  EXPECT_DOUBLE_EQ(results.peaks["cpu.allreduce"].value, 1e12);
  EXPECT_EQ(results.rows[2].pct_note, "cache") << "3x the ceiling, from the cache";
  EXPECT_EQ(results.rows[3].pct_note, "cache") << "3x the link, from the cache";
  ASSERT_TRUE(results.rows[4].pct_of_peak.has_value());
  EXPECT_NEAR(*results.rows[4].pct_of_peak, 50.0, 1e-9);
}

// The CPU's threshold is where a copy's bandwidth fell in this machine's sweep when the run has one
// (Settings::cpu_cache_bytes), not the cache size the CPU reports, and the key says which it used.
TEST(PercentOfPeak, TheSweptThresholdDecidesWhatIsCacheResident) {
  const double mib = 1 << 20, huge = 64 * std::max(static_cast<double>(host_info().l3_bytes), 64 * mib);
  Settings settings;
  settings.cpu_cache_bytes = 32 * mib;
  settings.cpu_cache_how = "where a copy's bandwidth fell to DRAM's in this machine's size sweep (test)";
  Results results;
  Row peak = timed_row("peak/cpu/triad/n=big", "peak", "triad", 1e9, huge, 1e6);
  Row below = timed_row("adamw/cpu/fused/a", "adamw", "fused", 5e8, 16 * mib, 1e6);
  Row above = timed_row("adamw/cpu/fused/b", "adamw", "fused", 5e8, 64 * mib, 1e6);
  for (Row* r : {&below, &above}) r->peak_key = "cpu.triad";
  results.rows = {peak, below, above};
  results.context["cache_thresholds"] = cache_thresholds_json(settings);
  finish_results(builtin_registry(), settings, results);
  EXPECT_EQ(results.rows[1].pct_note, "cache");
  ASSERT_TRUE(results.rows[2].pct_of_peak.has_value()) << "64 MiB is above the swept 32 MiB, whatever the L3 says";
  EXPECT_NEAR(*results.rows[2].pct_of_peak, 50.0, 1e-9);
  EXPECT_DOUBLE_EQ(results.context["cache_thresholds"]["cpu"]["bytes"].get<double>(), 32 * mib);
  const std::string key = table_key(results, settings);
  EXPECT_NE(key.find("below 32 MiB for CPU rows, " + settings.cpu_cache_how), std::string::npos) << key;
  // Beside the peaks: the threshold and how it was found.
  const std::string console = render(results, Format::console);
  EXPECT_NE(console.find("cache, cpu rows"), std::string::npos) << console;
  EXPECT_NE(console.find("below 32.0 MiB of working set: " + settings.cpu_cache_how), std::string::npos) << console;
}

// The kept sweep is this machine's only under its own key, in a file of the right kind.
TEST(CacheSweepFile, AKeptThresholdIsThisMachinesOnlyUnderItsKey) {
  const std::string key = cache_sweep_key();
  EXPECT_NE(key.find("c_"), std::string::npos) << key;  // CPUs, OpenMP threads and reported cache in it
  nlohmann::json file = {{"schema", "trainbench-cache-sweep/1"}};
  file["machines"]["another-cpu_64c_64omp_llc1"] = {{"threshold_bytes", 1e9}};
  EXPECT_EQ(kept_sweep(file, key), nullptr);
  file["machines"][key] = {{"threshold_bytes", 67108864.0}, {"measured", "2026-11-26"}};
  const nlohmann::json* entry = kept_sweep(file, key);
  ASSERT_NE(entry, nullptr);
  const CacheThreshold t = threshold_of(*entry, "/tmp/kept.json");
  EXPECT_DOUBLE_EQ(t.bytes, 67108864.0);
  EXPECT_EQ(t.how,
            "where a copy's bandwidth fell to DRAM's in this machine's size sweep (2026-11-26, kept in /tmp/kept.json)");
  file["schema"] = "something-else/1";
  EXPECT_EQ(kept_sweep(file, key), nullptr);
  EXPECT_EQ(kept_sweep(nlohmann::json::array(), key), nullptr);
}

// A peak is the best figure of its work this run measured: a peak row whose own samples were slowed
// (a fake: its samples at half the speed its search reached) does not set it, and the peak says so.
TEST(Peaks, AFasterFigureOfTheSameWorkMeasuredBesideASlowPeakRowSetsItAndFlagsTheRow) {
  const double huge = 64 * std::max(static_cast<double>(host_info().l3_bytes), double(1 << 26));
  Settings settings;
  auto triad_row = [&](double sample_ns, double search_ns) {
    Row r = timed_row("peak/cpu/triad/n=big", "peak", "triad", 1e9, huge, sample_ns);
    r.configuration = "OpenMP loop, 2 threads";
    r.counters = {{"search_best_ns", search_ns}};
    return r;
  };
  // Its samples: 1e9 bytes in 2 ms (5e11 B/s); the fastest call of its search: 1 ms (1e12 B/s).
  Results slow;
  slow.rows = {triad_row(2e6, 1e6)};
  finish_results(builtin_registry(), settings, slow);
  ASSERT_EQ(slow.peaks.count("cpu.triad"), 1u);
  const PeakValue& flagged = slow.peaks["cpu.triad"];
  EXPECT_DOUBLE_EQ(flagged.value, 1e12);
  EXPECT_EQ(flagged.configuration, "OpenMP loop, 2 threads, the fastest call of its search");
  EXPECT_DOUBLE_EQ(flagged.own_samples_value, 5e11);
  const std::string console = render(slow, Format::console);
  EXPECT_NE(console.find("the peak row's own samples reached only 0.500x"), std::string::npos) << console;
  EXPECT_DOUBLE_EQ(results_from_json(to_json(slow)).peaks["cpu.triad"].own_samples_value, 5e11);

  // The same work another way (the triad on one thread), faster than both: it sets the peak.
  Results beside;
  Row one_thread = timed_row("peak/cpu/triad_1thread/n=big", "peak", "triad_1thread", 1e9, huge, 0.8e6);
  one_thread.peak_key = "cpu.triad";
  beside.rows = {triad_row(2e6, 1e6), one_thread};
  finish_results(builtin_registry(), settings, beside);
  EXPECT_DOUBLE_EQ(beside.peaks["cpu.triad"].value, 1.25e12);
  EXPECT_EQ(beside.peaks["cpu.triad"].benchmark, one_thread.name);
  EXPECT_DOUBLE_EQ(beside.peaks["cpu.triad"].own_samples_value, 5e11);

  // Samples within 2% of the search's best agree: the peak is the better figure, unflagged.
  Results agree;
  agree.rows = {triad_row(1e6, 0.99e6)};
  finish_results(builtin_registry(), settings, agree);
  EXPECT_NEAR(agree.peaks["cpu.triad"].value, 1e9 / 0.99e-3, 1);
  EXPECT_EQ(agree.peaks["cpu.triad"].own_samples_value, 0.0);
  EXPECT_EQ(render(agree, Format::console).find("own samples reached only"), std::string::npos);
}

// A timed row of `ns` per call for compare_pair / finish_results: samples and their summary.
Row work_row(const std::string& stage, const std::string& variant, double bytes, double flops, double ns,
             std::vector<std::pair<std::string, double>> counters = {}) {
  Row r = timed_row(stage + "/cpu/" + variant + "/n=1", stage, variant, bytes, bytes, ns);
  r.flops = flops;
  r.counters = std::move(counters);
  r.summary = summarize(r.samples_ns, 0.05);
  return r;
}

// The line of a rendered table that starts with `name`, or "".
std::string line_of(const std::string& text, const std::string& name) {
  const std::size_t at = text.find(name);
  return at == std::string::npos ? std::string() : text.substr(at, text.find('\n', at) - at);
}

const MovedOutCost slab{"slab build", "slab_build_ms_per_batch", "slab_build_ms", "epoch", "batch"};

TEST(PairsThatCannotLie, AViewIsNeverDividedByItsTimedRegionAlone) {
  const Row copies = work_row("s", "per_sample", 1e6, 0, 100e3);  // 0.1 ms per batch
  std::string why;

  // No cost moved out named: no ratio, and the reason says why.
  const Row view = work_row("s", "prebatched", 0, 0, 10);
  EXPECT_FALSE(compare_pair(Pair{"per_sample", "prebatched", "view vs copies"}, copies, view, why));
  EXPECT_NE(why.find("moves nothing in its timed region"), std::string::npos) << why;

  // Named, but the row does not report it: no ratio either.
  why.clear();
  EXPECT_FALSE(compare_pair(Pair{"per_sample", "prebatched", "view vs copies", slab}, copies, view, why));
  EXPECT_NE(why.find("does not report its slab build"), std::string::npos) << why;

  // Reported: baseline / (view + slab build per batch), 0.1 / (10 ns + 0.2 ms) ~ 0.5x, never 1e4x.
  const Row built = work_row("s", "prebatched", 0, 0, 10, {{"slab_build_ms", 25.6}, {"slab_build_ms_per_batch", 0.2}});
  const auto amortised = compare_pair(Pair{"per_sample", "prebatched", "view vs copies", slab}, copies, built, why);
  ASSERT_TRUE(amortised) << why;
  EXPECT_EQ(amortised->kind, "amortised");
  EXPECT_DOUBLE_EQ(amortised->ratio.ratio, 100e3 / (10 + 0.2e6));
  ASSERT_TRUE(amortised->moved_out);
  EXPECT_EQ(amortised->moved_out->counter, "slab_build_ms_per_batch");
  EXPECT_DOUBLE_EQ(amortised->moved_out->ns_per_call, 0.2e6);
  EXPECT_DOUBLE_EQ(amortised->moved_out->ns_each, 25.6e6);
  EXPECT_EQ(amortised->baseline_ns, 100e3);
  EXPECT_EQ(amortised->improved_ns, 10);

  // A view that pays nothing per batch outside its timed region either (a slab built once): the
  // baseline's time is saved whole, which no ratio describes.
  const Row once = work_row("s", "prebatched", 0, 0, 10, {{"slab_build_ms_per_batch", 0.0}});
  why.clear();
  EXPECT_FALSE(compare_pair(Pair{"per_sample", "prebatched", "view vs copies", slab}, copies, once, why));
  EXPECT_NE(why.find("saves the baseline's"), std::string::npos) << why;

  // Nor is a baseline that moves nothing divided by.
  why.clear();
  EXPECT_FALSE(compare_pair(Pair{"prebatched", "per_sample", "copies vs view"}, view, copies, why));
  EXPECT_NE(why.find("no baseline"), std::string::npos) << why;
}

// Rows whose traffic is unknown but whose FLOPs are counted (cg) are work: their pairs are timed
// ratios as before, and a prediction named by the pair is set against the baseline's time.
TEST(PairsThatCannotLie, WorkWithoutBytesKeepsItsRatioAndItsPrediction) {
  const Row warm = work_row("cg", "warm", 0, 1e6, 4e6);
  const Row lazy = work_row("cg", "lazy", 0, 1e6, 2e6, {{"predicted_ns", 2.5e6}});
  std::string why;
  const auto pair = compare_pair(Pair{"warm", "lazy", "gate vs warm start alone", {}, "predicted_ns"}, warm, lazy, why);
  ASSERT_TRUE(pair) << why;
  EXPECT_EQ(pair->kind, "timed");
  EXPECT_DOUBLE_EQ(pair->ratio.ratio, 2.0);
  ASSERT_TRUE(pair->predicted);
  EXPECT_EQ(pair->predicted->counter, "predicted_ns");
  EXPECT_DOUBLE_EQ(pair->predicted->ratio, 4e6 / 2.5e6);
  // Without the counter there is no prediction, and the measured ratio stands.
  const auto bare = compare_pair(Pair{"warm", "lazy", "gate", {}, "predicted_ns"}, warm, work_row("cg", "lazy", 0, 1e6, 2e6),
                                 why);
  ASSERT_TRUE(bare);
  EXPECT_FALSE(bare->predicted);
}

// Through finish_results: a zero-work row gets no "_per_s" rate from its "_per_call" counter, and its
// pair goes to the withheld list with the reason instead of the pairs table.
TEST(PairsThatCannotLie, FinishResultsWithholdsTheViewsPlainRatioAndItsRate) {
  Registry reg;
  Stage s;
  s.name = "views";
  s.question = s.source = "test";
  s.axes = {Axis{"n", AxisKind::positive_int, {"1"}, {}, "", {}}};
  s.variants = {spin_variant("per_sample", 1, true, ""), spin_variant("prebatched", 1, true, "")};
  s.pairs = {Pair{"per_sample", "prebatched", "view vs copies"}};
  reg.add(s);
  Results results;
  results.rows = {work_row("views", "per_sample", 1e6, 0, 100e3, {{"samples_per_call", 64}}),
                  work_row("views", "prebatched", 0, 0, 10, {{"samples_per_call", 64}})};
  finish_results(reg, Settings{}, results);
  auto has = [](const Row& r, const char* key) {
    return std::any_of(r.counters.begin(), r.counters.end(), [&](const auto& c) { return c.first == key; });
  };
  EXPECT_TRUE(has(results.rows[0], "samples_per_s"));
  EXPECT_FALSE(has(results.rows[1], "samples_per_s")) << "64 samples per 10 ns is no rate";
  EXPECT_TRUE(results.pairs.empty());
  ASSERT_EQ(results.withheld_pairs.size(), 1u);
  EXPECT_NE(results.withheld_pairs[0].why.find("moves nothing"), std::string::npos) << results.withheld_pairs[0].why;
  const std::string console = render(results, Format::console);
  EXPECT_NE(line_of(console, "views/cpu/per_sample").find("GB/s"), std::string::npos) << console;
  const std::string view_line = line_of(console, "views/cpu/prebatched");
  ASSERT_FALSE(view_line.empty()) << console;
  EXPECT_EQ(view_line.find("GB/s"), std::string::npos) << view_line;
  EXPECT_NE(console.find("no ratio:"), std::string::npos) << console;
}

// The real collate stage through the real runner: the pre-batched view's row has no rate, and its
// pair is the amortised ratio built from the slab build it reported, within what its samples allow.
TEST_F(Harness, APrebatchedViewIsComparedWithTheSlabBuildAddedBack) {
  const Registry& reg = builtin_registry();
  Settings settings = quick_settings("collate/cpu/(per_sample|prebatched)/");
  settings.peak_prepass = false;
  settings.disturbed_share = 1.0;  // a loaded machine must not withhold the pair this test is about
  for (const char* axis : {"collate.layout=text_pair", "collate.order=shuffled", "collate.samples=1024", "collate.batch=64",
                           "collate.embed_dim=64", "collate.seq_len=16"})
    settings.overrides.push_back(parse_axis_override(reg, axis));
  std::ostringstream progress;
  const Results results = run_entries(reg, select_entries(reg, settings), settings, progress);
  const std::string problem = "layout=text_pair,order=shuffled,samples=1024,batch=64,embed_dim=64,seq_len=16";
  const Row& copies = row(results, "collate/cpu/per_sample/" + problem);
  const Row& view = row(results, "collate/cpu/prebatched/" + problem);
  ASSERT_TRUE(copies.timed()) << copies.reason;
  ASSERT_TRUE(view.timed()) << view.reason;
  EXPECT_TRUE(view.moves_nothing());
  EXPECT_EQ(view.gb_per_s(), 0.0);
  double slab_ms = -1;
  for (const auto& [key, value] : view.counters) {
    EXPECT_NE(key, "samples_per_s");
    if (key == "slab_build_ms_per_batch") slab_ms = value;
  }
  ASSERT_GT(slab_ms, 0.0);

  const auto pair = std::find_if(results.pairs.begin(), results.pairs.end(),
                                 [&](const PairRow& p) { return p.improved == view.name; });
  ASSERT_NE(pair, results.pairs.end());
  EXPECT_EQ(pair->baseline, copies.name);
  EXPECT_EQ(pair->kind, "amortised");
  ASSERT_TRUE(pair->moved_out);
  EXPECT_DOUBLE_EQ(pair->moved_out->ns_per_call, slab_ms * 1e6);
  // The Hodges-Lehmann ratio lies within the extreme pairwise ratios of the amortised samples.
  const auto [view_min, view_max] = std::minmax_element(view.samples_ns.begin(), view.samples_ns.end());
  const auto [copy_min, copy_max] = std::minmax_element(copies.samples_ns.begin(), copies.samples_ns.end());
  EXPECT_GE(pair->ratio.ratio, *copy_min / (*view_max + slab_ms * 1e6) * (1 - 1e-12));
  EXPECT_LE(pair->ratio.ratio, *copy_max / (*view_min + slab_ms * 1e6) * (1 + 1e-12));

  const std::string console = render(results, Format::console);
  EXPECT_NE(console.find("slab build"), std::string::npos) << console;
  EXPECT_NE(console.find("per batch amortised"), std::string::npos) << console;
  const std::string view_line = line_of(console, view.name);
  ASSERT_FALSE(view_line.empty()) << console;
  EXPECT_EQ(view_line.find("GB/s"), std::string::npos) << view_line;
  const nlohmann::json doc = to_json(results);
  bool amortised_in_json = false;
  for (const auto& p : doc["pairs"])
    if (p["improved"] == view.name)
      amortised_in_json = p["kind"] == "amortised" && p["moved_out"]["ns_per_call"] == slab_ms * 1e6;
  EXPECT_TRUE(amortised_in_json) << doc["pairs"].dump(2);
}

// ---- a pair's sides measured in alternating rounds ---------------------------------------------------

// The order samples are taken in, as the harness tells it (Settings::on_sample), and the rounds a
// prediction's parts were timed in: one log, in the order things happened.
std::vector<std::string> sample_log;

TEST_F(Harness, APairsSidesAreSampledInAlternatingRounds) {
  const Registry reg = toy_registry();
  Settings settings = quick_settings("toy/cpu/(slow|fast)/");
  settings.peak_prepass = false;
  settings.repetitions = 6;
  settings.disturbed_share = 1;  // the machine's load would withhold the pair: no say in the order checked
  settings.on_sample = [](const std::string& row, std::size_t) { sample_log.push_back(row); };
  const std::string slow = "toy/cpu/slow/n=20000", fast = "toy/cpu/fast/n=20000";

  sample_log.clear();
  std::ostringstream progress;
  const Results results = run_entries(reg, select_entries(reg, settings), settings, progress);
  // Round r takes one sample of each side: in entry order when r is even, reversed when odd (ABBA).
  std::vector<std::string> expected;
  for (int r = 0; r < settings.repetitions; ++r) {
    expected.push_back(r % 2 ? fast : slow);
    expected.push_back(r % 2 ? slow : fast);
  }
  EXPECT_EQ(sample_log, expected);
  EXPECT_EQ(row(results, slow).samples_ns.size(), 6u);
  EXPECT_EQ(row(results, fast).interleaved_with, std::vector<std::string>{slow});
  ASSERT_EQ(results.pairs.size(), 1u);
  EXPECT_EQ(results.pairs[0].rounds, 6);         // the ratio comes from the six paired rounds
  EXPECT_GT(results.pairs[0].ratio.ratio, 2.0);  // 8x the work

  // Measured apart (the way before rounds), the sides come one after the other and the ratio is of
  // the two sample sets.
  settings.interleave_pairs = false;
  sample_log.clear();
  const Results apart = run_entries(reg, select_entries(reg, settings), settings, progress);
  expected.assign(6, slow);
  expected.insert(expected.end(), 6, fast);
  EXPECT_EQ(sample_log, expected);
  ASSERT_EQ(apart.pairs.size(), 1u);
  EXPECT_EQ(apart.pairs[0].rounds, 0);
  EXPECT_TRUE(row(apart, fast).interleaved_with.empty());
}

// A row whose calls another process makes (a PyTorch row: benches/torch_rows.h) is timed by that
// process's clock, through the timer its instance gives; it is measured in the rounds of the rows it
// names (Entry::measured_with), under the backend name it gives; a factory that finds it cannot run the
// problem makes the row unsupported, not failed.
class ElsewhereInstance final : public Instance {
 public:
  void run() override { ++queued_; }
  Verdict check() override { return {true, 0.0, ""}; }
  SampleTimer* own_timer() override { return &timer_; }

 private:
  // "The other process" takes 3 ms a call, whatever this one's clock says.
  class Timer final : public SampleTimer {
   public:
    explicit Timer(ElsewhereInstance& row) : row_(row) {}
    void start() override { row_.queued_ = 0; }
    double stop() override { return 3e-3 * static_cast<double>(std::exchange(row_.queued_, 0)); }

   private:
    ElsewhereInstance& row_;
  };
  int64_t queued_ = 0;
  Timer timer_{*this};
};

TEST_F(Harness, ARowTimedElsewhereIsMeasuredInTheRoundsOfTheRowItNames) {
  const Registry reg = toy_registry();
  Settings settings = quick_settings("toy/cpu/fast/");
  settings.peak_prepass = false;
  settings.repetitions = 4;
  settings.disturbed_share = 1;  // the machine's load has no say in the order checked
  settings.on_sample = [](const std::string& row, std::size_t) { sample_log.push_back(row); };
  std::vector<Entry> entries = select_entries(reg, settings);
  const std::string fast = "toy/cpu/fast/n=20000", theirs = "toy/elsewhere/fast/n=20000";
  Stage elsewhere;
  elsewhere.name = "toy";
  Variant v = spin_variant("fast", 1, true, "cpu.toy");
  v.make = [](const Problem&, const RunContext&) { return std::make_unique<ElsewhereInstance>(); };
  Variant refused = spin_variant("refused", 1, true, "");
  refused.make = [](const Problem&, const RunContext&) -> std::unique_ptr<Instance> {
    throw CannotRun("the other process's backend refused this shape");
  };
  elsewhere.variants = {v, refused};
  Entry e;
  e.stage = &elsewhere;
  e.variant = &elsewhere.variants[0];
  e.problem = entries.back().problem;  // fast's: n=20000
  e.name = theirs;
  e.backend_name = "elsewhere";
  e.measured_with = {fast};
  entries.push_back(e);
  e.variant = &elsewhere.variants[1];
  e.name = "toy/elsewhere/refused/n=20000";
  e.measured_with.clear();
  entries.push_back(e);

  sample_log.clear();
  std::ostringstream progress;
  const Results results = run_entries(reg, entries, settings, progress);
  std::vector<std::string> expected;
  for (int r = 0; r < settings.repetitions; ++r) {
    expected.push_back(r % 2 ? theirs : fast);
    expected.push_back(r % 2 ? fast : theirs);
  }
  EXPECT_EQ(sample_log, expected);
  const Row& elsewhere_row = row(results, theirs);
  EXPECT_EQ(elsewhere_row.backend, "elsewhere");
  ASSERT_TRUE(elsewhere_row.timed()) << elsewhere_row.reason;
  for (double ns : elsewhere_row.samples_ns) EXPECT_DOUBLE_EQ(ns, 3e6);  // its clock's, per call
  EXPECT_EQ(elsewhere_row.interleaved_with, std::vector<std::string>{fast});
  const Row& refused_row = row(results, "toy/elsewhere/refused/n=20000");
  EXPECT_EQ(refused_row.disposition, Disposition::unsupported);
  EXPECT_EQ(refused_row.reason, "the other process's backend refused this shape");
  // A row of another backend sets no peak and joins none of the registry's pairs.
  EXPECT_TRUE(results.pairs.empty() && results.withheld_pairs.empty());
  EXPECT_EQ(results.peaks.count("cpu.toy"), 0u);
}

// A stop request inside a group's rounds ends it within the sample in hand: each of its rows keeps the
// samples it took and says how many; --max-time ends a group between rounds, each row cut short.
Registry paired_stop_registry() {
  Registry r = stop_registry();
  Stage s = r.stages().front();
  s.name = "pairstop";
  s.pairs = {Pair{"before", "sleeper", "sleeper vs before"}};
  Registry out;
  out.add(s);
  return out;
}

TEST_F(Stop, AStopInAPairsRoundsKeepsEachSidesSamples) {
  std::ostringstream progress;
  Settings settings = quick_settings("pairstop");
  settings.repetitions = 100;
  settings.min_time_s = 0.005;
  sleeper_stop_at = 40;  // past the check and warm-up (at most about 22 calls): in a round
  const Results results = run_entries(paired_stop_registry(), select_entries(paired_stop_registry(), settings), settings,
                                      progress);
  EXPECT_EQ(sleeper_calls.load(), 40) << "no call after the one that asked";
  for (const char* name : {"pairstop/cpu/before/n=2000", "pairstop/cpu/sleeper/n=2000"}) {
    const Row& r = row(results, name);
    EXPECT_EQ(r.disposition, Disposition::passed) << name;
    ASSERT_TRUE(r.timed()) << name;
    EXPECT_LT(r.samples_ns.size(), 100u) << name;
    EXPECT_EQ(r.interrupted, "SIGTERM after " + std::to_string(r.samples_ns.size()) + " of 100 samples") << name;
  }
  EXPECT_EQ(results.context.value("interrupted", ""), "SIGTERM");
  EXPECT_EQ(row(results, "pairstop/cpu/after/n=2000").reason, "not run: interrupted");
}

TEST_F(Harness, MaxTimeEndsAPairsRoundsWithTheSamplesTaken) {
  const Registry reg = toy_registry();
  Settings settings = quick_settings("toy/cpu/(slow|fast)/");
  settings.peak_prepass = false;
  settings.repetitions = 1000;   // far more rounds than the time allows
  settings.max_time_s = 0.001;   // each row's budget; the group's is the sum, checked between rounds
  settings.disturbed_share = 1;  // the machine's load would withhold the pair: no say in what this checks
  std::ostringstream progress;
  const Results results = run_entries(reg, select_entries(reg, settings), settings, progress);
  const Row& slow = row(results, "toy/cpu/slow/n=20000");
  const Row& fast = row(results, "toy/cpu/fast/n=20000");
  EXPECT_EQ(slow.samples_ns.size(), fast.samples_ns.size()) << "whole rounds only";
  EXPECT_GE(slow.samples_ns.size(), 1u);
  EXPECT_LT(slow.samples_ns.size(), 1000u);
  EXPECT_EQ(slow.cut_short, "--max-time 0.001 s: " + std::to_string(slow.samples_ns.size()) + " of 1000 samples");
  EXPECT_EQ(fast.cut_short, "--max-time 0.001 s: " + std::to_string(fast.samples_ns.size()) + " of 1000 samples");
  ASSERT_EQ(results.pairs.size(), 1u);
  EXPECT_EQ(results.pairs[0].rounds, static_cast<int>(slow.samples_ns.size()));
}

// A fake clock: every call advances it by its cost, times the slowdown of the moment. A slow spell of
// the machine is the slowdown going from 1 to 2 part-way through the run.
double fake_now_s = 0, fake_slowdown = 1;

class FakeClock final : public SampleTimer {
 public:
  void start() override { started_ = fake_now_s; }
  double stop() override { return fake_now_s - started_; }

 private:
  double started_ = 0;
};

// A call that costs `cost_s` on the fake clock. The improved side's model predicts its time from a part
// it times after each sample (as cg's lazy gate times its gate and its solve), logged when it does.
class FakeWork final : public Instance {
 public:
  FakeWork(double cost_s, bool times_its_parts) : cost_s_(cost_s), times_its_parts_(times_its_parts) {}
  void run() override { fake_now_s += cost_s_ * fake_slowdown; }
  Verdict check() override { return Verdict{true, 0, ""}; }
  std::vector<std::pair<std::string, double>> observed() const override {
    if (!times_its_parts_) return {};
    sample_log.push_back("parts");
    return {{"predicted_ns", cost_s_ * fake_slowdown * 1e9}};
  }

 private:
  double cost_s_;
  bool times_its_parts_;
};

Registry fake_clock_registry() {
  Registry r;
  Stage s;
  s.name = "clocktoy";
  s.question = s.source = "test";
  s.axes = {Axis{"n", AxisKind::positive_int, {"1"}, {}, "", {}}};
  auto variant = [](const std::string& id, double cost_s, bool times_its_parts) {
    Variant v = spin_variant(id, 1, true, "");
    v.make = [cost_s, times_its_parts](const Problem&, const RunContext&) -> std::unique_ptr<Instance> {
      return std::make_unique<FakeWork>(cost_s, times_its_parts);
    };
    return v;
  };
  s.variants = {variant("base", 2e-3, false), variant("improved", 1e-3, true)};
  s.pairs = {Pair{"base", "improved", "improved vs base", {}, "predicted_ns"}};
  r.add(s);
  return r;
}

TEST_F(Harness, ASlowSpellLeavesAnInterleavedPairsRatioAloneWhereMeasuringApartIsBiased) {
  const Registry reg = fake_clock_registry();
  Settings settings = quick_settings("clocktoy");
  settings.repetitions = 10;
  settings.min_time_s = 0.01;    // fake seconds
  settings.disturbed_share = 1;  // the real machine's load has no say over a fake clock's samples
  settings.sample_timer = [] { return std::make_unique<FakeClock>(); };
  // The spell starts once the baseline has its fifth sample and lasts to the end of the run.
  settings.on_sample = [](const std::string& row, std::size_t sample) {
    sample_log.push_back(row);
    if (row == "clocktoy/cpu/base/n=1" && sample == 4) fake_slowdown = 2;
  };
  auto run = [&](bool interleave) {
    settings.interleave_pairs = interleave;
    fake_now_s = 0;
    fake_slowdown = 1;
    sample_log.clear();
    std::ostringstream progress;
    const Results results = run_entries(reg, select_entries(reg, settings), settings, progress);
    EXPECT_EQ(results.pairs.size(), 1u) << progress.str();
    return results.pairs.empty() ? PairRow{} : results.pairs[0];
  };

  // Interleaved: the spell slows both sides of every round it covers; only round 4, where it began
  // between the two samples, reads otherwise, and the paired estimate is the true 2x.
  const PairRow interleaved = run(true);
  EXPECT_NEAR(interleaved.ratio.ratio, 2.0, 0.02);
  EXPECT_EQ(interleaved.rounds, 10);
  // The model's parts were timed after each of the improved side's samples, in its rounds.
  int parts = 0;
  for (std::size_t k = 0; k < sample_log.size(); ++k)
    if (sample_log[k] == "parts") {
      ++parts;
      EXPECT_EQ(sample_log[k - 1], "clocktoy/cpu/improved/n=1") << "after event " << k - 1;
    }
  EXPECT_EQ(parts, 10);
  ASSERT_TRUE(interleaved.predicted);

  // Apart: the baseline's first half is fast, its second half and the whole improved row slow, and the
  // ratio reads 1.41x for what is 2x.
  const PairRow apart = run(false);
  EXPECT_LT(apart.ratio.ratio, 1.6);
  EXPECT_EQ(apart.rounds, 0);
}

}  // namespace
// A row this machine ran before is announced as it went then (its set-up, its measuring scaled to what
// the settings ask now); one it did not, from its stage's rows; one of a stage never run, by the
// settings alone. Another machine's rows and a file of another kind are not read.
TEST(TimeEstimate, KnownRowsThenTheirStageThenTheSettings) {
  const Registry reg = toy_registry();
  Settings settings;
  settings.repetitions = 3;
  settings.min_time_s = 0.5;  // 2 s of samples per row, plus the warm-up
  const double expected = expected_measure_seconds(settings);
  EXPECT_DOUBLE_EQ(expected, 2.0 + defaults::warmup_s);
  settings.filter = "toy/cpu/(slow|fast)|peak";
  const std::vector<Entry> entries = select_entries(reg, settings);
  ASSERT_EQ(entries.size(), 3u);  // the peak row, slow, fast

  nlohmann::json file = {{"schema", "trainbench-row-costs/1"}};
  // slow took 10 s to set up and twice what its run's settings asked; nothing of peak or fast is kept.
  file["machines"]["here"]["toy/cpu/slow/n=20000"] = {{"stage", "toy"},
                                                      {"setup_s", 10.0},
                                                      {"measure_s", 8.0},
                                                      {"expected_measure_s", 4.0}};
  file["machines"]["elsewhere"]["peak/cpu/ceiling/n=20000"] = {{"stage", "peak"},
                                                               {"setup_s", 100.0},
                                                               {"measure_s", 1.0},
                                                               {"expected_measure_s", 1.0}};
  const TimeEstimate t = estimate_time(entries, settings, RowCosts::from_json(file, "here"));
  EXPECT_EQ(t.rows, 3u);
  EXPECT_EQ(t.known, 1u);
  EXPECT_EQ(t.by_stage, 1u);  // fast, from slow
  EXPECT_DOUBLE_EQ(t.lower_bound, 3 * expected);
  // peak: the settings only; slow: 10 + 2 x expected; fast: as slow, its stage's only row.
  EXPECT_NEAR(t.seconds, expected + 2 * (10 + 2 * expected), 1e-9);
  const std::string text = expected_time_text(settings, t);
  EXPECT_NE(text.find("expect at least"), std::string::npos) << text;
  EXPECT_NE(text.find("1 of 3 rows known"), std::string::npos) << text;

  file["schema"] = "something-else/1";
  const TimeEstimate none = estimate_time(entries, settings, RowCosts::from_json(file, "here"));
  EXPECT_EQ(none.known + none.by_stage, 0u);
  EXPECT_DOUBLE_EQ(none.seconds, none.lower_bound);
  EXPECT_NE(expected_time_text(settings, none).find("no row has run on this machine yet"), std::string::npos);
}

// A run's costs are blended half and half with what was kept, and merged into the file without losing
// another machine's rows.
TEST(TimeEstimate, RecordBlendsWithWhatWasKeptAndKeepsOtherMachines) {
  nlohmann::json file = {{"schema", "trainbench-row-costs/1"}};
  file["machines"]["elsewhere"]["a"] = {{"stage", "s"}, {"setup_s", 1.0}, {"measure_s", 1.0}, {"expected_measure_s", 1.0}};
  RowCosts costs = RowCosts::from_json(file, "here");
  costs.record("a", "s", {4.0, 6.0, 2.0});  // 3x what was asked
  costs.record("a", "s", {2.0, 2.0, 2.0});  // 1x
  const std::optional<RowCost> a = costs.row("a");
  ASSERT_TRUE(a);
  EXPECT_DOUBLE_EQ(a->setup_s, 3.0);
  EXPECT_DOUBLE_EQ(a->measure_s / a->expected_measure_s, 2.0);
  costs.record("b", "s", {1.0, 1.0, 0.0});  // nothing was asked of it: not a figure to scale
  EXPECT_FALSE(costs.row("b"));
  const nlohmann::json merged = costs.merged_into(file);
  EXPECT_TRUE(merged["machines"]["elsewhere"].contains("a"));
  EXPECT_DOUBLE_EQ(merged["machines"]["here"]["a"]["setup_s"].get<double>(), 3.0);
  EXPECT_EQ(RowCosts::from_json(merged, "here").row("a")->setup_s, 3.0);
}

}  // namespace tb

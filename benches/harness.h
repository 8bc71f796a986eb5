// The measuring harness: selects the registry entries a run measures, checks every variant against its
// reference before it is timed, takes its samples (runner.h: alone, or in rounds with the rows of its
// pairs), and derives the summary, % of the measured peak and the declared pairs' ratios.
#pragma once

#include <csignal>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "results.h"
#include "runtime/defaults.h"
#include "runtime/registry.h"
#include "runtime/timing.h"

namespace tb {

struct Entry;

struct Settings {
  int repetitions = 10;
  double min_time_s = 0.2;
  bool cold = false;
  bool quick = false;
  double noise_target = 0.05;
  int cuda_device = 0;
  std::vector<Backend> backends{Backend::cpu};
  std::string filter;  // ECMAScript regex searched in benchmark names; empty: everything
  std::vector<AxisOverride> overrides;
  bool peak_prepass = true;  // measure the peaks other rows need when the filter left them out
  // Seconds a row may spend measuring (after its check and warm-up) before it stops with the samples it
  // has (nvbench's --timeout); 0: no limit. The rows it cut short say so.
  double max_time_s = 0;
  // CPU rows: the share of all CPUs others may use during a sample before it is taken again.
  double disturbed_share = defaults::disturbed_share;
  // CUDA rows: the share of a sample the GPU may spend thermally throttled before it is taken again.
  double throttled_share = defaults::throttled_share;
  // A row still measuring after this many seconds says how far it is ("sample 3/10"), again each time
  // as long again has passed; 0: after every sample.
  double progress_every_s = defaults::progress_every_s;
  // CPU rows: the working set below which a hot memory-bound row may run from a cache, and how it was
  // found (where the copy's bandwidth fell to DRAM's in this machine's size sweep: cache_threshold.h);
  // 0: twice the last-level cache the CPU reports.
  double cpu_cache_bytes = 0;
  std::string cpu_cache_how;
  // The rows a stage's declared pairs join at one problem (both sides of each pair) are measured
  // together, in rounds that take one sample of each, in tb::schedule's order (A B, B A, A B, ...), so
  // that a drift of the machine hits both sides of a round and the pair's ratio comes from the rounds.
  // false: each row on its own, one after the other (for comparison, or where the sides of a pair do
  // not fit in memory together).
  bool interleave_pairs = true;
  // Tests: makes the timer every sample is read from (a fake clock); null: the backend's own.
  std::function<std::unique_ptr<SampleTimer>()> sample_timer;
  // Tests: told of each sample a row keeps, in the order they were taken (row name, sample index).
  std::function<void(const std::string& row, std::size_t sample)> on_sample;
  // Told of each row that was set up, when its measurement is over: its wall time setting up (the
  // instance, the first call, the reference check, the warm-up) and measuring (its share of its group's
  // rounds, retakes included). The announced time of the next run is made of these (time_estimate.h).
  std::function<void(const Entry& row, double setup_s, double measure_s)> on_row_done;
};

// One benchmark to run: a variant at one problem.
struct Entry {
  const Stage* stage = nullptr;
  const Variant* variant = nullptr;
  Problem problem;
  std::string name;
  std::string unsupported;  // non-empty: reported as such, never run
  // A row that is not one of the registry's (a PyTorch row: torch_rows.h): the backend its row names
  // ("torch"); empty: the variant's.
  std::string backend_name;
  // Rows to measure in the same rounds as this one besides its stage's declared pairs' other sides (a
  // PyTorch row's: the row it mirrors and its PyTorch pairs' other sides), by name.
  std::vector<std::string> measured_with;
};

// The entries the settings select, peaks first. Throws UsageError (saying what exists) when the
// filter is not a valid regex or matches nothing.
std::vector<Entry> select_entries(const Registry& registry, const Settings& settings);

// Measures the entries (runner.h) and returns the results. Progress goes to `progress`, one line per
// benchmark. Never throws for a failing variant: it becomes a row. Google Benchmark's --benchmark_filter
// (benchmark::Initialize) leaves out the rows it does not match.
Results run_entries(const Registry& registry, const std::vector<Entry>& entries, const Settings& settings,
                    std::ostream& progress);

// The run's context: host, devices, build, settings (Google Benchmark's keys plus trainbench's).
nlohmann::json run_context(const Settings& settings);
// Per backend of the run, the working set below which a hot memory-bound row may run from a cache and
// how it was found: {"cpu": {"bytes": ..., "how": "..."}} (context.cache_thresholds).
nlohmann::json cache_thresholds_json(const Settings& settings);

// Fills each row's summary and % of peak, the peaks and the pairs, from the rows' samples.
void finish_results(const Registry& registry, const Settings& settings, Results& results);
// Each timed row's % of its peak key's measured peak (or why it has none: "cache", "above peak"); run
// again after rows measured elsewhere (PyTorch's) join the results, so they are held to the same peaks.
void attach_pct_of_peak(const Settings& settings, Results& results);

// One declared pair at one problem, from its two timed rows (summaries filled): the ratio of the
// timed regions, or the amortised ratio when the pair declares a cost moved out of the improved
// variant's timed region (Pair::moved_out), with the model's prediction where the pair names one.
// Null, with `why`, when no ratio would be an answer: a row whose timed region moves nothing, with
// no cost moved out to add to it.
std::optional<PairRow> compare_pair(const Pair& pair, const Row& baseline, const Row& improved, std::string& why);

// A declared pair of two timed rows (summaries filled) into `results`: its ratio (compare_pair), or
// withheld with the reason, when one of the rows was disturbed or no ratio would be an answer.
void judge_pair(const Pair& pair, const Row& baseline, const Row& improved, Results& results);

// The key printed under the console table: what each column and mark means, with the values this run
// used (the intervals' levels, the noise target, each backend's cache threshold, --max-time).
std::string table_key(const Results& results, const Settings& settings);
// The same, in general terms, for --help.
std::string table_key_help();

// Ctrl-C (SIGINT) or a job's time limit (SIGTERM): the benchmark in flight stops at its next call
// boundary (a call itself is never cut short), keeps the samples it took, the last one made of the
// calls its repetition got to, and is marked interrupted; the rest are recorded as not run, and the
// results measured so far are still written. Safe to call from a signal handler.
void request_stop(int signal = SIGINT);
bool stop_requested();
// The signal that asked for the stop, 0 when none did: benchsuite exits 128 + it (130, 143).
int stop_signal();
// Forgets a stop request, so that another run can follow a stopped one (tests).
void clear_stop_request();

// 1 when any variant was incorrect or failed, else 0.
int exit_code_for(const Results& results);

}  // namespace tb

// A benchsuite run as data: one row per benchmark with its disposition and samples, the measured
// peaks, and the declared pairs' ratios. Serialised as `trainbench-results/1` (results/README.md).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/files.h"  // write_file_atomically
#include "runtime/stats.h"

namespace tb {

inline constexpr const char* results_schema = "trainbench-results/1";

// What became of a row. `pending` lives only while a run is in progress: the harness settles every
// row before it returns. The JSON holds the name to_string gives.
enum class Disposition { pending, passed, incorrect, unsupported, failed };
const char* to_string(Disposition disposition);
// Throws std::runtime_error naming the accepted words when `name` is none of them.
Disposition disposition_from_string(const std::string& name);
std::ostream& operator<<(std::ostream& out, Disposition disposition);

struct Row {
  std::string name;  // "peak/cpu/triad/n=33554432"
  std::string stage, variant, backend;
  std::vector<std::pair<std::string, std::string>> problem;
  Disposition disposition = Disposition::pending;
  std::string reason;  // why, for anything but passed
  double max_error = 0;
  std::string mode = "hot";
  int64_t batch = 1;               // calls per timed sample
  int64_t iterations = 0;          // samples' iteration count (Google Benchmark's)
  std::vector<double> samples_ns;  // time per call, one per repetition
  Summary summary;                 // over samples_ns
  double bytes = 0, flops = 0;
  std::string bound = "memory";  // memory | compute: which rate is compared with the peak
  std::string peak_key;
  double footprint = 0;  // bytes one call touches (Work::footprint_bytes, else bytes)
  std::optional<double> pct_of_peak;
  // Why a row with a peak key has no % of it: "cache" (hot, and its working set fits in the last-level
  // cache: a DRAM peak is no ceiling for it), "above peak" (faster than the measured ceiling: the
  // work model or the peak is wrong), or "" when it has one.
  std::string pct_note;
  // A stop request (Ctrl-C, SIGTERM) ended its measurement: "SIGTERM after 3 of 10 samples"; empty
  // when it did not. Its samples are real, only fewer.
  std::string interrupted;
  // CPU rows: the largest share of all CPUs other processes used during a kept sample (-1: not
  // known), and whether some sample stayed above Settings::disturbed_share after the retakes.
  double others_share = -1;
  bool disturbed = false;
  int retaken = 0;  // samples taken again because others held the CPUs (or the GPU throttled)
  // --max-time ended its measurement early: "--max-time 5 s: 3 of 10 samples"; empty when it did not.
  std::string cut_short;
  // CUDA rows, where NVML answers: the SM clock range and the clock event reasons seen around the
  // samples, and the largest throttled share of a kept sample (-1: not known).
  int sm_clock_min_mhz = 0, sm_clock_max_mhz = 0;
  uint64_t clock_reasons = 0;
  double throttled_share = -1;
  std::vector<std::pair<std::string, double>> counters;  // from the work model, e.g. launches per call
  std::string configuration;                             // Instance::configuration(): which searched way ran ("" when one)
  // The rows measured in the same rounds as this one (its pairs' other sides): sample k of each was
  // taken in round k. Empty: measured on its own.
  std::vector<std::string> interleaved_with;

  bool timed() const { return disposition == Disposition::passed && !samples_ns.empty(); }
  // The timed region moves and computes nothing (Work::moves_nothing): no rate of any kind.
  bool moves_nothing() const { return bytes == 0 && flops == 0; }
  double gb_per_s() const { return timed() && summary.median > 0 ? bytes / summary.median : 0; }
  double tflop_per_s() const { return timed() && summary.median > 0 ? flops / summary.median * 1e-3 : 0; }
  // The rate compared with a peak: bytes/s or FLOP/s.
  double rate() const { return timed() ? (bound == "compute" ? flops : bytes) / (summary.median * 1e-9) : 0; }
};

// What disturbed a row's samples, in words: "other processes used 54% of the CPUs", or "the GPU was
// throttled 30% of the time (sw_thermal_slowdown), SM clock 1410-1980 MHz".
std::string disturbance_text(const Row& r);

// The cost an amortised pair's improved variant pays outside its timed region (Pair::moved_out),
// as its row reported it.
struct MovedOut {
  std::string what;     // "slab build"
  std::string counter;  // the row's counter it came from: "slab_build_ms_per_batch"
  double ns_per_call = 0;
  double ns_each = 0;    // each time it is paid; 0 when the row does not say
  std::string paid_per;  // "epoch"
  std::string call;      // "batch"
};

// A model's prediction of the improved row's time per call (Pair::predicted_ns).
struct Prediction {
  std::string counter;     // "predicted_ns"
  double improved_ns = 0;  // the predicted time per call
  double ratio = 0;        // baseline median / improved_ns: the speedup the model predicts
};

struct PairRow {
  std::string stage, label, baseline, improved;
  RatioEstimate ratio;  // baseline / improved, of the `kind` below
  // "timed": baseline / improved over the timed regions. "amortised": baseline / (improved +
  // moved_out->ns_per_call), the improved variant's cost including what it moved out of the loop.
  std::string kind = "timed";
  double baseline_ns = 0, improved_ns = 0;  // the rows' median time per call (0: not in the file)
  std::optional<MovedOut> moved_out;        // amortised pairs
  std::optional<Prediction> predicted;
  // The ratio is from this many paired rounds (the sides measured interleaved, per-round ratios);
  // 0: from the two rows' sample sets, measured apart.
  int rounds = 0;
};

// A declared pair whose ratio is withheld: one of its rows was disturbed, or moves nothing in its
// timed region without naming the cost it moved out.
struct WithheldPair {
  std::string stage, label, baseline, improved, why;
};

struct PeakValue {
  double value = 0;
  std::string unit;           // "B/s" or "FLOP/s"
  std::string benchmark;      // the row it came from
  std::string configuration;  // that row's configuration, when it searched
  // The peak rows' own fastest sample, when a figure of the same work measured beside them in the run
  // (their search's fastest call, a row doing it another way) beat it by more than 2% and set the peak
  // instead (their samples were slowed, or they time a slower way than the best); 0: they agree.
  double own_samples_value = 0;
};

struct Results {
  nlohmann::json context = nlohmann::json::object();
  std::vector<Row> rows;
  std::vector<PairRow> pairs;
  std::vector<WithheldPair> withheld_pairs;
  std::map<std::string, PeakValue> peaks;
};

// A pair as the table names it: "attention fused vs naive", and the label alone when it already
// starts with the stage ("AdamW: fused vs per-tensor", not "adamw AdamW: ...").
std::string pair_title(const std::string& stage, const std::string& label);

nlohmann::json to_json(const Results& results);
// Throws std::runtime_error naming what is wrong when the document is not trainbench-results/1.
Results results_from_json(const nlohmann::json& document);

enum class Format { console, json, csv, md };
Format format_from_string(const std::string& name);  // throws UsageError
std::string render(const Results& results, Format format);
// A counter's value as the console and progress lines show it.
std::string counter_text(double value);

}  // namespace tb

// A benchsuite run as data: one row per benchmark with its disposition and samples, the measured
// peaks, and the declared pairs' ratios. Serialised as `trainbench-results/1` (results/README.md).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/stats.h"

namespace tb {

inline constexpr const char* results_schema = "trainbench-results/1";

struct Row {
  std::string name;  // "peak/cpu/triad/n=33554432"
  std::string stage, variant, backend;
  std::vector<std::pair<std::string, std::string>> problem;
  std::string disposition = "pending";  // passed | incorrect | unsupported | failed
  std::string reason;                   // why, for anything but passed
  double max_error = 0;
  std::string mode = "hot";
  int64_t batch = 1;        // calls per timed sample
  int64_t iterations = 0;   // samples' iteration count (Google Benchmark's)
  std::vector<double> samples_ns;  // time per call, one per repetition
  Summary summary;          // over samples_ns
  double bytes = 0, flops = 0;
  std::string bound = "memory";  // memory | compute: which rate is compared with the peak
  std::string peak_key;
  double footprint = 0;       // bytes one call touches (Work::footprint_bytes, else bytes)
  std::optional<double> pct_of_peak;
  // Why a row with a peak key has no % of it: "cache" (hot, and its working set fits in the last-level
  // cache: a DRAM peak is no ceiling for it), "above peak" (faster than the measured ceiling: the
  // work model or the peak is wrong), or "" when it has one.
  std::string pct_note;
  // CPU rows: the largest share of all CPUs other processes used during a kept sample (-1: not
  // known), and whether some sample stayed above Settings::disturbed_share after the retakes.
  double others_share = -1;
  bool disturbed = false;
  int retaken = 0;  // samples taken again because others held the CPUs
  std::vector<std::pair<std::string, double>> counters;  // from the work model, e.g. launches per call

  bool timed() const { return disposition == "passed" && !samples_ns.empty(); }
  double gb_per_s() const { return timed() && summary.median > 0 ? bytes / summary.median : 0; }
  double tflop_per_s() const { return timed() && summary.median > 0 ? flops / summary.median * 1e-3 : 0; }
  // The rate compared with a peak: bytes/s or FLOP/s.
  double rate() const { return timed() ? (bound == "compute" ? flops : bytes) / (summary.median * 1e-9) : 0; }
};

struct PairRow {
  std::string stage, label, baseline, improved;
  RatioEstimate ratio;
};

// A declared pair whose ratio is withheld: one of its rows was disturbed.
struct WithheldPair {
  std::string stage, label, baseline, improved, why;
};

struct PeakValue {
  double value = 0;
  std::string unit;       // "B/s" or "FLOP/s"
  std::string benchmark;  // the row it came from
};

struct Results {
  nlohmann::json context = nlohmann::json::object();
  std::vector<Row> rows;
  std::vector<PairRow> pairs;
  std::vector<WithheldPair> withheld_pairs;
  std::map<std::string, PeakValue> peaks;
};

nlohmann::json to_json(const Results& results);
// Throws std::runtime_error naming what is wrong when the document is not trainbench-results/1.
Results results_from_json(const nlohmann::json& document);

enum class Format { console, json, csv, md };
Format format_from_string(const std::string& name);  // throws UsageError
std::string render(const Results& results, Format format);
// A counter's value as the console and progress lines show it.
std::string counter_text(double value);

// Writes to a temporary file beside `path`, flushes it, then renames it over `path`, so a reader
// never sees half a file and an interrupted run never destroys the previous one.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace tb

// The time a run announces before it starts, from what each row took the last time it ran on this
// machine: its set-up and reference check (which no setting bounds: CG's largest rows spend minutes
// there on a 2-core VM) and its measuring, kept per row in a small file beside the cache sweep's.
// A row this machine has not run yet counts its stage's rows that it has, else the settings' lower
// bound; the announcement says how many rows it knows.
#pragma once

#include <cstddef>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness.h"

namespace tb {

// What one row cost, in seconds of wall time.
struct RowCost {
  double setup_s = 0;             // instantiating, the first call, the reference check, the warm-up
  double measure_s = 0;           // finding the batch and taking the samples (retakes included)
  double expected_measure_s = 0;  // what the settings of that run let one expect of measure_s
};

// The measuring the settings ask of one row: (repetitions + one calibration) samples of at least
// --min-time and the warm-up, at most --max-time (plus the sample in hand) when it is set.
double expected_measure_seconds(const Settings& settings);

// The rows' costs kept for one machine (the cache sweep's key: CPU model, CPUs, threads, cache).
class RowCosts {
 public:
  // Read from `path` (row-costs.json); empty when the file is absent, unreadable or of another
  // schema: a bad file costs only the estimate.
  static RowCosts load(const std::string& path, const std::string& machine);
  // From the file's text: empty when it is not JSON or not such a document.
  static RowCosts from_text(const std::string& text, const std::string& machine);
  // From a document as the file holds it (tests).
  static RowCosts from_json(const nlohmann::json& file, const std::string& machine);

  std::optional<RowCost> row(const std::string& name) const;
  // The mean set-up and measuring-to-expected ratio of the stage's known rows; false when none.
  bool stage_mean(const std::string& stage, double& setup_s, double& measure_ratio) const;

  // What a row took in this run, blended half and half with what was kept for it.
  void record(const std::string& name, const std::string& stage, const RowCost& cost);
  // This machine's rows merged into `file` (other machines' and other rows' kept).
  nlohmann::json merged_into(nlohmann::json file) const;
  // Written atomically beside the cache sweep; a failure is said on `progress` and costs only the keeping.
  void save(const std::string& path, std::ostream& progress) const;

 private:
  std::string machine_;
  nlohmann::json rows_ = nlohmann::json::object();  // name -> {stage, setup_s, measure_s, expected_measure_s}
};

// $XDG_CACHE_HOME/trainbench/row-costs.json or ~/.cache/trainbench/row-costs.json; "" when neither is set.
std::string row_costs_path();

struct TimeEstimate {
  double seconds = 0;        // the announced time
  double lower_bound = 0;    // the settings' measuring alone
  std::size_t rows = 0;      // rows to time
  std::size_t known = 0;     // rows this machine has run before
  std::size_t by_stage = 0;  // rows estimated from their stage's other rows
};

TimeEstimate estimate_time(const std::vector<Entry>& entries, const Settings& settings, const RowCosts& costs);

// What the run will take, said before it starts: its rows x (repetitions + one calibration) samples of
// at least --min-time (a lower bound), with --max-time an upper bound apart from each row's set-up and
// check, and the estimate from what the rows took here before, set-up and checks included.
std::string expected_time_text(const Settings& settings, const TimeEstimate& estimate);

}  // namespace tb

#include "time_estimate.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>

#include "progress.h"
#include "runtime/defaults.h"
#include "runtime/files.h"

namespace tb {

namespace {

constexpr const char* kSchema = "trainbench-row-costs/1";

double number(const nlohmann::json& o, const char* key) {
  const auto it = o.find(key);
  return it != o.end() && it->is_number() ? it->get<double>() : -1;
}

// A text field, "" when it is absent or not a string (value() would throw its type_error).
std::string text(const nlohmann::json& o, const char* key) {
  const auto it = o.find(key);
  return it != o.end() && it->is_string() ? it->get<std::string>() : "";
}

// The file's own: an object of this schema.
bool ours(const nlohmann::json& file) { return file.is_object() && text(file, "schema") == kSchema; }

// A kept row is used only when every figure is there and sane (a hand-edited file costs the estimate).
bool usable(const nlohmann::json& r) {
  return r.is_object() && !text(r, "stage").empty() && number(r, "setup_s") >= 0 && number(r, "measure_s") >= 0 &&
         number(r, "expected_measure_s") > 0;
}

}  // namespace

double expected_measure_seconds(const Settings& settings) {
  const double all_samples = (settings.repetitions + 1) * settings.min_time_s;
  const double capped = settings.max_time_s > 0 ? std::min(all_samples, settings.max_time_s + settings.min_time_s)
                                                : all_samples;
  return capped + defaults::warmup_s;
}

RowCosts RowCosts::from_json(const nlohmann::json& file, const std::string& machine) {
  RowCosts costs;
  costs.machine_ = machine;
  if (!ours(file)) return costs;
  const auto machines = file.find("machines");
  if (machines == file.end() || !machines->is_object() || !machines->contains(machine)) return costs;
  const nlohmann::json& rows = (*machines)[machine];
  if (!rows.is_object()) return costs;
  for (const auto& [name, r] : rows.items())
    if (usable(r)) costs.rows_[name] = r;
  return costs;
}

RowCosts RowCosts::from_text(const std::string& text, const std::string& machine) {
  return from_json(nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false), machine);
}

RowCosts RowCosts::load(const std::string& path, const std::string& machine) {
  std::ifstream in(path);
  if (path.empty() || !in) return from_json(nlohmann::json(), machine);
  std::stringstream text;
  text << in.rdbuf();
  return from_text(text.str(), machine);
}

std::optional<RowCost> RowCosts::row(const std::string& name) const {
  const auto it = rows_.find(name);
  if (it == rows_.end()) return std::nullopt;
  return RowCost{number(*it, "setup_s"), number(*it, "measure_s"), number(*it, "expected_measure_s")};
}

bool RowCosts::stage_mean(const std::string& stage, double& setup_s, double& measure_ratio) const {
  double setup = 0, ratio = 0;
  int n = 0;
  for (const auto& [name, r] : rows_.items()) {
    if (text(r, "stage") != stage) continue;
    setup += number(r, "setup_s");
    ratio += number(r, "measure_s") / number(r, "expected_measure_s");
    ++n;
  }
  if (n == 0) return false;
  setup_s = setup / n;
  measure_ratio = ratio / n;
  return true;
}

void RowCosts::record(const std::string& name, const std::string& stage, const RowCost& cost) {
  if (!(cost.expected_measure_s > 0) || cost.setup_s < 0 || cost.measure_s < 0) return;
  RowCost kept = cost;
  // Half the last run's and half what was kept: one run on a loaded machine moves the estimate halfway,
  // not all the way. The measuring is blended as a share of what its run's settings asked.
  if (const std::optional<RowCost> before = row(name)) {
    kept.setup_s = (before->setup_s + cost.setup_s) / 2;
    const double ratio = (before->measure_s / before->expected_measure_s + cost.measure_s / cost.expected_measure_s) / 2;
    kept.measure_s = ratio * cost.expected_measure_s;
  }
  rows_[name] = {{"stage", stage},
                 {"setup_s", kept.setup_s},
                 {"measure_s", kept.measure_s},
                 {"expected_measure_s", kept.expected_measure_s}};
}

nlohmann::json RowCosts::merged_into(nlohmann::json file) const {
  if (!ours(file)) file = {{"schema", kSchema}};
  if (!file["machines"].is_object()) file["machines"] = nlohmann::json::object();
  nlohmann::json& mine = file["machines"][machine_];
  if (!mine.is_object()) mine = nlohmann::json::object();
  for (const auto& [name, r] : rows_.items()) mine[name] = r;
  return file;
}

void RowCosts::save(const std::string& path, std::ostream& progress) const {
  if (path.empty() || rows_.empty()) return;
  try {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ifstream in(path);
    const nlohmann::json kept = in ? nlohmann::json::parse(in, nullptr, false) : nlohmann::json();
    write_file_atomically(path, merged_into(kept).dump(1) + "\n");
  } catch (const std::exception& e) {
    progress << "benchsuite: the rows' times were not kept for the next run's estimate (" << path << "): " << e.what()
             << std::endl;
  }
}

std::string row_costs_path() {
  const std::string dir = cache_dir();
  return dir.empty() ? "" : dir + "/row-costs.json";
}

TimeEstimate estimate_time(const std::vector<Entry>& entries, const Settings& settings, const RowCosts& costs) {
  TimeEstimate t;
  const double expected = expected_measure_seconds(settings);
  for (const Entry& e : entries) {
    if (!e.unsupported.empty()) continue;
    ++t.rows;
    t.lower_bound += expected;
    double setup = 0, ratio = 1;
    if (const std::optional<RowCost> kept = costs.row(e.name)) {
      ++t.known;
      setup = kept->setup_s;
      ratio = kept->measure_s / kept->expected_measure_s;
    } else if (costs.stage_mean(e.stage->name, setup, ratio)) {
      ++t.by_stage;
    }
    // A row's measuring scales with what the settings ask (its calls outlasting a sample included,
    // as the kept ratio says); its set-up does not.
    t.seconds += setup + std::max(1.0, ratio) * expected;
  }
  return t;
}

std::string expected_time_text(const Settings& settings, const TimeEstimate& t) {
  std::ostringstream out;
  out << t.rows << " row" << (t.rows == 1 ? "" : "s") << " to time, " << settings.repetitions << " samples of at least "
      << settings.min_time_s << " s each: expect at least " << human_duration(t.lower_bound);
  if (settings.max_time_s > 0) {
    // The cap is heard between samples: the one in hand when it is reached, and a calibration, go over it.
    const double all_samples = (settings.repetitions + 1) * settings.min_time_s;
    const double at_most = std::min(all_samples, settings.max_time_s + 2 * settings.min_time_s) + defaults::warmup_s;
    out << ", at most about " << human_duration(static_cast<double>(t.rows) * at_most) << " with --max-time "
        << settings.max_time_s << " (plus each row's set-up and check, and a call that outlasts a sample)";
  } else {
    out << " (a row whose one call outlasts a sample takes longer: --max-time S caps each row)";
  }
  out << "; about " << human_duration(t.seconds);
  if (t.known == t.rows) out << " with each row's set-up, check and measuring as this machine took them last";
  else if (t.known + t.by_stage > 0)
    out << " with set-up, checks and measuring as this machine took them last (" << t.known << " of " << t.rows
        << " rows known, " << t.by_stage << " from their stage's other rows)";
  else out << " (no row has run on this machine yet: set-up and checks not counted)";
  out << "; the progress lines give an ETA";
  return out.str();
}

}  // namespace tb

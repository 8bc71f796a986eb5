#include "cache_threshold.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "peak/peak.h"
#include "results.h"
#include "runtime/cpu_load.h"
#include "runtime/defaults.h"
#include "runtime/device_info.h"
#include "runtime/files.h"

namespace tb {

namespace {

constexpr const char* kSchema = "trainbench-cache-sweep/1";

std::string mib(double bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(0) << bytes / (1 << 20) << " MiB";
  return out.str();
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

}  // namespace

std::string cache_sweep_path() {
  const std::string dir = cache_dir();
  return dir.empty() ? "" : dir + "/cache-sweep.json";
}

std::string cache_sweep_key() {
  const HostInfo h = host_info();
  std::string model;
  for (char c : h.cpu_model) model += std::isalnum(static_cast<unsigned char>(c)) ? static_cast<char>(std::tolower(c)) : '-';
  return model + "_" + std::to_string(h.cores) + "c_" + std::to_string(h.omp_threads) + "omp_llc" +
         std::to_string(h.l3_bytes);
}

// The file's own: an object of this schema (value() would throw its type_error on a schema of another type).
static bool ours(const nlohmann::json& file) {
  if (!file.is_object()) return false;
  const auto schema = file.find("schema");
  return schema != file.end() && schema->is_string() && schema->get<std::string>() == kSchema;
}

nlohmann::json cache_sweep_document(const std::string& text) {
  nlohmann::json file = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return ours(file) ? file : nlohmann::json::object();
}

const nlohmann::json* kept_sweep(const nlohmann::json& file, const std::string& key) {
  if (!ours(file)) return nullptr;
  const auto machines = file.find("machines");
  if (machines == file.end() || !machines->is_object()) return nullptr;
  const auto entry = machines->find(key);
  if (entry == machines->end() || !entry->is_object() || !entry->contains("threshold_bytes") ||
      !(*entry)["threshold_bytes"].is_number())
    return nullptr;
  return &*entry;
}

CacheThreshold threshold_of(const nlohmann::json& entry, const std::string& path) {
  CacheThreshold t;
  t.bytes = entry["threshold_bytes"].get<double>();
  const auto when = entry.find("measured");
  const std::string measured = when != entry.end() && when->is_string() ? when->get<std::string>() : "an earlier run";
  if (t.bytes > 0)
    t.how = "where a copy's bandwidth fell to DRAM's in this machine's size sweep (" + measured + ", kept in " + path + ")";
  return t;
}

CacheThreshold cpu_cache_threshold(const std::string& path, bool measure_again, std::ostream& progress) {
  nlohmann::json file = nlohmann::json::object();
  const std::string key = cache_sweep_key();
  if (!path.empty()) {
    std::ifstream in(path);
    std::stringstream text;
    if (in) text << in.rdbuf();
    file = cache_sweep_document(text.str());  // unreadable or foreign: measured again and rewritten
    if (!measure_again)
      if (const nlohmann::json* entry = kept_sweep(file, key)) return threshold_of(*entry, path);
  }
  const double reported = static_cast<double>(host_info().l3_bytes);
  double largest = std::max(peak::sweep_largest_bytes, 4 * reported);
  while (largest > 16 * peak::sweep_smallest_bytes && !host_memory_reason(largest).empty()) largest /= 2;
  progress << "benchsuite: finding where this CPU's caches end (a copy over working sets of 1 MiB to " << mib(largest)
           << ", once per machine" << (path.empty() ? "" : ", kept in " + path) << ")" << std::endl;
  const CpuTicks before = read_cpu_ticks();
  // Once others hold the CPUs, the rest of the sweep would only measure the load: it stops there.
  const std::vector<peak::SweepPoint> curve = peak::copy_bandwidth_sweep(largest, [&] {
    return !(others_share(before, read_cpu_ticks()) > defaults::disturbed_share);
  });
  const double others = others_share(before, read_cpu_ticks());
  CacheThreshold t;
  t.bytes = peak::cache_threshold_from_sweep(curve);
  std::ostringstream said;
  said << "benchsuite: copy bandwidth by working set:";
  for (const auto& p : curve)
    said << " " << mib(p.footprint_bytes) << " " << std::fixed << std::setprecision(1) << p.bytes_per_s * 1e-9 << " GB/s;";
  if (!curve.empty()) progress << said.str() << std::endl;
  // An OpenMP copy waits for its slowest thread: with the cores taken by others, the curve shows the
  // load, not the caches. Such a sweep is neither used nor kept.
  if (others > defaults::disturbed_share || curve.size() < 3) {
    progress << "benchsuite: other processes used " << static_cast<int>(100 * others)
             << "% of the CPUs during the sweep: it is not used (nor kept), the cache the CPU reports is" << std::endl;
    return CacheThreshold{};
  }
  if (t.bytes == 0)
    progress << "benchsuite: the copy's bandwidth did not fall over the sweep: the cache the CPU reports is used"
             << std::endl;
  else
    t.how = "where a copy's bandwidth fell to DRAM's in this machine's size sweep (" + today() +
            (path.empty() ? ", this run only" : ", kept in " + path) + ")";
  if (path.empty()) return t;
  nlohmann::json curve_json = nlohmann::json::array();
  for (const auto& p : curve) curve_json.push_back({p.footprint_bytes, p.bytes_per_s});
  file["schema"] = kSchema;
  file["machines"][key] = {{"threshold_bytes", t.bytes},
                           {"measured", today()},
                           {"reported_llc_bytes", reported},
                           {"curve_footprint_bytes_per_s", curve_json}};
  try {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    write_file_atomically(path, file.dump(2) + "\n");
  } catch (const std::exception& e) {
    progress << "benchsuite: the sweep is not kept (" << e.what() << ")" << std::endl;
  }
  return t;
}

}  // namespace tb

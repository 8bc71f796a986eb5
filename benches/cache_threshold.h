// Where this CPU's caches end for the memory-bound rows: the working set from which a copy runs at
// DRAM's bandwidth, found by a size sweep of the copy kernel (peak::copy_bandwidth_sweep) once per
// machine and kept in a small file, so that a row is called cache-resident by what this machine does,
// not by the cache size it reports (a 2-vCPU VM reports its host's 300 MiB L3).
#pragma once

#include <iosfwd>
#include <string>

#include <nlohmann/json.hpp>

namespace tb {

struct CacheThreshold {
  double bytes = 0;  // 0: the sweep could not tell (no fall in bandwidth over the sizes it reached)
  std::string how;   // in words, for the table key and beside the peaks
};

// $XDG_CACHE_HOME/trainbench/cache-sweep.json, or ~/.cache/trainbench/cache-sweep.json; "" when
// neither variable is set.
std::string cache_sweep_path();
// What decides the threshold, as the file's key: CPU model, CPUs, OpenMP threads, reported cache.
std::string cache_sweep_key();

// The document cache-sweep.json holds, from its text: an empty object when the text is not JSON or not such a
// document (then measured again and rewritten).
nlohmann::json cache_sweep_document(const std::string& text);
// The figure kept in `file` (the document cache-sweep.json holds) for `key`, or null when it holds
// none or is not such a document.
const nlohmann::json* kept_sweep(const nlohmann::json& file, const std::string& key);
// The threshold a kept entry says, in words that say where it came from.
CacheThreshold threshold_of(const nlohmann::json& entry, const std::string& path);

// This machine's threshold: from the file at `path` when it holds this machine's key (unless
// `measure_again`), else swept now (saying so on `progress`, a second or two) and kept there,
// written atomically. A sweep during which other processes held the CPUs is neither used nor kept
// (bytes 0: the caller falls back on the reported cache). A file that cannot be written costs only
// the keeping: the run goes on.
CacheThreshold cpu_cache_threshold(const std::string& path, bool measure_again, std::ostream& progress);

}  // namespace tb

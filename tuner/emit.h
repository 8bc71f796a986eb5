// What autotune writes: the chosen configuration with its provenance (device and versions, the
// workload and its digest, the measured throughput with its interval, peak memory and headroom,
// trials and time, runners-up within noise, the speedup over the workload's own configuration), as
// YAML or JSON, or as the keys DeepSpeed, PyTorch Lightning or Hugging Face TrainingArguments read.
// The YAML and JSON document: trainbench_autotune: {chosen, measured, workload_config,
// speedup_over_workload_config, search, runners_up_within_noise, failed_trials, device, workload,
// version, git_commit} (chosen is null, with a note, when nothing ran).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "tuner/search.h"

namespace tb::tune {

enum class OutFormat { yaml, json, deepspeed, lightning, hf };
OutFormat out_format_from_string(const std::string& name);  // throws UsageError

struct TuneOutput {
  nlohmann::json device;  // backend, name, versions
  std::string workload_name, workload_path, workload_digest, workload_source;
  std::string strategy;
  double budget_seconds = 0;
  double grad_clip = 0;
  SearchReport report;
  std::optional<Ranked> baseline;  // the workload's own configuration, measured
  bool confirmed = false;          // best and baseline re-measured back to back after the search
  bool interrupted = false;
};

nlohmann::json to_json(const TuneOutput& out);
std::string emit(const TuneOutput& out, OutFormat format);

}  // namespace tb::tune

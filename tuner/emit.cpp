#include "tuner/emit.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <sstream>

#include "runtime/error.h"
#include "trainbench/build_info.h"
#include "tuner/trial.h"

namespace tb::tune {

using json = nlohmann::ordered_json;

OutFormat out_format_from_string(const std::string& name) {
  if (name == "yaml") return OutFormat::yaml;
  if (name == "json") return OutFormat::json;
  if (name == "deepspeed") return OutFormat::deepspeed;
  if (name == "lightning") return OutFormat::lightning;
  if (name == "hf") return OutFormat::hf;
  throw UsageError("unknown format '" + name + "' (yaml, json, deepspeed, lightning, hf)");
}

static json measured(const TrialResult& r) {
  // Measured back to back with the workload's own configuration after the search, when confirmed.
  return json{{"samples_per_s", r.samples_per_s}, {"ci_low", r.ci_low}, {"ci_high", r.ci_high},
              {"peak_memory_bytes", r.peak_bytes}, {"steps", r.steps}};
}

static json ordered(const TuneOutput& o);

nlohmann::json to_json(const TuneOutput& o) { return nlohmann::json::parse(ordered(o).dump()); }

// In the order a reader wants: the choice and its numbers first, provenance after.
static json ordered(const TuneOutput& o) {
  const SearchReport& rep = o.report;
  json failed = json::array();
  for (const auto& t : rep.trials)
    if (!t.result.ok())
      failed.push_back({{"config", t.candidate.key()}, {"class", to_string(t.result.cls)}, {"message", t.result.message}});
  json runners = json::array();
  for (const auto& r : rep.runners_up) runners.push_back({{"config", to_json(r.candidate)}, {"measured", measured(r.result)}});
  json doc{{"trainbench_autotune", json::object()}};
  json& t = doc["trainbench_autotune"];
  if (rep.found) {
    t["chosen"] = to_json(rep.best.candidate);
    t["measured"] = measured(rep.best.result);
    t["measured"]["headroom"] = rep.headroom;
    t["measured"]["confirmed"] = o.confirmed;
  } else {
    t["chosen"] = nullptr;
    t["note"] = "no configuration ran successfully; see failed_trials";
  }
  if (o.baseline) {
    t["workload_config"] = {{"config", to_json(o.baseline->candidate)},
                            {"measured", o.baseline->result.ok() ? measured(o.baseline->result) : json(nullptr)}};
    if (rep.found && o.baseline->result.ok() && o.baseline->result.samples_per_s > 0)
      t["speedup_over_workload_config"] = rep.best.result.samples_per_s / o.baseline->result.samples_per_s;
  }
  t["search"] = {{"strategy", o.strategy},       {"trials_run", rep.trials_run}, {"trials_total", rep.trials.size()},
                 {"seconds", rep.seconds},       {"budget_seconds", o.budget_seconds},
                 {"budget_exhausted", rep.budget_exhausted}, {"max_micro_batch", rep.max_micro_batch},
                 {"interrupted", o.interrupted}};
  t["runners_up_within_noise"] = runners;
  t["failed_trials"] = failed;
  t["device"] = json::parse(o.device.dump());
  t["workload"] = {{"name", o.workload_name}, {"path", o.workload_path}, {"digest", o.workload_digest},
                   {"source", o.workload_source}};
  t["version"] = build::version;
  t["git_commit"] = build::git_commit;
  return doc;
}

// JSON -> YAML, keeping the key order of the JSON object.
static void emit_yaml(YAML::Emitter& out, const json& j) {
  if (j.is_object()) {
    out << YAML::BeginMap;
    for (const auto& [k, v] : j.items()) {
      out << YAML::Key << k << YAML::Value;
      emit_yaml(out, v);
    }
    out << YAML::EndMap;
  } else if (j.is_array()) {
    out << YAML::BeginSeq;
    for (const auto& v : j) emit_yaml(out, v);
    out << YAML::EndSeq;
  } else if (j.is_null()) {
    out << YAML::Null;
  } else if (j.is_boolean()) {
    out << j.get<bool>();
  } else if (j.is_number_integer()) {
    out << j.get<int64_t>();
  } else if (j.is_number()) {
    std::ostringstream s;
    s.precision(6);
    s << j.get<double>();
    out << s.str();
  } else {
    out << j.get<std::string>();
  }
}

static std::string yaml_text(const json& j, const std::string& comment) {
  YAML::Emitter out;
  emit_yaml(out, j);
  return comment + out.c_str() + "\n";
}

std::string emit(const TuneOutput& o, OutFormat format) {
  const json doc = ordered(o);
  std::ostringstream comment;
  comment << "# autotune: " << o.workload_name << " on " << o.device.value("name", std::string("?"));
  if (o.report.found)
    comment << ", " << o.report.best.result.samples_per_s << " samples/s";
  comment << "\n";
  const Candidate* c = o.report.found ? &o.report.best.candidate : nullptr;
  switch (format) {
    case OutFormat::json: return doc.dump(2) + "\n";
    case OutFormat::yaml: return yaml_text(doc, comment.str());
    case OutFormat::deepspeed: {
      if (!c) throw UsageError("no configuration ran successfully: nothing to write as a DeepSpeed config");
      json ds{{"train_batch_size", c->global_batch},
              {"train_micro_batch_size_per_gpu", c->micro_batch},
              {"gradient_accumulation_steps", c->accumulation()}};
      if (o.grad_clip > 0) ds["gradient_clipping"] = o.grad_clip;
      const auto bf16 = c->switches.find("bf16_matmuls");
      if (bf16 != c->switches.end()) ds["bf16"] = {{"enabled", bf16->second == "on"}};
      return ds.dump(2) + "\n";
    }
    case OutFormat::lightning: {
      if (!c) throw UsageError("no configuration ran successfully: nothing to write as a Lightning config");
      json pl{{"trainer", {{"accumulate_grad_batches", c->accumulation()}}}, {"data", {{"batch_size", c->micro_batch}}}};
      if (o.grad_clip > 0) pl["trainer"]["gradient_clip_val"] = o.grad_clip;
      const auto bf16 = c->switches.find("bf16_matmuls");
      if (bf16 != c->switches.end() && bf16->second == "on") pl["trainer"]["precision"] = "bf16-mixed";
      return yaml_text(pl, comment.str());
    }
    case OutFormat::hf: {
      // Keyword arguments of transformers.TrainingArguments, loadable as
      // `TrainingArguments(output_dir=..., **json.load(f))`. It refuses keywords that are not its fields
      // and JSON has no comments, so the provenance is left out, as in the DeepSpeed config: it is in
      // --format yaml or json.
      if (!c) throw UsageError("no configuration ran successfully: nothing to write as Hugging Face TrainingArguments");
      json hf{{"per_device_train_batch_size", c->micro_batch}, {"gradient_accumulation_steps", c->accumulation()}};
      const auto checkpointing = c->switches.find("activation_checkpointing");
      if (checkpointing != c->switches.end()) hf["gradient_checkpointing"] = checkpointing->second == "on";
      const auto bf16 = c->switches.find("bf16_matmuls");
      if (bf16 != c->switches.end()) hf["bf16"] = bf16->second == "on";
      // TrainingArguments has no for-loop AdamW: per_tensor and foreach both map to adamw_torch, which
      // leaves the choice to torch.optim.AdamW (foreach on CUDA, the for-loop on the CPU).
      const auto optimizer = c->switches.find("optimizer");
      if (optimizer != c->switches.end()) hf["optim"] = optimizer->second == "fused" ? "adamw_torch_fused" : "adamw_torch";
      // Always written: TrainingArguments clips at 1.0 unless told otherwise, and 0 turns clipping off.
      hf["max_grad_norm"] = o.grad_clip;
      return hf.dump(2) + "\n";
    }
  }
  return "";
}

}  // namespace tb::tune

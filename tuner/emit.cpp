#include "tuner/emit.h"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cmath>
#include <iomanip>
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

// "1.031x (95% CI 0.972-1.093 over 6 interleaved rounds)"; without an interval, "1.031x from 1
// interleaved round".
static std::string ratio_text(double ratio, double ci_low, double ci_high, double level, int rounds) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(3) << ratio << "x";
  const std::string round_words = std::to_string(rounds) + " interleaved round" + (rounds == 1 ? "" : "s");
  if (rounds >= 2)
    out << " (" << std::lround(100 * level) << "% CI " << ci_low << "-" << ci_high << " over " << round_words << ")";
  else out << " from " << round_words;
  return out.str();
}

static std::string percent(double fraction) {
  std::ostringstream out;
  out << std::setprecision(3) << 100 * fraction << "%";
  return out.str();
}

Speedup speedup_from_rounds(const PairedRounds& p, double noise_margin, const std::string& against) {
  Speedup s;
  s.ratio = p.ratio;
  s.level = p.level;
  s.rounds = p.rounds;
  if (p.rounds >= 2) {
    s.ci_low = p.ci_low;
    s.ci_high = p.ci_high;
  }
  s.significant = p.faster_beyond(noise_margin);
  const std::string measured = ratio_text(p.ratio, p.ci_low, p.ci_high, p.level, p.rounds);
  if (s.significant) s.note = "the choice runs at " + measured + " " + against + "'s throughput, measured interleaved";
  else if (p.slower_beyond(noise_margin))
    s.note = "the choice is slower than " + against + " beyond noise: " + measured +
             "; it won the tie-break on peak memory among the finalists within noise of the fastest, or " + against +
             " runs without the memory headroom";
  else if (!p.decides())
    s.note = "too few interleaved rounds to judge the choice against " + against + ": " + measured +
             "; no speedup is claimed";
  else
    s.note = "the choice is within noise of " + against + ": " + measured + " does not exclude 1 by the " +
             percent(noise_margin) + " noise margin; keeping " + against + " loses nothing measurable";
  return s;
}

Speedup speedup_from_separate_trials(double ratio, const std::string& why) {
  Speedup s;
  s.ratio = ratio;
  std::ostringstream note;
  note << std::fixed << std::setprecision(3) << "not measured interleaved (" << why << "): " << ratio
       << "x from trials run apart, which compare the machine's drift as much as the configurations; no speedup is claimed";
  s.note = note.str();
  return s;
}

Speedup speedup_of_own_choice(const std::string& against) {
  Speedup s;
  s.note = "the choice is " + against;
  return s;
}

static json measured(const TrialResult& r) {
  // After a race: the median of the interleaved rounds with its distribution-free interval.
  return json{{"samples_per_s", r.samples_per_s},
              {"ci_low", r.ci_low},
              {"ci_high", r.ci_high},
              {"peak_memory_bytes", r.peak_bytes},
              {"steps", r.steps}};
}

// Each finalist with its per-round throughput, its ratio to the leader and what became of it.
// `own_as`: the key that marks the baseline's finalist (workload_config, or versus).
static json race_json(const RaceReport& race, const std::string& own_key, double noise_margin,
                      const std::string& own_as = "workload_config") {
  json finalists = json::array();
  for (std::size_t i = 0; i < race.finalists.size(); ++i) {
    const Finalist& f = race.finalists[i];
    json j{{"config", f.candidate.key()}};
    if (!f.why.empty()) j["raced_as"] = f.why;  // choice, tie, next fastest, best SWITCH=VALUE, own
    if (f.candidate.key() == own_key) j[own_as] = true;
    if (static_cast<int>(i) == race.choice) j["status"] = "chosen";
    else if (f.dropped_after) j["status"] = "dropped after round " + std::to_string(f.dropped_after);
    else j["status"] = "in";
    if (f.dropped_after) j["why"] = f.why_dropped;
    j["samples_per_s_per_round"] = f.per_round();
    if (f.vs_leader.rounds >= 2)
      j["vs_leader"] = {{"ratio", f.vs_leader.ratio}, {"ci_low", f.vs_leader.ci_low}, {"ci_high", f.vs_leader.ci_high}};
    else if (f.vs_leader.rounds == 1) j["vs_leader"] = {{"ratio", f.vs_leader.ratio}};
    finalists.push_back(j);
  }
  return json{{"rounds", race.rounds},        {"max_rounds", race.max_rounds}, {"ended", race.ended},
              {"noise_margin", noise_margin}, {"seconds", race.seconds},       {"finalists", finalists}};
}

static std::string list_text(const std::vector<int64_t>& values, int64_t scale) {
  std::string out;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) out += i + 1 == values.size() ? " and " : ", ";
    out += std::to_string(values[i] * scale);
  }
  return out;
}

std::string searched_batches_text(const GlobalBatchPlan& plan, int64_t ranks) {
  if (plan.pinned) return "searching global batch " + list_text(plan.batches, ranks) + " alone (" + plan.source + ")";
  const std::string what = plan.batches.size() == 1 ? "global batch " : "global batches ";
  return "searching " + what + list_text(plan.batches, ranks) + " (" + plan.source +
         "; --batch N pins one, --batch-range A:B searches others)";
}

static const char* const kConvergenceCaveat =
    "a larger global batch is not free: it takes fewer optimizer steps per epoch and may need another learning rate "
    "or more epochs to reach the same loss, which samples/s does not measure";

std::string global_batch_note(const TuneOutput& o) {
  const GlobalBatchPlan& plan = o.global_batches;
  const int64_t ranks = o.ranks;
  if (!o.report.found || plan.batches.empty()) return "";
  const int64_t chosen = o.report.best.candidate.global_batch;
  std::ostringstream out;
  out << std::fixed << std::setprecision(1);
  if (plan.pinned) {
    out << "global batch " << chosen * ranks << " pinned by " << plan.source
        << ": micro-batch, accumulation and switches were searched for it";
    return out.str();
  }
  if (plan.batches.size() == 1) {
    out << "global batch " << chosen * ranks << " only (" << plan.source << "): give --batch-range A:B to search others";
    return out.str();
  }
  out << "searched global batches " << list_text(plan.batches, ranks) << " (" << plan.source
      << "); the search's best samples/s:";
  for (const auto& r : per_global_batch(o.report.trials, plan.batches)) {
    out << " " << r.global_batch * ranks << ": ";
    if (r.ok_trials) out << r.best_samples_per_s;
    else out << "none ran";
    out << (r.global_batch == plan.batches.back() ? ";" : ",");
  }
  out << " chose " << chosen * ranks;
  if (chosen == o.workload_global_batch) out << ", the workload's own,";
  out << " because its configuration was the fastest measured"
      << (o.race && o.race->rounds > 0 ? " in the race of the finalists" : " by the search (the race measured no round)")
      << " (ties to the least memory); " << kConvergenceCaveat << ": autotune --batch " << o.workload_global_batch * ranks
      << " keeps the workload's own";
  return out.str();
}

nlohmann::json native_executor_json() { return nlohmann::json{{"name", "native"}, {"step", "trainbench's C++ step"}}; }

static json ordered(const TuneOutput& o);

// A candidate as the output states it: with ranks, the global batch of every rank together, and
// the share each rank runs per step.
static json chosen_json(const Candidate& c, int64_t ranks) {
  json j = to_json(c);
  if (ranks > 1) {
    j["global_batch"] = c.global_batch * ranks;
    j["ranks"] = ranks;
    j["per_rank_batch"] = c.global_batch;
  }
  return j;
}

nlohmann::json to_json(const TuneOutput& o) { return nlohmann::json::parse(ordered(o).dump()); }

// The choice with its measured numbers, or the note that nothing ran.
static void add_choice(json& t, const TuneOutput& o) {
  const SearchReport& rep = o.report;
  if (rep.found) {
    t["chosen"] = chosen_json(rep.best.candidate, o.ranks);
    t["measured"] = measured(rep.best.result);
    if (!o.prediction.is_null())
      t["measured"]["of"] = "one rank's share of the batch (global_batch / ranks samples per step), ranks run independently";
    t["measured"]["headroom"] = rep.headroom;
    t["measured"]["confirmed"] = o.confirmed;
    t["measured"]["interleaved_rounds"] = o.confirmed && o.race ? o.race->rounds : 0;
    if (!o.choice_note.empty()) t["choice_note"] = o.choice_note;
  } else {
    t["chosen"] = nullptr;
    t["note"] = "no configuration ran successfully; see failed_trials";
  }
}

// The choice's speedup: inside the `versus` object (speedup, note), or beside the workload's own configuration
// as the document's speedup_* keys.
static void add_speedup(json& into, bool versus, const Speedup& speedup) {
  const std::string prefix = versus ? "" : "speedup_";
  into[versus ? "speedup" : "speedup_over_workload_config"] = speedup.ratio;
  into["speedup_significant"] = speedup.significant;
  if (speedup.rounds >= 2)
    into["speedup_interval"] = {{"ci_low", speedup.ci_low},
                                {"ci_high", speedup.ci_high},
                                {"level", speedup.level},
                                {"interleaved_rounds", speedup.rounds}};
  into[prefix + "note"] = speedup.note;
}

// The baseline (the workload's own configuration, or --versus's) as measured, and the choice's speedup over it:
// from the race's rounds, else from the two trials measured apart.
static void add_baseline(json& t, const TuneOutput& o) {
  const SearchReport& rep = o.report;
  const bool versus = !o.versus.is_null();
  json& base = versus ? (t["versus"] = o.versus) : (t["workload_config"] = json::object());
  base["config"] = chosen_json(o.baseline->candidate, o.ranks);
  base["measured"] = o.baseline->result.ok() ? measured(o.baseline->result) : json(nullptr);
  if (!o.baseline->result.ok())
    base["failed"] = {{"class", to_string(o.baseline->result.cls)}, {"message", o.baseline->result.message}};
  std::optional<Speedup> speedup = o.speedup;
  if (!speedup && rep.found && o.baseline->result.ok() && o.baseline->result.samples_per_s > 0)
    speedup = speedup_from_separate_trials(rep.best.result.samples_per_s / o.baseline->result.samples_per_s,
                                           "no race was run");
  if (rep.found && speedup) add_speedup(versus ? base : t, versus, *speedup);
}

// The global batches searched (every rank's together), the best samples/s the search measured at each, and why
// the choice has the one it has.
static json global_batches_json(const TuneOutput& o) {
  const SearchReport& rep = o.report;
  json per = json::array();
  for (const auto& r : per_global_batch(rep.trials, o.global_batches.batches)) {
    json j{{"global_batch", r.global_batch * o.ranks}, {"ok_trials", r.ok_trials}};
    j["best_samples_per_s"] = r.ok_trials ? json(r.best_samples_per_s) : json(nullptr);
    per.push_back(j);
  }
  std::vector<int64_t> searched;
  for (int64_t g : o.global_batches.batches) searched.push_back(g * o.ranks);
  return json{{"searched", searched},
              {"source", o.global_batches.source},
              {"workload_global_batch", o.workload_global_batch * o.ranks},
              {"chosen", rep.found ? json(rep.best.candidate.global_batch * o.ranks) : json(nullptr)},
              {"per_global_batch", per},
              {"note", global_batch_note(o)}};
}

// How the search went: its strategy, its trials, its time against the budget.
static json search_json(const TuneOutput& o) {
  const SearchReport& rep = o.report;
  // trials_total: every trial in the tune's log; trials_run: the ones the search itself ran now. The
  // difference is the workload's own configuration's trial (run before the search, which reuses it)
  // and, with --resume, the trials replayed from the journal. Race slices are counted in race.rounds.
  const int64_t from_journal_or_own = static_cast<int64_t>(rep.trials.size()) - rep.trials_run;
  json search{{"strategy", o.strategy},
              {"trials_run", rep.trials_run},
              {"trials_total", rep.trials.size()},
              {"trials_note", "trials_total: every trial in the journal of this tune (" + std::to_string(rep.trials.size()) +
                                  "); trials_run: those the search ran in this invocation (" +
                                  std::to_string(rep.trials_run) + "); the other " + std::to_string(from_journal_or_own) +
                                  ": the workload's own configuration, measured before the search, and trials "
                                  "replayed from the journal by --resume; race slices are not trials (race.rounds)"},
              {"seconds", rep.seconds},
              {"budget_seconds", o.budget_seconds},
              {"budget_exhausted", rep.budget_exhausted},
              {"max_micro_batch", rep.max_micro_batch},
              {"interrupted", o.interrupted}};
  if (!o.budget_spent.is_null()) search["budget_spent"] = json::parse(o.budget_spent.dump());
  return search;
}

// The configurations within noise of the choice, each with what it measured.
static json runners_up_json(const TuneOutput& o) {
  json runners = json::array();
  for (const auto& r : o.report.runners_up)
    runners.push_back({{"config", chosen_json(r.candidate, o.ranks)}, {"measured", measured(r.result)}});
  return runners;
}

static json failed_trials_json(const SearchReport& rep) {
  json failed = json::array();
  for (const auto& t : rep.trials)
    if (!t.result.ok())
      failed.push_back({{"config", t.candidate.key()}, {"class", to_string(t.result.cls)}, {"message", t.result.message}});
  return failed;
}

// In the order a reader wants: the choice and its numbers first, provenance after.
static json ordered(const TuneOutput& o) {
  json doc{{"trainbench_autotune", json::object()}};
  json& t = doc["trainbench_autotune"];
  add_choice(t, o);
  if (o.baseline) add_baseline(t, o);
  if (!o.prediction.is_null()) t["prediction"] = json::parse(o.prediction.dump());
  if (!o.global_batches.batches.empty()) t["global_batches"] = global_batches_json(o);
  t["search"] = search_json(o);
  if (o.ranks > 1) t["ranks"] = o.ranks;  // the race's and failed trials' config keys are one rank's share (g=)
  if (o.race)
    t["race"] = race_json(*o.race, o.baseline ? o.baseline->candidate.key() : "", o.noise_margin,
                          o.versus.is_null() ? "workload_config" : "versus");
  t["runners_up_within_noise"] = runners_up_json(o);
  t["failed_trials"] = failed_trials_json(o.report);
  t["executor"] = json::parse(o.executor.dump());
  t["device"] = json::parse(o.device.dump());
  t["workload"] = {{"name", o.workload_name},
                   {"path", o.workload_path},
                   {"digest", o.workload_digest},
                   {"source", o.workload_source}};
  t["version"] = build::version;
  t["git_commit"] = build::git_commit;
  return doc;
}

// YAML 1.1's booleans and nulls (PyYAML's resolver), and anything that starts like a number.
static bool plain_scalar_would_change_type(const std::string& text) {
  static const char* const words[] = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~", ""};
  std::string lower;
  for (char ch : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* w : words)
    if (lower == w) return true;
  const char first = text.empty() ? ' ' : text.front();
  return std::isdigit(static_cast<unsigned char>(first)) || first == '.' || first == '-' || first == '+';
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
    // Quoted where a YAML 1.1 reader (PyYAML) would read the plain word as another type: `off`,
    // `on`, `yes`, `no` as booleans, `null` or `~` as null, digits as numbers. Every switch value
    // then loads as the string it is.
    const std::string text = j.get<std::string>();
    if (plain_scalar_would_change_type(text)) out << YAML::DoubleQuoted << text;
    else out << text;
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
  if (o.report.found) comment << ", " << o.report.best.result.samples_per_s << " samples/s";
  if (o.executor.value("name", std::string()) == "torch")
    comment << ", measured in the PyTorch twin of the step (torch " << o.executor.value("torch", std::string("?")) << ")";
  comment << "\n";
  if (const json& t = doc["trainbench_autotune"]; t.contains("speedup_note"))
    comment << "# " << t["speedup_note"].get<std::string>() << "\n";
  else if (t.contains("versus") && t["versus"].contains("note"))
    comment << "# " << t["versus"]["note"].get<std::string>() << "\n";
  const Candidate* c = o.report.found ? &o.report.best.candidate : nullptr;
  switch (format) {
    case OutFormat::json:
      return doc.dump(2) + "\n";
    case OutFormat::yaml:
      return yaml_text(doc, comment.str());
    case OutFormat::deepspeed: {
      if (!c) throw UsageError("no configuration ran successfully: nothing to write as a DeepSpeed config");
      // DeepSpeed checks train_batch_size = micro x accumulation x world size.
      json ds{{"train_batch_size", c->global_batch * o.ranks},
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
      if (o.ranks > 1) {
        pl["trainer"]["devices"] = o.ranks;  // one node's worth; num_nodes x devices = ranks across nodes
        pl["trainer"]["strategy"] = "ddp";
      }
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
      const auto compile = c->switches.find("compile");  // autotune --entry's torch.compile
      if (compile != c->switches.end()) hf["torch_compile"] = compile->second == "on";
      // Always written: TrainingArguments clips at 1.0 unless told otherwise, and 0 turns clipping off.
      hf["max_grad_norm"] = o.grad_clip;
      return hf.dump(2) + "\n";
    }
  }
  return "";
}

bool CompareOutput::within_noise() const {
  if (!race) return true;  // one configuration
  for (std::size_t f = 1; f < files.size(); ++f) {
    if (raced[f] == raced[0]) continue;
    const PairedRounds p = race->compare(raced[f], raced[0], level);
    if (!p.decides() || p.faster_beyond(noise_margin) || p.slower_beyond(noise_margin)) return false;
  }
  return true;
}

static json ordered(const CompareOutput& o) {
  json configs = json::array(), comparisons = json::array();
  for (std::size_t f = 0; f < o.files.size(); ++f)
    configs.push_back({{"file", o.files[f]}, {"config", to_json(o.configs[f])}});
  for (std::size_t f = 1; f < o.files.size(); ++f) {
    json c{{"of", o.files[f]}, {"against", o.files[0]}};
    if (!o.race || o.raced[f] == o.raced[0]) {
      c["verdict"] = "same_configuration";
    } else {
      const PairedRounds p = o.race->compare(o.raced[f], o.raced[0], o.level);
      c["ratio"] = p.ratio;
      if (p.rounds >= 2) {
        c["ci_low"] = p.ci_low;
        c["ci_high"] = p.ci_high;
        c["level"] = p.level;
      }
      c["interleaved_rounds"] = p.rounds;
      c["verdict"] = !p.decides()                      ? "too_few_rounds"
                     : p.faster_beyond(o.noise_margin) ? "faster"
                     : p.slower_beyond(o.noise_margin) ? "slower"
                                                       : "within_noise";
      c["note"] = o.files[f] + "'s configuration at " + ratio_text(p.ratio, p.ci_low, p.ci_high, p.level, p.rounds) +
                  " the throughput of " + o.files[0] + "'s";
    }
    comparisons.push_back(c);
  }
  json doc{{"trainbench_autotune_compare", json::object()}};
  json& t = doc["trainbench_autotune_compare"];
  t["within_noise"] = o.within_noise();
  t["comparisons"] = comparisons;
  t["configs"] = configs;
  if (o.race) t["race"] = race_json(*o.race, "", o.noise_margin);
  t["interrupted"] = o.interrupted;
  t["executor"] = json::parse(o.executor.dump());
  t["device"] = json::parse(o.device.dump());
  t["workload"] = {{"name", o.workload_name}, {"path", o.workload_path}, {"digest", o.workload_digest}};
  t["version"] = build::version;
  t["git_commit"] = build::git_commit;
  return doc;
}

nlohmann::json to_json(const CompareOutput& o) { return nlohmann::json::parse(ordered(o).dump()); }

std::string emit(const CompareOutput& o, OutFormat format) {
  const json doc = ordered(o);
  switch (format) {
    case OutFormat::json:
      return doc.dump(2) + "\n";
    case OutFormat::yaml:
      return yaml_text(doc, "# autotune --compare: " + o.workload_name + " on " + o.device.value("name", std::string("?")) +
                                "\n");
    default:
      throw UsageError("--compare writes yaml or json");
  }
}

}  // namespace tb::tune

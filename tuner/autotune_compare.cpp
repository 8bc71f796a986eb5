// autotune --compare: tuned files' choices raced interleaved, each against the first's (in one executor, or the
// C++ step against its PyTorch twin); --from: a tuned file's choice written in another format, nothing run.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/device_info.h"
#include "runtime/error.h"
#include "runtime/json_fields.h"
#include "step/workload.h"
#include "tuner/autotune.h"
#include "tuner/autotune_parts.h"
#include "tuner/emit.h"
#include "tuner/journal.h"
#include "tuner/race.h"
#include "tuner/search.h"
#include "tuner/trial.h"

namespace tb::tune {
namespace {

// Runs each candidate in the executor its "executor" switch names, without that switch: what
// `--compare FILE --executor native,torch` races, the C++ step against its PyTorch twin on one
// configuration, interleaved round by round like any two configurations.
class ByExecutor final : public Executor {
 public:
  explicit ByExecutor(std::map<std::string, std::unique_ptr<Executor>> inner) : inner_(std::move(inner)) {}
  TrialResult run(const Candidate& candidate, const MeasurePolicy& policy) override {
    Candidate plain = candidate;
    const std::string which = plain.switches.at(executor_switch);
    plain.switches.erase(executor_switch);
    return inner_.at(which)->run(plain, policy);
  }
  int64_t memory_capacity() const override {
    int64_t least = INT64_MAX;
    for (const auto& [name, e] : inner_) least = std::min(least, e->memory_capacity());
    return least;
  }
  static constexpr const char* executor_switch = "executor";

 private:
  std::map<std::string, std::unique_ptr<Executor>> inner_;
};

// A tuned file's text; UsageError saying that it is not one when it cannot be read.
std::string tuned_file_text(const std::string& path) {
  std::error_code ec;
  const auto type = std::filesystem::status(path, ec).type();
  if (type == std::filesystem::file_type::character || type == std::filesystem::file_type::block ||
      type == std::filesystem::file_type::socket)  // read whole: /dev/zero would never end
    throw UsageError(path + ": not a configuration autotune wrote (a device, not a file)");
  std::ifstream file(path);
  if (!file) throw UsageError(path + ": not a configuration autotune wrote (cannot read it: " + std::strerror(errno) + ")");
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// The document's trainbench_autotune mapping; UsageError when the text is not YAML or holds none.
YAML::Node tuned_document(const std::string& text, const std::string& path) {
  // What it holds is written again as JSON (--from's formats), which takes UTF-8 only; autotune writes nothing else.
  if (!json_field::is_utf8(text)) throw UsageError(path + ": not a configuration autotune wrote (not UTF-8 text)");
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw UsageError(path + ": not a configuration autotune wrote (" + e.what() + ")");
  }
  const YAML::Node t = root.IsMap() ? root["trainbench_autotune"] : YAML::Node();
  if (!t || !t.IsMap() || !t["chosen"] || !t["chosen"].IsMap())
    throw UsageError(path + ": no trainbench_autotune.chosen in it (autotune writes one with --format yaml or json)");
  return t;
}

// --compare's executor: the one --executor names, or with two (native,torch) each configuration run in
// the executor its "executor" switch names.
TrialRunner compare_runner(const std::vector<std::string>& executors, const std::string& executor_name,
                           const step::Workload& workload, const Machine& machine) {
  std::map<std::string, TrialRunner> runners;
  for (const auto& name : executors) runners.emplace(name, make_runner(name, workload, machine));
  if (executors.size() == 1) return std::move(runners.begin()->second);
  TrialRunner runner;
  std::map<std::string, std::unique_ptr<Executor>> inner;
  runner.description = {{"name", executor_name}};
  for (auto& [name, r] : runners) {
    runner.description[name] = r.description;
    runner.torch = runner.torch || r.torch;
    inner.emplace(name, std::move(r.executor));
  }
  runner.executor = std::make_unique<ByExecutor>(std::move(inner));
  return runner;
}

// Each file's configuration (in each executor), and the entrant in the race each is: files holding
// one configuration share it.
std::vector<RaceEntrant> compare_entrants(const std::vector<TunedFile>& tuned, const std::vector<std::string>& executors,
                                          CompareOutput& out) {
  std::vector<RaceEntrant> entrants;
  for (const auto& t : tuned)
    for (const auto& name : executors) {
      Candidate c = t.chosen;
      std::string label = t.path;
      if (executors.size() > 1) {
        c.switches[ByExecutor::executor_switch] = name;
        label += name == "torch" ? " in the PyTorch twin" : " in the C++ step";
      }
      out.files.push_back(label);
      out.configs.push_back(c);
      std::size_t k = 0;
      while (k < entrants.size() && !(entrants[k].candidate == c)) ++k;
      if (k == entrants.size()) entrants.push_back(RaceEntrant{c, TrialResult{}, true});
      out.raced.push_back(k);
    }
  return entrants;
}

// The compared configurations raced to the end (none is dropped: each is compared, none chosen).
void race_compared(const AutotuneOptions& options, const step::Workload& workload, const Machine& machine,
                   TrialRunner& runner, const std::vector<TunedFile>& tuned, const std::vector<RaceEntrant>& entrants,
                   const BudgetClock& clock, CompareOutput& out) {
  const int rounds = std::max(options.race_rounds, 2);
  const bool both_executors = executor_names(options.executor).size() > 1;
  SearchOptions search;
  search.measure.max_seconds = options.trial_seconds;
  Candidate first = entrants.front().candidate;
  first.switches.erase(ByExecutor::executor_switch);
  TrialEstimate shortest = shortest_trial(apply(workload, first), search.measure.min_steps, machine.use_cuda,
                                          machine.device);
  refuse_budget_below_one_trial(workload, first, shortest, search.measure, options.budget, clock.elapsed());
  const double deadline = options.budget - output_reserve(options.budget);
  if (const std::string notice = take_blas_kernel_notice(); !notice.empty()) std::cerr << notice << std::endl;
  std::cerr << "autotune: comparing " << entrants.size() << " configurations of " << workload.name << " on " << machine.name
            << (both_executors ? " in the C++ step and in its PyTorch twin"
                : runner.torch ? " in the PyTorch twin"
                               : "")
            << ", interleaved, " << options.budget << " s budget" << std::endl;
  for (const auto& t : tuned) std::cerr << "autotune:   " << t.path << ": " << describe(t.chosen) << std::endl;
  RaceOptions ro = race_options(
      search, rounds, options.trial_seconds, [&] { return deadline - clock.elapsed(); }, shortest.seconds,
      [&] { return clock.elapsed(); }, options.budget);
  ro.on_drop = nullptr;  // every configuration is measured to the end: each is compared, none is chosen
  ro.min_rounds_to_drop = rounds + 1;
  try {
    out.race = race(*runner.executor, entrants, ro);
    std::cerr << "autotune: the race ended after " << out.race->rounds << " round" << (out.race->rounds == 1 ? "" : "s")
              << ": " << out.race->ended << std::endl;
  } catch (const Interrupted&) {
    out.interrupted = true;
    std::cerr << "autotune: interrupted by " << stop_signal_name() << "; nothing was compared" << std::endl;
  }
}

// Each comparison's verdict on stderr, as the written output holds it.
void print_comparisons(const CompareOutput& out) {
  const nlohmann::json doc = to_json(out);  // named: the loop below reads inside it
  for (const auto& c : doc["trainbench_autotune_compare"]["comparisons"]) {
    const std::string verdict = c["verdict"], of = c["of"], against = c["against"];
    if (verdict == "same_configuration") std::cerr << "autotune: " << of << " holds the same configuration as " << against;
    else
      std::cerr << "autotune: " << c["note"].get<std::string>() << ": "
                << (verdict == "within_noise"     ? "within noise"
                    : verdict == "too_few_rounds" ? "too few rounds to tell"
                                                  : verdict + " beyond noise");
    std::cerr << std::endl;
  }
}

}  // namespace

// "native,torch" -> {"native", "torch"}.
std::vector<std::string> executor_names(const std::string& text) {
  std::vector<std::string> names;
  std::stringstream in(text);
  for (std::string name; std::getline(in, name, ',');) names.push_back(name);
  return names;
}

// A text of the document as --from writes it again (JSON: UTF-8 only). yaml-cpp decodes the escapes "\_" and "\N" to
// single bytes (0xA0, 0x85), not UTF-8, so what it decoded is checked, not only the file.
static std::string utf8_text(const YAML::Node& node, const std::string& path) {
  std::string text = node.as<std::string>();
  if (!json_field::is_utf8(text))
    throw UsageError(path + ": not a configuration autotune wrote (a text that is not UTF-8 at line " +
                     std::to_string(node.Mark().line + 1) + ")");
  return text;
}

// --compare's part of a tuned document (its trainbench_autotune mapping).
static TunedFile tuned_file_of(const YAML::Node& t, const std::string& path) {
  TunedFile f;
  f.path = path;
  try {
    f.chosen.global_batch = t["chosen"]["global_batch"].as<int64_t>();
    f.chosen.micro_batch = t["chosen"]["micro_batch"].as<int64_t>();
    f.chosen.switches = t["chosen"]["switches"].as<std::map<std::string, std::string>>();
    for (const auto& [name, value] : f.chosen.switches)
      if (!json_field::is_utf8(name) || !json_field::is_utf8(value))
        throw UsageError(path + ": not a configuration autotune wrote (a switch that is not UTF-8 text)");
    f.workload_path = utf8_text(t["workload"]["path"], path);
    f.workload_digest = utf8_text(t["workload"]["digest"], path);
  } catch (const YAML::Exception& e) {
    throw UsageError(path + ": not a configuration autotune wrote (" + e.what() + ")");
  }
  if (f.chosen.global_batch <= 0 || f.chosen.micro_batch <= 0 || f.chosen.global_batch % f.chosen.micro_batch)
    throw UsageError(path + ": its micro-batch does not divide its global batch");
  return f;
}

TunedFile parse_tuned_file(const std::string& text, const std::string& path) {
  return tuned_file_of(tuned_document(text, path), path);
}

// The loader as the formats write it (emit.cpp): a count of workers and, with workers, a prefetch factor, from the
// chosen dataloader or else from the data switches. UsageError for a file that holds something else there.
static void refuse_loader_the_formats_cannot_write(const TuneOutput& out, const std::string& path) {
  const auto is_count = [](const std::string& text) {
    return !text.empty() && text.size() <= 9 && text.find_first_not_of("0123456789") == std::string::npos;
  };
  const auto& switches = out.report.best.candidate.switches;
  for (const char* name : {"num_workers", "prefetch_factor"})
    if (const auto it = switches.find(name); it != switches.end() && !is_count(it->second))
      throw UsageError(path + ": its switch " + name + "=" + it->second + " is not a count");
  const nlohmann::json& d = out.dataloader;
  if (!d.is_object()) return;
  const auto count_at_least = [&](const char* key, int64_t least) {
    return d.contains(key) && d[key].is_number_integer() && d[key].get<int64_t>() >= least;
  };
  const bool workers = count_at_least("num_workers", 1);
  if ((d.contains("num_workers") && !count_at_least("num_workers", 0)) || (workers && !count_at_least("prefetch_factor", 1)))
    throw UsageError(path +
                     ": its chosen dataloader needs num_workers (0 or more) and, with workers, a prefetch_factor "
                     "of 1 or more");
}

TuneOutput tuned_output_from_text(const std::string& text, const std::string& path) {
  const YAML::Node t = tuned_document(text, path);
  const TunedFile f = tuned_file_of(t, path);
  TuneOutput out;
  out.report.found = true;
  out.report.best.candidate = f.chosen;
  bool says_grad_clip = false;
  try {
    out.ranks = t["ranks"] ? t["ranks"].as<int64_t>() : 1;
    if (out.ranks > 1) out.report.best.candidate.global_batch = t["chosen"]["per_rank_batch"].as<int64_t>();
    if (t["measured"] && t["measured"]["samples_per_s"])
      out.report.best.result.samples_per_s = t["measured"]["samples_per_s"].as<double>();
    out.device = {{"backend", utf8_text(t["device"]["backend"], path)}, {"name", utf8_text(t["device"]["name"], path)}};
    const YAML::Node executor = t["executor"];
    out.executor = {{"name", utf8_text(executor["name"], path)}};
    for (const char* key : {"launcher", "torch"})
      if (executor[key] && executor[key].IsScalar()) out.executor[key] = utf8_text(executor[key], path);
    out.workload_name = utf8_text(t["workload"]["name"], path);
    // The loader's settings as the tune ran them (the model's threads a number): the formats write them
    const YAML::Node loader = t["chosen"]["dataloader"];
    if (loader && loader.IsMap()) {
      out.dataloader = nlohmann::json::object();
      for (const char* key : {"num_workers", "prefetch_factor", "cpu_threads"})
        if (loader[key] && !loader[key].IsNull()) out.dataloader[key] = loader[key].as<int64_t>();
        else if (loader[key]) out.dataloader[key] = nullptr;
      for (const char* key : {"persistent_workers", "pin_memory"})
        if (loader[key] && !loader[key].IsNull()) out.dataloader[key] = loader[key].as<bool>();
    }
    says_grad_clip = static_cast<bool>(t["workload"]["grad_clip"]);
    if (says_grad_clip) out.grad_clip = t["workload"]["grad_clip"].as<double>();
  } catch (const YAML::Exception& e) {
    throw UsageError(path + ": not a configuration autotune wrote (" + e.what() + ")");
  }
  if (out.report.best.candidate.global_batch <= 0 ||
      out.report.best.candidate.global_batch % out.report.best.candidate.micro_batch)
    throw UsageError(path + ": its micro-batch does not divide its per-rank batch");
  // The formats write the global batch again as the per-rank batch x the ranks: as autotune wrote them, that product
  // is the file's own global batch (and so no overflow).
  const int64_t per_rank = out.report.best.candidate.global_batch;
  if (out.ranks < 1 ||
      (out.ranks > 1 && (f.chosen.global_batch % out.ranks || f.chosen.global_batch / out.ranks != per_rank)))
    throw UsageError(path + ": its global batch (" + std::to_string(f.chosen.global_batch) +
                     ") is not its per-rank batch (" + std::to_string(per_rank) + ") x its ranks (" +
                     std::to_string(out.ranks) + ")");
  refuse_loader_the_formats_cannot_write(out, path);
  if (!says_grad_clip)
    std::cerr << "autotune: " << path << " does not say the gradient clipping (an older autotune wrote it): the "
              << "output clips nothing; set it by hand if the workload clips" << std::endl;
  return out;
}

// The journal of a tuned file for its page: the one it names (as written, else beside the file), else the default
// beside it (tuned.yaml -> tuned.autotune.jsonl); "" when none is there.
static std::string journal_of(const std::string& tuned_path) {
  namespace fs = std::filesystem;
  const fs::path tuned(tuned_path);
  std::vector<fs::path> candidates;
  try {
    const YAML::Node named = YAML::LoadFile(tuned_path)["trainbench_autotune"]["journal"];
    if (named && named.IsScalar()) {
      candidates.emplace_back(named.as<std::string>());
      candidates.push_back(tuned.parent_path() / fs::path(named.as<std::string>()).filename());
    }
  } catch (const YAML::Exception&) {
    // tune-page says what is wrong with the file
  }
  candidates.push_back(tuned.parent_path() / (tuned.stem().string() + ".autotune.jsonl"));
  std::error_code ec;
  for (const auto& c : candidates)
    if (fs::is_regular_file(c, ec)) return c.string();
  return "";
}

int emit_tuned_file(const AutotuneOptions& options) {
  const bool page_only = !options.report_path.empty() && !options.format_given;
  if (page_only && !options.out_path.empty())
    throw UsageError("--from " + options.from_file + " --report writes the page; --out needs a --format to write");
  if (!page_only && (options.format == OutFormat::yaml || options.format == OutFormat::json))
    throw UsageError("--from " + options.from_file +
                     ": it is autotune's own document already; give --format deepspeed, lightning, hf or accelerate, "
                     "or --report PAGE.html");
  if (!options.report_path.empty()) {
    const std::string journal = journal_of(options.from_file);
    if (journal.empty())
      std::cerr << "autotune: no journal found for " << options.from_file
                << ": the page shows what the tuned file holds (its finalists and failed trials), not every trial"
                << std::endl;
    if (!write_tune_page(options.from_file, journal, options.report_path)) return 1;
    std::cerr << "autotune: the page of " << options.from_file << ": " << options.report_path << std::endl;
    if (page_only) return 0;
  }
  return write_output(emit(tuned_output_from_text(tuned_file_text(options.from_file), options.from_file), options.format),
                      options.out_path)
             ? 0
             : 1;
}

int compare_tuned(const AutotuneOptions& options) {
  const BudgetClock clock;
  const std::vector<std::string> executors = executor_names(options.executor);
  if (options.compare_files.size() * executors.size() < 2)
    throw UsageError(
        "--compare: give two tuned files or more, or one with --executor native,torch (the C++ step "
        "against its PyTorch twin)");
  if (options.format != OutFormat::yaml && options.format != OutFormat::json)
    throw UsageError("--compare writes --format yaml or json");
  std::vector<TunedFile> tuned;
  for (const auto& p : options.compare_files) tuned.push_back(parse_tuned_file(tuned_file_text(p), p));
  // The workload the files were tuned for, unless --workload names it; either way the files'.
  const step::Workload workload = step::load_workload(options.workload_given ? options.workload
                                                                             : tuned.front().workload_path);
  const std::string workload_digest = digest(file_text(workload.path));
  for (const auto& t : tuned)
    if (t.workload_digest != workload_digest)
      throw UsageError(t.path + " was tuned for another workload file (digest " + t.workload_digest + ", " + workload.path +
                       " has " + workload_digest + ")");
  const Machine machine = pick_machine(options.gpu);
  // One runner per executor; with two, every file's configuration is raced in each.
  TrialRunner runner = compare_runner(executors, options.executor, workload, machine);
  // Names and values: a value the tune could not have chosen (a hand-edited "sync: every_n:x") would reach the step's
  // own parsing of it (apply(), std::stoll) in the race.
  const auto available = available_switches(workload, machine.use_cuda);
  for (const auto& t : tuned)
    for (const auto& [name, value] : t.chosen.switches) {
      const auto values = available.find(name);
      if (values == available.end())
        throw UsageError(t.path + ": its configuration sets " + name + ", which " + workload.name + " does not have on " +
                         machine.backend);
      if (std::find(values->second.begin(), values->second.end(), value) == values->second.end()) {
        std::string known;
        for (const auto& v : values->second) known += (known.empty() ? "" : ", ") + v;
        throw UsageError(t.path + ": its configuration sets " + name + "=" + value + ", which " + workload.name +
                         " does not have on " + machine.backend + " (" + name + ": " + known + ")");
      }
    }
  CompareOutput out;
  out.device = machine.description;
  out.executor = runner.description;
  out.workload_name = workload.name;
  out.workload_path = workload.path;
  out.workload_digest = workload_digest;
  const std::vector<RaceEntrant> entrants = compare_entrants(tuned, executors, out);
  if (entrants.size() >= 2) race_compared(options, workload, machine, runner, tuned, entrants, clock, out);
  const bool written = write_output(emit(out, options.format), options.out_path);
  print_comparisons(out);
  if (out.interrupted || stop_requested) return interrupted_exit_code();
  if ((out.race && out.race->rounds == 0) || !written) return 1;
  return 0;
}

}  // namespace tb::tune

// benchsuite: run the stage benchmarks and print what they measured, with % of this machine's
// measured peaks and the declared pairs' ratios. Exit codes: 0 done, 1 a variant was incorrect or a
// benchmark failed, 2 bad usage, 130 interrupted by Ctrl-C (SIGINT), 143 by SIGTERM (what was measured
// is still written).
#include <benchmark/benchmark.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <cmath>
#include <csignal>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cache_threshold.h"
#include "harness.h"
#include "torch_rows.h"
#include "runtime/comm.h"
#include "runtime/defaults.h"
#include "runtime/device_info.h"
#include "runtime/error.h"
#include "runtime/files.h"
#include "trainbench/build_info.h"

namespace {

constexpr const char* examples = R"(
Examples:
  benchsuite --quick                          every stage, small sizes, few repetitions
  benchsuite --filter cg --quick              try first: the cg rows at small sizes (27 s on a 2-core CPU)
  benchsuite --filter cg                      only benchmarks whose name matches 'cg' (about 10 min there)
  benchsuite --filter cg --max-time 5         each row's measurement stopped after 5 s (set-up and check not counted)
  benchsuite --filter 'peak/cpu/(copy|triad)' --repetitions 20
  benchsuite --backend cpu --axis peak.n=1e6,1e7 --out peak.json
  benchsuite --list                           stages, variants, axes, and why a variant cannot run here
  benchsuite --list --format json --quick     the same for programs, with the benchmarks --quick would run
  benchsuite --filter peak --benchmark_min_warmup_time=0.1   Google Benchmark flags pass through
  benchsuite --backend cpu,torch --quick --filter adamw   beside each row, PyTorch's own way of it
  mpirun -n 2 benchsuite --filter allreduce --backend cpu  the gradient all-reduce across 2 ranks (MPI)
  mpirun -n 8 benchsuite --filter allreduce --backend cuda one process per GPU (NCCL)

Benchmarks are named stage/backend/variant/problem, e.g. peak/cpu/triad/n=33554432.
)";

// Why a variant cannot run on this machine, whatever the problem; empty when it can.
std::string unavailable_here(const tb::Variant& v) {
  const auto& cuda = tb::cuda_status();
  if (v.backend == tb::Backend::cuda && !cuda.built) return "built without CUDA";
  if (v.backend == tb::Backend::cuda && !cuda.available()) return "no usable CUDA device";
  if (!v.make) return "not built";
  return "";
}

void list_registry(const tb::Registry& registry, std::ostream& out) {
  const auto& cuda = tb::cuda_status();
  if (cuda.available()) {
    for (const auto& g : cuda.devices)
      out << "CUDA device " << g.index << ": " << g.name << " (sm_" << g.compute_capability << ", " << g.sms << " SMs)\n";
  } else {
    out << "CUDA variants cannot run here: " << cuda.unavailable_reason << "\n";
  }
  out << "\n";
  for (const auto& stage : registry.stages()) {
    out << stage.name << ": " << stage.question << "  [" << stage.source << "]\n";
    for (const auto& axis : stage.axes) {
      out << "  axis " << axis.name << " = ";
      for (std::size_t i = 0; i < axis.values.size(); ++i) out << (i ? "," : "") << axis.values[i];
      if (!axis.quick_values.empty() && axis.quick_values != axis.values) {
        out << " (quick: ";
        for (std::size_t i = 0; i < axis.quick_values.size(); ++i) out << (i ? "," : "") << axis.quick_values[i];
        out << ")";
      }
      out << "  " << axis.help << "\n";
    }
    for (const auto& v : stage.variants) {
      out << "  " << tb::to_string(v.backend) << "/" << v.id << ": " << v.rationale;
      const std::string why = unavailable_here(v);
      if (!why.empty()) out << "  [unavailable here: " << why << "]";
      out << "\n";
    }
    for (const auto& p : stage.pairs) out << "  pair: " << p.label << " (" << p.baseline << " -> " << p.improved << ")\n";
  }
}

// The list for programs (`--list --format json`): every stage with its axes, variants and pairs, and
// the benchmarks that the other flags select (--backend, --quick, --axis, --filter), each with its
// problem's values and the work one call does. A runner outside this binary (the torch rows) then
// measures exactly these problems and rates them by the same bytes and FLOPs: the sizes never drift.
// With `torch_device` ("cpu" or "cuda": --backend ...,torch), also the PyTorch rows that stand beside the
// selected ones ("torch"): what scripts/torch-peers measures.
nlohmann::json list_json(const tb::Registry& registry, tb::Settings settings, const std::string& torch_device = "") {
  using nlohmann::json;
  const auto& cuda = tb::cuda_status();
  json devices = json::array();
  for (const auto& g : cuda.devices)
    devices.push_back({{"index", g.index}, {"name", g.name}, {"compute_capability", g.compute_capability}, {"sms", g.sms}});
  json stages = json::array();
  for (const auto& stage : registry.stages()) {
    json axes = json::array(), variants = json::array(), pairs = json::array();
    for (const auto& a : stage.axes)
      axes.push_back({{"name", a.name}, {"values", a.values},
                      {"quick_values", a.quick_values.empty() ? a.values : a.quick_values}, {"help", a.help}});
    for (const auto& v : stage.variants) {
      json j{{"id", v.id}, {"backend", tb::to_string(v.backend)}, {"rationale", v.rationale}, {"axes", v.axes}};
      const std::string why = unavailable_here(v);
      j["available"] = why.empty();
      if (!why.empty()) j["unavailable_reason"] = why;
      if (!v.provides_peak.empty()) j["provides_peak"] = v.provides_peak;
      variants.push_back(j);
    }
    for (const auto& p : stage.pairs) pairs.push_back({{"label", p.label}, {"baseline", p.baseline}, {"improved", p.improved}});
    stages.push_back({{"name", stage.name}, {"question", stage.question}, {"source", stage.source}, {"axes", axes},
                      {"variants", variants}, {"pairs", pairs}});
  }
  settings.peak_prepass = false;  // the rows asked for, not the peaks a run would add
  json benchmarks = json::array();
  const auto entries = tb::select_entries(registry, settings);
  for (const auto& e : entries) {
    json problem = json::object();
    for (const auto& [key, value] : e.problem.params()) problem[key] = value;
    json b{{"name", e.name}, {"stage", e.stage->name}, {"backend", tb::to_string(e.variant->backend)},
           {"variant", e.variant->id}, {"problem", problem}};
    if (!e.unsupported.empty()) {
      b["unsupported"] = e.unsupported;
    } else {
      const tb::Work w = e.variant->work(e.problem);
      b["work"] = {{"bytes", w.bytes}, {"flops", w.flops}, {"bound", w.bound == tb::Work::Bound::memory ? "memory" : "compute"},
                   {"peak_key", w.peak_key}, {"footprint_bytes", w.footprint_bytes > 0 ? w.footprint_bytes : w.bytes}};
    }
    benchmarks.push_back(b);
  }
  json constants = tb::generator_constants();
  json doc{{"schema", "trainbench-list/1"},
          {"version", tb::build::version},
          {"quick", settings.quick},
          {"cuda", {{"built", cuda.built}, {"available", cuda.available()}, {"unavailable_reason", cuda.unavailable_reason},
                    {"devices", devices}}},
          {"stages", stages},
          {"constants", constants},
          {"benchmarks", benchmarks}};
  if (!torch_device.empty()) doc["torch"] = tb::torch_benches_json(tb::torch_benches(entries, torch_device), torch_device);
  return doc;
}

tb::Format format_for_path(const std::string& path) {
  auto ends_with = [&](const char* ext) {
    const std::string e(ext);
    return path.size() >= e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0;
  };
  if (ends_with(".csv")) return tb::Format::csv;
  if (ends_with(".md")) return tb::Format::md;
  if (ends_with(".txt")) return tb::Format::console;
  return tb::Format::json;
}

// A check for a numeric option that says what is wrong with the value typed, in the words of what it
// counts ("--repetitions: 'abc' is not a whole number of samples (1 to 100000)"), where CLI11's own
// says "Value abc not in range" whatever the fault. A whole number is passed on in plain digits.
CLI::Validator number_check(const std::string& what, const std::string& allowed, double least, double most, bool whole) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double value = 0;
        if (!tb::parse_number(text, value) || (whole && value != std::floor(value)) || value < least || value > most)
          return "'" + text + "' is not " + what + " (" + allowed + ")";
        if (whole) text = std::to_string(static_cast<long long>(value));
        return "";
      },
      allowed);
}

// Google Benchmark's own flags go to it; everything else is ours.
void split_arguments(int argc, char** argv, std::vector<std::string>& ours, std::vector<std::string>& theirs) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    (arg.rfind("--benchmark_", 0) == 0 ? theirs : ours).push_back(arg);
  }
}

int run(int argc, char** argv) {
  std::vector<std::string> ours, gbench_args;
  split_arguments(argc, argv, ours, gbench_args);

  tb::Settings settings;
  std::string backend = "auto", format_name, out_path, torch_inputs_dir;
  std::vector<std::string> axis_texts;
  bool list = false, no_prepass = false, cache_sweep = false;
  int repetitions = 0;
  double min_time = 0;
  int device = -1;

  CLI::App app{"trainbench benchsuite: the training hot path, one stage at a time, measured on this machine"};
  app.footer(std::string(examples) + "\n" + tb::table_key_help());
  app.set_version_flag("--version", std::string(tb::build::version) + " (" + tb::build::git_commit + ")");
  app.add_option("--filter", settings.filter, "Run benchmarks whose name matches this regular expression");
  app.add_option("--backend", backend,
                 "cpu, cuda, auto (cuda when a GPU is usable, else cpu) or all; with ,torch (cpu,torch, cuda,torch) "
                 "also the stages done the PyTorch way (scripts/torch-peers), with PyTorch -> PyTorch and "
                 "PyTorch -> trainbench pairs")
      ->check([](const std::string& text) -> std::string {
        std::string native;
        std::size_t start = 0;
        while (start <= text.size()) {
          const std::size_t comma = text.find(',', start);
          const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
          if (item != "cpu" && item != "cuda" && item != "auto" && item != "all" && item != "torch")
            return "'" + item + "' is not a backend: cpu, cuda, auto, all, torch";
          if (item != "torch") {
            if (!native.empty()) return "one of cpu, cuda, auto, all (and torch), not " + native + " and " + item;
            native = item;
          }
          if (comma == std::string::npos) break;
          start = comma + 1;
        }
        return "";
      });
  app.add_option("--device", device, "CUDA device index")
      ->transform(number_check("a CUDA device index", "0 or more", 0, 1e6, true));
  app.add_flag("--quick", settings.quick, "Small sizes, 3 repetitions, short samples");
  app.add_option("--repetitions", repetitions, "Samples per benchmark (default 10, 3 with --quick)")
      ->transform(number_check("a whole number of samples", "1 to 100000", 1, 100000, true));
  app.add_option("--min-time", min_time, "Seconds per repetition (default 0.2, 0.05 with --quick)")
      ->transform(number_check("a number of seconds", "above 0, at most 3600", 1e-6, 3600, false));
  app.add_flag("--cold", settings.cold, "Flush the L2 (GPU) or last-level cache (CPU) before every timed call");
  app.add_option("--noise-target", settings.noise_target,
                 "Flag a result as noisy when its CI half-width exceeds this fraction of the median")
      ->transform(number_check("a fraction of the median", "0 to 1", 0, 1, false));
  app.add_option("--axis", axis_texts, "Problem sizes: STAGE.AXIS=V1[,V2...], repeatable (see --list)");
  app.add_flag("--list", list,
               "List stages, axes, variants and pairs, and why a variant cannot run here (--format json: also the benchmarks "
               "--backend, --quick, --axis and --filter select, with their problems and work, for programs)");
  app.add_option("--out", out_path, "Write the results to this file (format from --format or the extension)");
  app.add_option("--format", format_name, "console, json, csv or md (default: console on stdout, json for --out)")
      ->check(CLI::IsMember({"console", "json", "csv", "md"}));
  app.add_flag("--no-peak-prepass", no_prepass, "Do not measure the peaks that filtered rows are compared with");
  app.add_flag("--cache-sweep", cache_sweep,
               "Find again where this CPU's caches end (a copy over growing working sets; otherwise done once per "
               "machine and kept under ~/.cache/trainbench)");
  app.add_option("--max-time", settings.max_time_s,
                 "Seconds a row may measure before it stops with the samples it has, after its first (as nvbench's "
                 "--timeout); the rows it cut short are listed under the table (default: no limit)")
      ->transform(number_check("a number of seconds", "0.001 to 1e7", 1e-3, 1e7, false));
  app.add_option("--torch-inputs", torch_inputs_dir,
                 "Read a listing with PyTorch rows (--backend ...,torch --list --format json) on stdin, write the "
                 "inputs its rows read under DIR, drawn by the stages' own generators, print the listing with each "
                 "row's inputs and exit: what a run hands scripts/torch-peers")
      ->type_name("DIR");

  std::vector<std::string> reversed(ours.rbegin(), ours.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "benchsuite: " << e.what() << "\nRun 'benchsuite --help' for the options." << std::endl;
    return 2;
  }

  if (!torch_inputs_dir.empty()) {
    nlohmann::json listing;
    try {
      std::cin >> listing;
    } catch (const nlohmann::json::exception& e) {
      throw tb::UsageError(std::string("--torch-inputs: stdin is not a JSON listing (") + e.what() + ")");
    }
    tb::attach_torch_inputs(listing, torch_inputs_dir);
    std::cout << listing.dump(1) << std::endl;
    return 0;
  }

  // The axes are checked before anything else uses them: a console --list refuses what a run would.
  const tb::Registry& registry = tb::builtin_registry();
  for (const auto& text : axis_texts) {
    settings.overrides.push_back(tb::parse_axis_override(registry, text));
    if (const auto& repeated = settings.overrides.back().repeated; !repeated.empty()) {
      std::string dropped;
      for (const auto& value : repeated) dropped += (dropped.empty() ? "" : ", ") + value;
      std::cerr << "benchsuite: --axis '" << text << "': a value given more than once runs once (dropped: " << dropped
                << ")" << std::endl;
    }
  }
  const bool list_json_wanted =
      format_name == "json" || (format_name.empty() && !out_path.empty() && format_for_path(out_path) == tb::Format::json);
  if (list && !list_json_wanted) {
    if (!out_path.empty() || (!format_name.empty() && format_name != "console"))
      throw tb::UsageError("--list is written as text on stdout, or as JSON (--format json, or --out FILE.json)");
    list_registry(registry, std::cout);
    return 0;
  }
  // A file that cannot be written is said now, not after the run has measured everything it would hold.
  if (!out_path.empty()) tb::check_output_path(out_path, "--out");

  // Google Benchmark parses its flags; --benchmark_repetitions / _min_time feed our settings, since
  // per-benchmark settings would otherwise override them.
  std::vector<char*> gb_argv{argv[0]};
  for (auto& a : gbench_args) {
    gb_argv.push_back(a.data());
    const auto eq = a.find('=');
    const std::string key = a.substr(0, eq), value = eq == std::string::npos ? "" : a.substr(eq + 1);
    double number = 0;
    if (key == "--benchmark_repetitions" && tb::parse_number(value, number) && number >= 1)
      repetitions = static_cast<int>(number);
    if (key == "--benchmark_min_time" && tb::parse_number(value.substr(0, value.find_first_of("sx")), number) &&
        value.find('x') == std::string::npos && number > 0)
      min_time = number;
  }
  int gb_argc = static_cast<int>(gb_argv.size());
  benchmark::Initialize(&gb_argc, gb_argv.data());
  if (benchmark::ReportUnrecognizedArguments(gb_argc, gb_argv.data())) return 2;

  settings.repetitions = repetitions ? repetitions : (settings.quick ? tb::defaults::quick_repetitions : tb::defaults::repetitions);
  settings.min_time_s = min_time > 0 ? min_time : (settings.quick ? tb::defaults::quick_min_time_s : tb::defaults::min_time_s);
  settings.peak_prepass = !no_prepass;

  // ",torch": the PyTorch rows too, on the native backend's device (torch alone: auto's).
  bool with_torch = false;
  if (const auto at = backend.find("torch"); at != std::string::npos) {
    with_torch = true;
    backend.erase(at, 5);
    if (!backend.empty() && backend.front() == ',') backend.erase(0, 1);
    if (!backend.empty() && backend.back() == ',') backend.pop_back();
    if (backend.empty()) backend = "auto";
  }
  const auto& cuda = tb::cuda_status();
  if (backend == "auto") {
    settings.backends = {cuda.available() ? tb::Backend::cuda : tb::Backend::cpu};
    if (!cuda.available()) std::cerr << "benchsuite: " << cuda.unavailable_reason << "; using the CPU backend" << std::endl;
  } else if (backend == "all") {
    settings.backends = {tb::Backend::cpu, tb::Backend::cuda};
  } else {
    settings.backends = {tb::backend_from_string(backend)};
  }
  // Under mpirun (the collective stages): rank 0 reports, the others measure in step and stay quiet;
  // each rank drives its own GPU unless --device says otherwise.
  const int ranks = tb::comm::launched_ranks();
  const bool leader = tb::comm::launched_rank() == 0;
  if (ranks > 1 && with_torch) throw tb::UsageError("--backend ...,torch runs on one rank: run it without mpirun");
  if (device < 0 && ranks > 1 && cuda.available() && tb::comm::world_unavailable_reason().empty())
    device = tb::comm::world().local_rank() % static_cast<int>(cuda.devices.size());
  if (device >= 0) {
    settings.cuda_device = device;
    tb::select_cuda_device(device);  // a device that does not exist is bad usage
  }

  // The PyTorch rows run on the native backend's device: the GPU's with cuda (where there is one).
  const std::string torch_device = std::find(settings.backends.begin(), settings.backends.end(), tb::Backend::cuda) !=
                                               settings.backends.end() && cuda.available() ? "cuda" : "cpu";
  if (list) {  // as JSON: after the flags that select benchmarks
    const std::string text = list_json(registry, settings, with_torch ? torch_device : "").dump(2) + "\n";
    if (out_path.empty()) std::cout << text;
    else tb::write_file_atomically(out_path, text);
    return 0;
  }

  const tb::Format file_format =
      !format_name.empty() ? tb::format_from_string(format_name) : format_for_path(out_path);
  const tb::Format stdout_format =
      !out_path.empty() || format_name.empty() ? tb::Format::console : tb::format_from_string(format_name);

  if (with_torch && !list) tb::require_torch();  // before anything is measured
  auto entries = tb::select_entries(registry, settings);
  // A hot memory-bound CPU row is cache-resident below where this machine's caches end: swept once
  // per machine and kept (before the stop handlers: a stop during the sweep ends the run).
  const bool cpu_rows_may_be_cached = !settings.cold && std::any_of(entries.begin(), entries.end(), [](const tb::Entry& e) {
    return e.unsupported.empty() && e.variant->backend == tb::Backend::cpu &&
           e.variant->work(e.problem).bound == tb::Work::Bound::memory && !e.variant->work(e.problem).peak_key.empty();
  });
  if (cpu_rows_may_be_cached && tb::comm::launched_rank() == 0) {
    const tb::CacheThreshold threshold = tb::cpu_cache_threshold(tb::cache_sweep_path(), cache_sweep, std::cerr);
    settings.cpu_cache_bytes = threshold.bytes;
    settings.cpu_cache_how = threshold.how;
  }
  // The PyTorch rows: the rows this run selected (--axis, --quick and --filter applied) as the script's
  // listing, with the PyTorch rows that stand beside exactly those, at their problems, and what those
  // read, drawn by the stages' own generators. They run with the native rows, each in the rounds of the
  // row it mirrors. A script that cannot start costs no measurement.
  // The script's listing and inputs live in a folder of this run's own (mode 0700, a name nobody can
  // guess), gone with it on every way out: a stop request returns through here, an error unwinds.
  // Declared before `torch`, so the script has ended before its files go.
  std::optional<tb::PrivateTempDir> torch_files;
  std::unique_ptr<tb::TorchRows> torch;
  if (with_torch) {
    std::cerr << "benchsuite: the PyTorch rows (" << tb::torch_peers_script() << " --device " << torch_device << ")"
              << std::endl;
    torch_files.emplace("trainbench-torch-");
    const std::string torch_listing = torch_files->path() + "/listing.json";
    nlohmann::json listing = list_json(registry, settings, torch_device);
    tb::attach_torch_inputs(listing, torch_files->path() + "/inputs");
    torch = std::make_unique<tb::TorchRows>(tb::TorchRun{torch_device, torch_listing}, listing, entries);
    entries.insert(entries.end(), torch->entries().begin(), torch->entries().end());
  }
  // Ctrl-C, or a job's time limit (SIGTERM): the row in hand stops after the call it is in, and what
  // was measured is written. (A repeated signal changes nothing: `timeout` sends its SIGTERM twice.)
  std::signal(SIGINT, [](int signal) { tb::request_stop(signal); });
  std::signal(SIGTERM, [](int signal) { tb::request_stop(signal); });
  std::ostream quiet(nullptr);  // the other ranks' progress: rank 0 says it
  if (leader) {
    if (const std::string notice = tb::take_blas_kernel_notice(); !notice.empty()) std::cerr << notice << std::endl;
    const bool any_to_time =
        std::any_of(entries.begin(), entries.end(), [](const tb::Entry& e) { return e.unsupported.empty(); });
    if (any_to_time) std::cerr << "benchsuite: " << tb::expected_time_text(entries, settings) << std::endl;
  }
  tb::Results results = tb::run_entries(registry, entries, settings, leader ? std::cerr : quiet);
  if (!leader) return tb::stop_requested() ? 128 + tb::stop_signal() : tb::exit_code_for(results);  // verdicts are agreed
  if (torch) {
    torch->finish(results);
    torch.reset();  // the script's conversation ends: it closes its rows and exits
  }

  if (!out_path.empty()) {
    tb::write_file_atomically(out_path, tb::render(results, file_format));
    std::cerr << "benchsuite: wrote " << out_path << std::endl;
  }
  // The key under the console table: what its columns and marks mean, at this run's levels.
  const std::string key = stdout_format == tb::Format::console ? tb::table_key(results, settings) : "";
  std::cout << tb::render(results, stdout_format) << key << std::flush;
  if (tb::stop_requested()) {
    std::cerr << "benchsuite: interrupted; the results above are what was measured before" << std::endl;
    return 128 + tb::stop_signal();
  }
  const int code = tb::exit_code_for(results);
  if (code != 0) std::cerr << "benchsuite: a variant was incorrect or a benchmark failed (see the rows above)" << std::endl;
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  tb::use_matching_blas_kernels(argv, "benchsuite");
  try {
    return run(argc, argv);
  } catch (const tb::UsageError& e) {
    std::cerr << "benchsuite: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "benchsuite: error: " << e.what() << std::endl;
    return 1;
  }
}

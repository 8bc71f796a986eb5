// benchsuite: run the stage benchmarks and print what they measured, with % of this machine's
// measured peaks and the declared pairs' ratios. Exit codes: 0 done, 1 a variant was incorrect or a
// benchmark failed, 2 bad usage or an --out that could not be written (a full disk), 130 interrupted by
// Ctrl-C (SIGINT), 143 by SIGTERM (what was measured is still written).
#include <benchmark/benchmark.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <chrono>
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
#include "progress.h"
#include "runner.h"
#include "time_estimate.h"
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
  benchsuite --filter peak --benchmark_filter=-triad   Google Benchmark's filter applies too ('-': all but)
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
      axes.push_back({{"name", a.name},
                      {"values", a.values},
                      {"quick_values", a.quick_values.empty() ? a.values : a.quick_values},
                      {"help", a.help}});
    for (const auto& v : stage.variants) {
      json j{{"id", v.id}, {"backend", tb::to_string(v.backend)}, {"rationale", v.rationale}, {"axes", v.axes}};
      const std::string why = unavailable_here(v);
      j["available"] = why.empty();
      if (!why.empty()) j["unavailable_reason"] = why;
      if (!v.provides_peak.empty()) j["provides_peak"] = v.provides_peak;
      variants.push_back(j);
    }
    for (const auto& p : stage.pairs)
      pairs.push_back({{"label", p.label}, {"baseline", p.baseline}, {"improved", p.improved}});
    stages.push_back({{"name", stage.name},
                      {"question", stage.question},
                      {"source", stage.source},
                      {"axes", axes},
                      {"variants", variants},
                      {"pairs", pairs}});
  }
  settings.peak_prepass = false;  // the rows asked for, not the peaks a run would add
  json benchmarks = json::array();
  const auto entries = tb::select_entries(registry, settings);
  for (const auto& e : entries) {
    json problem = json::object();
    for (const auto& [key, value] : e.problem.params()) problem[key] = value;
    json b{{"name", e.name},
           {"stage", e.stage->name},
           {"backend", tb::to_string(e.variant->backend)},
           {"variant", e.variant->id},
           {"problem", problem}};
    if (!e.unsupported.empty()) {
      b["unsupported"] = e.unsupported;
    } else {
      const tb::Work w = e.variant->work(e.problem);
      b["work"] = {{"bytes", w.bytes},
                   {"flops", w.flops},
                   {"bound", w.bound == tb::Work::Bound::memory ? "memory" : "compute"},
                   {"peak_key", w.peak_key},
                   {"footprint_bytes", w.footprint_bytes > 0 ? w.footprint_bytes : w.bytes}};
    }
    benchmarks.push_back(b);
  }
  json constants = tb::generator_constants();
  json doc{{"schema", "trainbench-list/1"},
           {"version", tb::build::version},
           {"quick", settings.quick},
           {"cuda",
            {{"built", cuda.built},
             {"available", cuda.available()},
             {"unavailable_reason", cuda.unavailable_reason},
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

// --backend, parsed once: the native backend (cpu, cuda, auto or all) and whether the PyTorch rows run
// beside it (",torch"; torch alone: beside auto's).
struct BackendChoice {
  std::string native = "auto";
  bool with_torch = false;
};

BackendChoice parse_backend(const std::string& text) {
  BackendChoice choice;
  std::string native;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item != "cpu" && item != "cuda" && item != "auto" && item != "all" && item != "torch")
      throw CLI::ValidationError("--backend", "'" + item + "' is not a backend: cpu, cuda, auto, all, torch");
    if (item == "torch") {
      choice.with_torch = true;
    } else if (!native.empty()) {
      throw CLI::ValidationError("--backend", "one of cpu, cuda, auto, all (and torch), not " + native + " and " + item);
    } else {
      native = item;
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (!native.empty()) choice.native = native;
  return choice;
}

// What the command line asks for. Google Benchmark's own flags (--benchmark_*) are its; those that
// name ours (--benchmark_repetitions, --benchmark_min_time) are ours under their other name.
struct Options {
  tb::Settings settings;
  BackendChoice backend;
  std::string format_name, out_path, torch_inputs_dir;
  std::vector<std::string> axis_texts;
  std::vector<std::string> gbench_args;
  bool list = false, no_prepass = false, cache_sweep = false;
  int repetitions = 0;  // 0: the default (of --quick or not)
  double min_time = 0;
  int device = -1;  // -1: the default (under mpirun, one GPU per rank on a host)
};

void add_options(CLI::App& app, Options& o) {
  app.add_option("--filter", o.settings.filter, "Run benchmarks whose name matches this regular expression");
  app.add_option_function<std::string>(
      "--backend", [&o](const std::string& text) { o.backend = parse_backend(text); },
      "cpu, cuda, auto (cuda when a GPU is usable, else cpu) or all; with ,torch (cpu,torch, cuda,torch) "
      "also the stages done the PyTorch way (scripts/torch-peers), with PyTorch -> PyTorch and "
      "PyTorch -> trainbench pairs");
  app.add_option("--device", o.device, "CUDA device index")
      ->transform(number_check("a CUDA device index", "0 or more", 0, 1e6, true));
  app.add_flag("--quick", o.settings.quick, "Small sizes, 3 repetitions, short samples");
  app.add_option("--repetitions,--benchmark_repetitions", o.repetitions,
                 "Samples per benchmark (default 10, 3 with --quick)")
      ->transform(number_check("a whole number of samples", "1 to 100000", 1, 100000, true));
  app.add_option("--min-time,--benchmark_min_time", o.min_time, "Seconds per repetition (default 0.2, 0.05 with --quick)")
      ->transform(number_check("a number of seconds", "above 0, at most 3600", 1e-6, 3600, false));
  app.add_flag("--cold", o.settings.cold, "Flush the L2 (GPU) or last-level cache (CPU) before every timed call");
  app.add_option("--noise-target", o.settings.noise_target,
                 "Flag a result as noisy when its CI half-width exceeds this fraction of the median")
      ->transform(number_check("a fraction of the median", "0 to 1", 0, 1, false));
  app.add_option("--axis", o.axis_texts, "Problem sizes: STAGE.AXIS=V1[,V2...], repeatable (see --list)");
  app.add_flag("--list", o.list,
               "List stages, axes, variants and pairs, and why a variant cannot run here (--format json: also the "
               "benchmarks --backend, --quick, --axis and --filter select, with their problems and work, for programs)");
  app.add_option("--out", o.out_path, "Write the results to this file (format from --format or the extension)");
  app.add_option("--format", o.format_name, "console, json, csv or md (default: console on stdout, json for --out)")
      ->check(CLI::IsMember({"console", "json", "csv", "md"}));
  app.add_flag("--no-peak-prepass", o.no_prepass, "Do not measure the peaks that filtered rows are compared with");
  app.add_flag("--cache-sweep", o.cache_sweep,
               "Find again where this CPU's caches end (a copy over growing working sets; otherwise done once per "
               "machine and kept under ~/.cache/trainbench)");
  app.add_option("--max-time", o.settings.max_time_s,
                 "Seconds a row may measure before it stops with the samples it has, after its first (as nvbench's "
                 "--timeout); the rows it cut short are listed under the table (default: no limit)")
      ->transform(number_check("a number of seconds", "0.001 to 1e7", 1e-3, 1e7, false));
  app.add_option("--torch-inputs", o.torch_inputs_dir,
                 "Read a listing with PyTorch rows (--backend ...,torch --list --format json) on stdin, write the "
                 "inputs its rows read under DIR, drawn by the stages' own generators, print the listing with each "
                 "row's inputs and exit: what a run hands scripts/torch-peers")
      ->type_name("DIR");
}

// Fills `o` from the command line; an exit code when that is all there is to do (--help, --version, bad usage).
std::optional<int> parse_command_line(int argc, char** argv, Options& o) {
  CLI::App app{"trainbench benchsuite: the training hot path, one stage at a time, measured on this machine"};
  app.footer(std::string(examples) + "\n" + tb::table_key_help());
  app.set_version_flag("--version", std::string(tb::build::version) + " (" + tb::build::git_commit + ")");
  add_options(app, o);
  std::vector<std::string> ours;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool theirs = arg.rfind("--benchmark_", 0) == 0 && !app.get_option_no_throw(arg.substr(0, arg.find('=')));
    (theirs ? o.gbench_args : ours).push_back(arg);
  }
  std::reverse(ours.begin(), ours.end());  // CLI11 takes them last first
  try {
    app.parse(ours);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "benchsuite: " << e.what() << "\nRun 'benchsuite --help' for the options." << std::endl;
    return 2;
  }
  return std::nullopt;
}

// Google Benchmark parses its own flags; one it does not know is bad usage. Its filter applies to the
// rows; the rest of its flags concern its own measuring loop and reporters, which the rows do not go
// through (they are sampled alone or in rounds with their pairs' rows: runner.h), so they are said to
// have no effect rather than ignored unsaid.
bool google_benchmark_accepts(const char* program, std::vector<std::string>& args) {
  std::vector<char*> argv{const_cast<char*>(program)};
  for (auto& a : args) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  benchmark::Initialize(&argc, argv.data());
  if (benchmark::ReportUnrecognizedArguments(argc, argv.data())) return false;
  for (const auto& a : args)
    if (const std::string key = a.substr(0, a.find('=')); key != "--benchmark_filter")
      std::cerr << "benchsuite: " << key << " has no effect: of Google Benchmark's flags, --benchmark_filter applies "
                << "(--benchmark_repetitions and --benchmark_min_time are --repetitions and --min-time)" << std::endl;
  return true;
}

// `--torch-inputs DIR`, a mode of its own: the listing on stdin with the inputs of its PyTorch rows
// written under DIR, on stdout (what a run hands scripts/torch-peers, for a listing made elsewhere).
int write_torch_inputs(const std::string& dir) {
  nlohmann::json listing;
  try {
    std::cin >> listing;
  } catch (const nlohmann::json::exception& e) {
    throw tb::UsageError(std::string("--torch-inputs: stdin is not a JSON listing (") + e.what() + ")");
  }
  tb::attach_torch_inputs(listing, dir);
  std::cout << listing.dump(1) << std::endl;
  return 0;
}

// --axis, checked before anything else uses the axes: a console --list refuses what a run would.
void parse_axes(const tb::Registry& registry, Options& o) {
  for (const auto& text : o.axis_texts) {
    o.settings.overrides.push_back(tb::parse_axis_override(registry, text));
    if (const auto& repeated = o.settings.overrides.back().repeated; !repeated.empty()) {
      std::string dropped;
      for (const auto& value : repeated) dropped += (dropped.empty() ? "" : ", ") + value;
      std::cerr << "benchsuite: --axis '" << text << "': a value given more than once runs once (dropped: " << dropped << ")"
                << std::endl;
    }
  }
}

// What the run will do, decided from the options before anything is measured.
struct Plan {
  tb::Settings settings;
  bool with_torch = false;
  std::string torch_device;  // the PyTorch rows' device: the native backend's (cuda where there is one)
  bool leader = true;        // rank 0 (or no mpirun): reports; the other ranks measure in step, quiet
  tb::Format file_format = tb::Format::json, stdout_format = tb::Format::console;
};

std::vector<tb::Backend> native_backends(const std::string& native) {
  const auto& cuda = tb::cuda_status();
  if (native == "auto") {
    if (!cuda.available()) std::cerr << "benchsuite: " << cuda.unavailable_reason << "; using the CPU backend" << std::endl;
    return {cuda.available() ? tb::Backend::cuda : tb::Backend::cpu};
  }
  if (native == "all") return {tb::Backend::cpu, tb::Backend::cuda};
  return {tb::backend_from_string(native)};
}

Plan plan_run(const Options& o) {
  Plan plan;
  plan.settings = o.settings;
  tb::Settings& settings = plan.settings;
  using namespace tb::defaults;
  settings.repetitions = o.repetitions ? o.repetitions : (settings.quick ? quick_repetitions : repetitions);
  settings.min_time_s = o.min_time > 0 ? o.min_time : (settings.quick ? quick_min_time_s : min_time_s);
  settings.peak_prepass = !o.no_prepass;
  settings.backends = native_backends(o.backend.native);
  plan.with_torch = o.backend.with_torch;
  // Under mpirun (the collective stages): rank 0 reports, the others measure in step and stay quiet;
  // each rank drives its own GPU unless --device says otherwise.
  const auto& cuda = tb::cuda_status();
  const int ranks = tb::comm::launched_ranks();
  plan.leader = tb::comm::launched_rank() == 0;
  if (ranks > 1 && plan.with_torch) throw tb::UsageError("--backend ...,torch runs on one rank: run it without mpirun");
  int device = o.device;
  if (device < 0 && ranks > 1 && cuda.available() && tb::comm::world_unavailable_reason().empty())
    device = tb::comm::world().local_rank() % static_cast<int>(cuda.devices.size());
  if (device >= 0) {
    settings.cuda_device = device;
    tb::select_cuda_device(device);  // a device that does not exist is bad usage
  }
  const bool cuda_wanted = std::find(settings.backends.begin(), settings.backends.end(), tb::Backend::cuda) !=
                           settings.backends.end();
  plan.torch_device = cuda_wanted && cuda.available() ? "cuda" : "cpu";
  plan.file_format = !o.format_name.empty() ? tb::format_from_string(o.format_name) : format_for_path(o.out_path);
  plan.stdout_format = !o.out_path.empty() || o.format_name.empty() ? tb::Format::console
                                                                    : tb::format_from_string(o.format_name);
  return plan;
}

// A hot memory-bound CPU row is cache-resident below where this machine's caches end: swept once per
// machine and kept (before the stop handlers: a stop during the sweep ends the run).
void find_cpu_cache_threshold(const std::vector<tb::Entry>& entries, bool sweep_again, tb::Settings& settings) {
  const bool cpu_rows_may_be_cached = !settings.cold && std::any_of(entries.begin(), entries.end(), [](const tb::Entry& e) {
    if (!e.unsupported.empty() || e.variant->backend != tb::Backend::cpu) return false;
    const tb::Work work = e.variant->work(e.problem);
    return work.bound == tb::Work::Bound::memory && !work.peak_key.empty();
  });
  if (!cpu_rows_may_be_cached || tb::comm::launched_rank() != 0) return;
  const tb::CacheThreshold threshold = tb::cpu_cache_threshold(tb::cache_sweep_path(), sweep_again, std::cerr);
  settings.cpu_cache_bytes = threshold.bytes;
  settings.cpu_cache_how = threshold.how;
}

// The PyTorch rows of a run (--backend ...,torch): the rows this run selected (--axis, --quick and
// --filter applied) as the script's listing, with the PyTorch rows that stand beside exactly those, at
// their problems, and what those read, drawn by the stages' own generators. They run with the native
// rows, each in the rounds of the row it mirrors. The listing and inputs live in a folder of this run's
// own (mode 0700, a name nobody can guess), gone with this object on every way out (a stop request
// returns, an error unwinds), after the script has ended.
class PyTorchSide {
 public:
  PyTorchSide(const tb::Registry& registry, const tb::Settings& settings, const std::string& device,
              const std::vector<tb::Entry>& native)
      : files_("trainbench-torch-") {
    std::cerr << "benchsuite: the PyTorch rows (" << tb::torch_peers_script() << " --device " << device << ")" << std::endl;
    nlohmann::json listing = list_json(registry, settings, device);
    tb::attach_torch_inputs(listing, files_.path() + "/inputs");
    rows_ = std::make_unique<tb::TorchRows>(tb::TorchRun{device, files_.path() + "/listing.json"}, listing, native);
  }
  const std::vector<tb::Entry>& entries() const { return rows_->entries(); }
  // After the run: the PyTorch rows' pairs and context; the script's conversation ends (it closes its rows
  // and exits).
  void finish(tb::Results& results) {
    rows_->finish(results);
    rows_.reset();
  }

 private:
  tb::PrivateTempDir files_;  // declared first: goes last, once the script has ended
  std::unique_ptr<tb::TorchRows> rows_;
};

// Measures the entries; a stop (main's signal handlers) ends the row in hand after the call it is in.
// The leader announces what the run will take (time_estimate.h), keeps what each row took for the next
// announcement, and says at the end what it took beside what it announced.
tb::Results measure(const tb::Registry& registry, const std::vector<tb::Entry>& entries, const Plan& plan) {
  std::ostream quiet(nullptr);  // the other ranks' progress: rank 0 says it
  if (!plan.leader) return tb::run_entries(registry, entries, plan.settings, quiet);
  if (const std::string notice = tb::take_blas_kernel_notice(); !notice.empty()) std::cerr << notice << std::endl;
  const std::string costs_path = tb::row_costs_path();
  tb::RowCosts costs = tb::RowCosts::load(costs_path, tb::cache_sweep_key());
  const tb::TimeEstimate estimate = tb::estimate_time(entries, plan.settings, costs);
  if (estimate.rows > 0) std::cerr << "benchsuite: " << tb::expected_time_text(plan.settings, estimate) << std::endl;
  tb::Settings settings = plan.settings;
  settings.on_row_done = [&](const tb::Entry& e, double setup_s, double measure_s) {
    costs.record(e.name, e.stage->name, {setup_s, measure_s, tb::expected_measure_seconds(plan.settings)});
  };
  const auto started = std::chrono::steady_clock::now();
  tb::Results results = tb::run_entries(registry, entries, settings, std::cerr);
  costs.save(costs_path, std::cerr);
  if (estimate.rows > 0)
    std::cerr << "benchsuite: measured in " << tb::human_duration(tb::seconds_since(started)) << " (announced about "
              << tb::human_duration(estimate.seconds) << ")" << std::endl;
  return results;
}

// The results to --out and stdout (with the key under a console table); the exit code.
// A file that cannot be written (a full disk) is said after the table, which still shows what was measured.
int write_results(const tb::Results& results, const Plan& plan, const std::string& out_path) {
  std::string not_written;  // why --out was not written; "": it was, or there is none
  if (!out_path.empty()) {
    try {
      tb::write_file_atomically(out_path, tb::render(results, plan.file_format));
      std::cerr << "benchsuite: wrote " << out_path << std::endl;
    } catch (const tb::UsageError& e) {
      not_written = e.what();
    }
  }
  const std::string key = plan.stdout_format == tb::Format::console ? tb::table_key(results, plan.settings) : "";
  std::cout << tb::render(results, plan.stdout_format) << key << std::flush;
  if (!not_written.empty()) {
    std::cerr << "benchsuite: " << not_written << " (the table above is what was measured)" << std::endl;
    return 2;
  }
  if (tb::stop_requested()) {
    std::cerr << "benchsuite: interrupted; the results above are what was measured before" << std::endl;
    return 128 + tb::stop_signal();
  }
  const int code = tb::exit_code_for(results);
  if (code != 0) std::cerr << "benchsuite: a variant was incorrect or a benchmark failed (see the rows above)" << std::endl;
  return code;
}

// --list: as text on stdout, or, as JSON, after the flags that select benchmarks (a plan).
bool list_as_json(const Options& o) {
  return o.format_name == "json" ||
         (o.format_name.empty() && !o.out_path.empty() && format_for_path(o.out_path) == tb::Format::json);
}

int list_as_text(const tb::Registry& registry, const Options& o) {
  if (!o.out_path.empty() || (!o.format_name.empty() && o.format_name != "console"))
    throw tb::UsageError("--list is written as text on stdout, or as JSON (--format json, or --out FILE.json)");
  list_registry(registry, std::cout);
  return 0;
}

int write_list_json(const tb::Registry& registry, const Plan& plan, const std::string& out_path) {
  const std::string text = list_json(registry, plan.settings, plan.with_torch ? plan.torch_device : "").dump(2) + "\n";
  if (out_path.empty()) std::cout << text;
  else tb::write_file_atomically(out_path, text);
  return 0;
}

// The steps: parse the command line, plan the run, measure, write.
int run(int argc, char** argv) {
  Options options;
  if (const auto done = parse_command_line(argc, argv, options)) return *done;
  if (!options.torch_inputs_dir.empty()) return write_torch_inputs(options.torch_inputs_dir);
  const tb::Registry& registry = tb::builtin_registry();
  parse_axes(registry, options);
  if (options.list && !list_as_json(options)) return list_as_text(registry, options);
  // A file that cannot be written is said now, not after the run has measured everything it would hold.
  if (!options.out_path.empty()) tb::check_output_path(options.out_path, "--out");
  if (!google_benchmark_accepts(argv[0], options.gbench_args)) return 2;

  Plan plan = plan_run(options);
  if (options.list) return write_list_json(registry, plan, options.out_path);
  if (plan.with_torch) {  // before anything is measured
    try {
      tb::require_torch();
    } catch (const tb::UsageError&) {
      // Ctrl-C or a closed terminal reaches the interpreter being asked too: that is the stop, not a missing PyTorch
      if (!tb::stop_requested()) throw;
    }
  }
  std::vector<tb::Entry> entries = tb::select_entries(registry, plan.settings);
  find_cpu_cache_threshold(entries, options.cache_sweep, plan.settings);
  std::optional<PyTorchSide> torch;  // started before anything is measured: a script that fails costs nothing
  if (plan.with_torch && !tb::stop_requested()) {
    torch.emplace(registry, plan.settings, plan.torch_device, entries);
    entries.insert(entries.end(), torch->entries().begin(), torch->entries().end());
  }

  tb::Results results = measure(registry, entries, plan);
  if (tb::stop_requested() && std::none_of(results.rows.begin(), results.rows.end(), [](const tb::Row& r) {
        return !r.samples_ns.empty();
      })) {  // nothing to keep: an earlier --out stays as it was
    std::cerr << "benchsuite: interrupted (" << tb::signal_name(tb::stop_signal())
              << ") before any row was measured; nothing written" << std::endl;
    return 128 + tb::stop_signal();
  }
  if (!plan.leader)
    return tb::stop_requested() ? 128 + tb::stop_signal() : tb::exit_code_for(results);  // verdicts are agreed
  if (torch) torch->finish(results);
  return write_results(results, plan, options.out_path);
}

}  // namespace

int main(int argc, char** argv) {
  // Ctrl-C, a job's time limit (SIGTERM) or a closed terminal (SIGHUP), at any moment: the row in hand stops after
  // the call it is in and what was measured is kept. (A repeated signal changes nothing: `timeout` sends its
  // SIGTERM twice.)
  for (const int signal : {SIGINT, SIGTERM, SIGHUP}) std::signal(signal, [](int s) { tb::request_stop(s); });
  tb::file_size_limit_fails_the_write();
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

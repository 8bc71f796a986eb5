// autotune: the best batch / micro-batch / accumulation and switches for a workload on this GPU (or
// CPU). The configuration goes to stdout (`autotune --gpu auto > tuned.yaml`), progress to stderr.
// Exit codes: 0 a configuration was chosen, 1 none ran successfully, 2 bad usage, 130 interrupted
// (the best so far and the journal are still written).
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "results.h"
#include "runtime/device_info.h"
#include "runtime/error.h"
#include "runtime/registry.h"
#include "step/step.h"
#include "step/workload.h"
#include "tuner/emit.h"
#include "tuner/journal.h"
#include "tuner/trial.h"

namespace {

using namespace tb;
using namespace tb::tune;

std::atomic<bool> stop_requested{false};

struct Interrupted {};

constexpr const char* examples = R"(
Examples:
  autotune --gpu auto > tuned.yaml                       the small-GPT preset on the first GPU (or the CPU)
  autotune --workload sem_v55 --batch-range 2048:8192    every global batch from 2048 to 8192 (powers of 2)
  autotune --workload my_model.yaml --budget 600 --format deepspeed --out ds_config.json
  autotune --workload small_gpt --format hf --out training_args.json   TrainingArguments(**json.load(f))
  autotune --workload t4_transformer --switches optimizer,sync --strategy grid
  autotune --workload tiny --gpu cpu --journal tune.jsonl --resume   go on where an interrupted tune stopped

Presets: tuner/workloads/*.yaml (the source reports' pipelines). Switches: optimizer, sync,
activation_checkpointing, lazy_cg (with a propagator), bf16_matmuls and cuda_graphs (GPU only).
)";

std::string human_seconds(double s) {
  std::ostringstream out;
  if (s >= 60) out << static_cast<int>(s / 60) << "m" << std::setw(2) << std::setfill('0') << static_cast<int>(s) % 60 << "s";
  else out << std::fixed << std::setprecision(1) << s << "s";
  return out.str();
}

std::string describe(const Candidate& c) {
  std::ostringstream out;
  out << "batch " << c.global_batch << " = " << c.micro_batch << " x " << c.accumulation();
  for (const auto& [k, v] : c.switches) out << ", " << k << "=" << v;
  return out.str();
}

std::string result_text(const TrialResult& r) {
  std::ostringstream out;
  if (!r.ok()) return std::string(to_string(r.cls)) + ": " + r.message;
  const double mib = static_cast<double>(r.peak_bytes) / (1 << 20);
  out << std::fixed << std::setprecision(1) << r.samples_per_s << " samples/s (" << r.ci_low << "-" << r.ci_high
      << "), peak " << (mib >= 1024 ? mib / 1024 : mib) << (mib >= 1024 ? " GiB" : " MiB");
  return out.str();
}

// The best of what has run, for an interrupted search: the fastest, ties (within noise) to the one
// with less memory.
SearchReport best_so_far(const std::vector<Ranked>& trials, double noise) {
  SearchReport rep;
  rep.trials = trials;
  for (const auto& t : trials) {
    if (!t.result.ok()) continue;
    if (!rep.found || t.result.samples_per_s > rep.best.result.samples_per_s) rep.best = t;
    rep.found = true;
  }
  if (!rep.found) return rep;
  for (const auto& t : trials)
    if (t.result.ok() && t.result.samples_per_s >= (1 - noise) * rep.best.result.samples_per_s &&
        t.result.peak_bytes < rep.best.result.peak_bytes)
      rep.best = t;
  return rep;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) bytes /= 1024, ++u;
  std::ostringstream out;
  out << std::fixed << std::setprecision(bytes < 10 ? 1 : 0) << bytes << " " << units[u];
  return out.str();
}

// Where the journal goes when --journal does not say: beside --out (tuned.yaml ->
// tuned.autotune.jsonl), else in the user's cache, keyed by the workload's digest and the device, so
// that --resume finds it again and no run litters the current directory.
std::string default_journal_path(const std::string& out_path, const std::string& workload_name, const std::string& backend,
                                 const std::string& key) {
  namespace fs = std::filesystem;
  if (!out_path.empty()) {
    fs::path p(out_path);
    return (p.parent_path() / (p.stem().string() + ".autotune.jsonl")).string();
  }
  fs::path cache;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) cache = xdg;
  else if (const char* home = std::getenv("HOME"); home && *home) cache = fs::path(home) / ".cache";
  else cache = fs::temp_directory_path();
  const fs::path dir = cache / "trainbench";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UsageError("cannot create the journal folder " + dir.string() + ": " + ec.message() + " (give --journal FILE)");
  return (dir / (workload_name + "." + backend + "." + key.substr(0, 12) + ".autotune.jsonl")).string();
}

std::vector<int64_t> global_batches(const step::Workload& w, int64_t batch, const std::string& range) {
  if (batch > 0) return {batch};
  if (range.empty()) return {w.batch.global};
  const auto colon = range.find(':');
  double a = 0, b = 0;
  if (colon == std::string::npos || !parse_number(range.substr(0, colon), a) || !parse_number(range.substr(colon + 1), b) ||
      a < 1 || b < a || a != std::floor(a) || b != std::floor(b))
    throw UsageError("--batch-range '" + range + "': expected A:B with 1 <= A <= B, e.g. 32:256");
  std::vector<int64_t> out;
  for (auto g = static_cast<int64_t>(a); g <= static_cast<int64_t>(b); g *= 2) out.push_back(g);
  if (out.back() != static_cast<int64_t>(b)) out.push_back(static_cast<int64_t>(b));
  return out;
}

int run(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--trial") {  // the child side of a trial
    const TrialResult r = run_trial_here(nlohmann::json::parse(argv[2]));
    std::cout << tb::tune::to_json(r).dump() << std::endl;
    return 0;
  }

  std::string gpu = "auto", workload_name = "small_gpt", range, strategy = "auto", switch_list, format = "yaml";
  std::string journal_path, out_path;
  int64_t batch = 0;
  double budget = 300, trial_seconds = 10;
  bool resume = false;
  CLI::App app{"trainbench autotune: the best batch / micro-batch / accumulation config for this machine"};
  app.footer(examples);
  app.add_option("--gpu", gpu, "auto (the first GPU, else the CPU), a device index, or cpu");
  app.add_option("--workload", workload_name, "a preset name or a workload .yaml file");
  auto* batch_opt = app.add_option("--batch", batch, "the global batch (default: the workload's)")->check(CLI::PositiveNumber);
  app.add_option("--batch-range", range, "A:B: global batches A, 2A, 4A ... up to B")->excludes(batch_opt);
  app.add_option("--budget", budget, "seconds for the whole run: probes, trials, confirmation, output (default 300)")
      ->check(CLI::Range(1.0, 1e7));
  app.add_option("--trial-seconds", trial_seconds, "longest a trial measures before its interval is tight (default 10)")
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--strategy", strategy, "auto (fast search) or grid (every candidate)")
      ->check(CLI::IsMember({"auto", "grid"}));
  app.add_option("--switches", switch_list, "comma list of switches to tune (default: all the workload has), or none");
  app.add_option("--format", format, "yaml, json, deepspeed, lightning or hf (Hugging Face TrainingArguments)")
      ->check(CLI::IsMember({"yaml", "json", "deepspeed", "lightning", "hf"}));
  app.add_option("--journal", journal_path,
                 "append every finished trial here (default: beside --out, else under "
                 "${XDG_CACHE_HOME:-~/.cache}/trainbench/, keyed by workload and device)");
  app.add_flag("--resume", resume, "skip the trials already in the journal");
  app.add_option("--out", out_path, "write the config to this file (atomically) instead of stdout");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "autotune: " << e.what() << "\nRun 'autotune --help' for the options." << std::endl;
    return 2;
  }

  // The budget bounds the whole run from here: the estimate, probes, trials, the confirmation, output.
  const auto started = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(); };
  const step::Workload workload = step::load_workload(workload_name);  // a bad file: UsageError, nothing runs
  const OutFormat out_format = out_format_from_string(format);
  const auto& cuda = cuda_status();
  bool use_cuda = false;
  int device = 0;
  if (gpu == "auto") {
    use_cuda = cuda.available();
    if (!use_cuda) std::cerr << "autotune: " << cuda.unavailable_reason << "; tuning on the CPU" << std::endl;
  } else if (gpu != "cpu") {
    double n = 0;
    if (!parse_number(gpu, n) || n < 0 || n != std::floor(n)) throw UsageError("--gpu '" + gpu + "': expected auto, cpu or a device index");
    device = static_cast<int>(n);
    select_cuda_device(device);  // UsageError when it does not exist
    use_cuda = true;
  }

  SearchSpace space;
  space.global_batches = global_batches(workload, batch, range);
  const auto available = available_switches(workload, use_cuda);
  if (switch_list.empty()) {
    space.switches = available;
  } else if (switch_list != "none") {
    std::stringstream list(switch_list);
    std::string name;
    while (std::getline(list, name, ',')) {
      if (!available.count(name)) {
        std::string names;
        for (const auto& kv : available) names += (names.empty() ? "" : ", ") + kv.first;
        throw UsageError("--switches: '" + name + "' is not a switch of this workload on " + (use_cuda ? "cuda" : "cpu") +
                         " (available: " + names + ")");
      }
      space.switches[name] = available.at(name);
    }
  }
  if (space.switches.count("activation_checkpointing")) space.memory_switches = {"activation_checkpointing"};
  // Switches left out keep the workload's own value.
  for (const auto& [name, values] : available)
    if (!space.switches.count(name)) space.switches[name] = {values.front()};

  const std::string backend = use_cuda ? "cuda" : "cpu";
  std::ifstream workload_file(workload.path);
  std::stringstream workload_text;
  workload_text << workload_file.rdbuf();
  const std::string device_name = use_cuda ? cuda.devices.at(static_cast<std::size_t>(device)).name : host_info().cpu_model;
  const std::string workload_digest = digest(workload_text.str());

  SearchOptions options;
  options.strategy = strategy == "grid" ? SearchOptions::Strategy::grid : SearchOptions::Strategy::auto_;
  options.budget_seconds = budget;
  options.measure.max_seconds = trial_seconds;
  ProcessExecutor executor(std::filesystem::read_symlink("/proc/self/exe").string(), workload.path, use_cuda, device,
                           &stop_requested);
  const Candidate own = own_candidate(workload, space);

  // Refused before anything runs: a workload that cannot fit even at micro-batch 1 (with activation
  // checkpointing where it can be switched on), and a budget too small for one trial.
  {
    Candidate smallest = own;
    smallest.micro_batch = 1;
    const auto ckpt = space.switches.find("activation_checkpointing");
    const bool with_ckpt = ckpt != space.switches.end() &&
                           std::find(ckpt->second.begin(), ckpt->second.end(), "on") != ckpt->second.end();
    if (with_ckpt) smallest.switches["activation_checkpointing"] = "on";
    const double need = step::estimate_bytes(apply(workload, smallest));
    const auto capacity = static_cast<double>(executor.memory_capacity());
    if (need > capacity)
      throw UsageError(workload.name + " needs about " + human_bytes(need) + " at micro-batch 1" +
                       (with_ckpt ? " with activation checkpointing" : "") + "; this " +
                       (use_cuda ? "GPU has " + human_bytes(capacity) + " for a step" : "CPU has " + human_bytes(capacity) + " free"));
  }
  // Kept back from the trials: the output, and the exit of a trial stopped at the budget's end.
  const double reserve = kill_grace_seconds + std::min(2.0, 0.05 * budget);
  const TrialEstimate shortest = shortest_trial(apply(workload, own), options.measure.min_steps, use_cuda, device);
  if (shortest.seconds > budget - reserve - elapsed()) {
    // The smallest B with B - grace - min(2, 0.05 B) >= the trial (and what this took so far).
    const double t = shortest.seconds + elapsed() + kill_grace_seconds;
    const double smallest_budget = t / 0.95 <= 40 ? t / 0.95 : t + 2;
    std::ostringstream why;
    why << std::fixed << std::setprecision(1) << "--budget " << budget << " is below one trial of " << workload.name
        << " on this machine: about " << std::ceil(smallest_budget) << " s at the least (" << shortest.step_flops / 1e9
        << " GFLOP a step at " << shortest.flop_rate / 1e9 << " GFLOP/s, " << shortest.rate_source << "; set-up, the checked step, "
        << warmup_steps(apply(workload, own)) << " warm-up and " << options.measure.min_steps
        << " measured steps); give at least that";
    throw UsageError(why.str());
  }
  const double trial_deadline = budget - reserve;  // seconds after `started`
  options.seconds_left = [&] { return trial_deadline - elapsed(); };
  options.min_trial_seconds = shortest.seconds;
  // A trial outside the search (the workload's own, the confirmation) under the same deadline.
  auto within_budget = [&](MeasurePolicy policy) {
    const double left = options.seconds_left();
    if (left < shortest.seconds) throw OutOfBudget("no time left in the budget for another trial");
    policy.max_seconds = std::min(policy.max_seconds, left);
    policy.wall_seconds = left;
    return policy;
  };

  const std::string journal_key = digest(workload_digest + backend + device_name);
  if (journal_path.empty()) journal_path = default_journal_path(out_path, workload.name, backend, journal_key);
  const Journal journal(journal_path, journal_key);
  std::cerr << "autotune: journal " << journal_path << std::endl;
  if (resume) {
    int skipped = 0;
    options.known = journal.load(&skipped);
    std::size_t finished = 0;
    for (const auto& kv : options.known) finished += kv.second.size();
    std::cerr << "autotune: resuming with " << finished << " trials from " << journal_path
              << (skipped ? " (" + std::to_string(skipped) + " lines of another workload or device skipped)" : "") << std::endl;
  } else if (std::filesystem::exists(journal_path)) {
    std::filesystem::remove(journal_path);  // a fresh tune starts a fresh journal
  }

  std::signal(SIGINT, [](int) { stop_requested = true; });
  std::vector<Ranked> seen;
  options.on_trial = [&](const Candidate& c, const TrialResult& r) {
    if (stop_requested) throw Interrupted{};
    journal.append(c, r);
    seen.push_back(Ranked{c, r});
    std::cerr << "autotune: [trial " << seen.size() << ", " << human_seconds(elapsed()) << " of " << human_seconds(budget)
              << " budget] " << describe(c) << " -> " << result_text(r) << std::endl;
  };
  std::cerr << "autotune: " << workload.name << " (" << workload.parameter_count() / 1e6 << "M parameters) on "
            << device_name << ", " << options.budget_seconds << " s budget, " << strategy << " search" << std::endl;

  TuneOutput out;
  out.device = {{"backend", backend}, {"name", device_name}};
  if (use_cuda) {
    const auto& g = cuda.devices.at(static_cast<std::size_t>(device));
    out.device.update({{"uuid", g.uuid}, {"compute_capability", g.compute_capability}, {"memory_bytes", g.memory_bytes},
                       {"driver_version", g.driver_version}, {"runtime_version", g.runtime_version},
                       {"cublas_version", g.cublas_version}});
  } else {
    const HostInfo h = host_info();
    out.device.update({{"cores", h.cores}, {"compiler", h.compiler}, {"blas", h.blas}});
  }
  out.workload_name = workload.name;
  out.workload_path = workload.path;
  out.workload_digest = workload_digest;
  out.workload_source = workload.source;
  out.strategy = strategy;
  out.budget_seconds = budget;
  out.grad_clip = workload.optimizer.grad_clip;

  try {
    // The workload's own configuration first: what the speedup is measured against.
    auto& own_known = options.known[own.key()];
    const bool resumed_own = !own_known.empty();
    const TrialResult own_result = resumed_own ? own_known.front() : executor.run(own, within_budget(options.measure));
    if (!resumed_own) {
      options.on_trial(own, own_result);
      own_known.push_back(own_result);  // the search takes it as the first measurement of `own`
    }
    out.baseline = Ranked{own, own_result};
    out.report = search(executor, space, options);
    // The first trials run on a cold machine and the search may have spent little time on either
    // end of the comparison: measure the choice and the workload's own configuration again, back
    // to back, for the numbers and the speedup that are reported (not journaled: they repeat).
    // Each takes its set-up again and a measurement: only when the budget still has room for both.
    const double confirm_setup = out.report.best.result.setup_seconds + out.baseline->result.setup_seconds;
    const double confirm_measure = (options.seconds_left() - confirm_setup) / 2;
    const bool room = confirm_measure >= std::min(trial_seconds, std::max(1.0, 0.5 * trial_seconds));
    if (out.report.found && !stop_requested && !room)
      std::cerr << "autotune: no time left in the budget to measure the choice and the workload's own configuration "
                   "again; reporting the search's own measurements" << std::endl;
    if (out.report.found && !stop_requested && room) {
      std::cerr << "autotune: confirming the choice against the workload's own configuration" << std::endl;
      MeasurePolicy confirm = options.measure;
      confirm.max_seconds = std::min(trial_seconds, confirm_measure);
      TrialResult best_again, own_again;
      try {
        best_again = executor.run(out.report.best.candidate, within_budget(confirm));
        own_again = executor.run(own, within_budget(confirm));
      } catch (const OutOfBudget& e) {
        best_again.cls = TrialClass::timeout;
        std::cerr << "autotune: " << e.what() << ": reporting the search's own measurements" << std::endl;
      }
      if (best_again.ok() && own_again.ok()) {
        out.report.best.result = best_again;
        out.baseline->result = own_again;
        out.confirmed = true;
        if (own_again.samples_per_s >= best_again.samples_per_s)
          std::cerr << "autotune: measured again, the workload's own configuration is as fast as the choice ("
                    << own_again.samples_per_s << " vs " << best_again.samples_per_s
                    << " samples/s): the difference is within this machine's noise; keeping the workload's "
                       "configuration loses nothing" << std::endl;
      }
    }
  } catch (const OutOfBudget& e) {
    // The workload's own configuration ran into the budget's end: nothing to compare with.
    out.report = best_so_far(seen, options.noise_margin);
    out.report.budget_exhausted = true;
    out.report.seconds = elapsed();
    std::cerr << "autotune: " << e.what() << "; the budget (" << human_seconds(budget) << ") is spent"
              << (out.report.found ? ": reporting the best so far" : ": give a larger --budget") << std::endl;
  } catch (const Interrupted&) {
    out.interrupted = true;
    out.report = best_so_far(seen, options.noise_margin);
    out.report.seconds = elapsed();
    std::cerr << "autotune: interrupted after " << seen.size() << " trials; writing the best so far" << std::endl;
  }

  const std::string text = emit(out, out_format);
  if (out_path.empty()) std::cout << text << std::flush;
  else write_file_atomically(out_path, text);
  std::cerr << "autotune: " << (out.report.found ? "chose " + describe(out.report.best.candidate) : "no configuration ran")
            << " after " << seen.size() << " trials in " << human_seconds(elapsed()) << "; journal "
            << journal_path << (out_path.empty() ? "" : ", config " + out_path) << std::endl;
  if (out.interrupted) return 130;
  return out.report.found ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything is measured: trials inherit the environment, and so the kernels.
  if (!(argc == 3 && std::string(argv[1]) == "--trial")) tb::use_matching_blas_kernels(argv, "autotune");
  try {
    return run(argc, argv);
  } catch (const tb::UsageError& e) {
    std::cerr << "autotune: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "autotune: error: " << e.what() << std::endl;
    return 1;
  }
}

// autotune's command line: the options (CLI11), parsed into AutotuneOptions and checked together; --gpu's
// machine and --memory-limit's bytes.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>

#include "runtime/device_info.h"
#include "runtime/error.h"
#include "runtime/registry.h"
#include "tuner/autotune.h"
#include "tuner/autotune_parts.h"
#include "tuner/emit.h"
#include "tuner/entry.h"

namespace tb::tune {
namespace {

constexpr const char* examples = R"(
Examples:
  autotune --gpu auto > tuned.yaml                       the small-GPT preset on the first GPU (or the CPU), at
                                                         the global batches of its global_range (4, 8, 16)
  autotune --workload small_gpt --batch 4                its own global batch only (convergence decided elsewhere)
  autotune --workload sem_v55 --batch-range 2048:8192    every global batch from 2048 to 8192 (powers of 2)
  autotune --workload my_model.yaml --budget 600 --format deepspeed --out ds_config.json
  autotune --workload small_gpt --format hf --out training_args.json   TrainingArguments(**json.load(f))
  autotune --workload t4_transformer --switches optimizer,sync --strategy grid
  autotune --workload tiny --gpu cpu --journal tune.jsonl --resume   go on where an interrupted tune stopped
  autotune --compare a.yaml b.yaml --gpu cpu             two tunes' choices raced interleaved: within noise?
  autotune --workload small_gpt --gpu cpu --executor torch > torch.yaml   tuned in the PyTorch twin of the step
  autotune --compare native.yaml torch.yaml --executor torch   both choices raced in PyTorch
  autotune --compare tuned.yaml --executor native,torch    the C++ step against its PyTorch twin, one configuration
  autotune --executor torch --entry my_train.py:build --batch 64   your own PyTorch model (README: --entry)
  autotune --executor torch --entry 'hf:gpt2?n_layer=4&n_embd=256' --format hf --out training_args.json
  autotune --entry hf:gpt2 --batch 64 --versus largest-batch   the choice raced against the largest batch that fits

Presets: tuner/workloads/*.yaml (the source reports' pipelines). Switches: optimizer, attention (fused
frees the T^2 probabilities, so a larger micro-batch fits), sync, activation_checkpointing, lazy_cg (with a
propagator), bf16_matmuls and cuda_graphs (GPU only).

After the search, its choice, the candidates within noise of it and the next fastest (four at most), the
fastest with each switch value not among those, the choice's switches at half and twice its micro-batch,
and the workload's own configuration are raced: measured in rounds, one short trial of each a round in a
rotating order, compared on their per-round ratios (which the machine's drift between rounds does not
move), and the ones behind the leader beyond noise dropped. A speedup over the workload's own
configuration is claimed only when that paired interval excludes 1 by the noise margin (1%).
)";

}  // namespace

// --ranks and how the ranks start: the native step's under MPI, an entry's under torchrun; --predict past them.
static void add_ranks_options(CLI::App& app, AutotuneOptions& o) {
  app.add_option(
         "--ranks", o.ranks,
         "data-parallel ranks: every trial runs the step on N ranks (LAUNCHER -n N; with --entry, under torchrun), the "
         "global batch split as micro-batch x accumulation x N, DDP's bucket size a switch (with --entry also DDP or "
         "FSDP2 and no_sync); the output's DeepSpeed / Lightning / hf / accelerate keys are for N")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--mpirun", o.launcher,
                 "the launcher of --ranks trials, with its options (default: mpirun; e.g. "
                 "'mpirun --hostfile hosts')");
  app.add_option("--launcher", o.torchrun,
                 "with --entry --ranks N: how torchrun starts the ranks, e.g. 'torchrun --nnodes 2 --rdzv-backend c10d "
                 "--rdzv-endpoint HOST:29500' (run as the tune's python -m torch.distributed.run; --nproc-per-node "
                 "N / nodes added when left out; default: torchrun --standalone, this node); with --ranks 1, a "
                 "group of one rank (DDP or FSDP2 on one GPU)");
  app.add_flag("--predict", o.predict,
               "with --ranks N: predict N ranks (more than are at hand) from trials of one rank's share of the batch on "
               "--probe-ranks independent ranks (with --entry: in one process) and the all-reduce measured on them "
               "(with --entry: torch.distributed's, under torchrun); measured too where N <= --probe-ranks");
  app.add_option("--probe-ranks", o.probe_ranks,
                 "R, the ranks at hand for --predict: the all-reduce is measured on min(N, R) of them, and N ranks run "
                 "for real where N <= R (default 2)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
}

// The options the command line sets; `format` and `memory_limit` as typed, checked after the parse.
// Returns the --workload option, whose presence parse_options asks about.
static CLI::Option* add_options(CLI::App& app, AutotuneOptions& o, std::string& format, std::string& memory_limit_text) {
  app.footer(examples);
  app.add_option("--gpu", o.gpu, "auto (the first GPU, else the CPU), a device index, or cpu");
  auto* workload_opt = app.add_option("--workload", o.workload, "a preset name or a workload .yaml file");
  auto* batch_opt = app.add_option("--batch", o.batch,
                                   "pin the global batch (default: each of the workload's global_range, else its own; a "
                                   "larger global batch is not free for convergence)")
                        ->check(CLI::PositiveNumber);
  app.add_option("--batch-range", o.batch_range,
                 "A:B: global batches A, 2A, 4A ... up to B (default: the workload's global_range)")
      ->excludes(batch_opt);
  app.add_option("--micro-batch", o.micro_batch,
                 "N: every candidate runs micro-batches of N (the accumulation makes up the global batch; with --ranks, "
                 "one rank's share); the switches are still searched (default: the micro-batch is searched)")
      ->check(CLI::PositiveNumber);
  app.add_option("--budget", o.budget, "seconds for the whole run: probes, trials, the race, output (default 300)")
      ->check(CLI::Range(1.0, 1e7));
  app.add_option("--memory-limit", memory_limit_text,
                 "plan for at most this much memory, e.g. 16G (the GPU you will train on, or what this host can spare; "
                 "default: what the device has free)");
  app.add_option("--trial-seconds", o.trial_seconds,
                 "longest a trial measures before its interval is tight (default 10; with --ranks, a thirtieth of --budget "
                 "between 3 and 10; a race slice measures a tenth of it, at least a second)")
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--executor", o.executor,
                 "native (trainbench's C++ step, the default) or torch (the PyTorch twin of the step, scripts/torch-step: "
                 "the same model, data, optimizer and switches written as a PyTorch program; needs PyTorch, see "
                 "scripts/install-deps --torch); with --compare, native,torch races each configuration in both, the C++ "
                 "step against its PyTorch twin")
      ->check(CLI::IsMember({"native", "torch", "native,torch"}));
  app.add_option("--entry", o.entry,
                 "FILE.py:NAME: tune your own PyTorch model, NAME(micro_batch, device) returning dict(model, optimizer, "
                 "batches, loss) or a LightningModule (README: --entry); hf:MODEL?key=value&...: a transformers model from "
                 "its configuration, random weights, synthetic tokens (never downloads); implies --executor torch")
      ->excludes(workload_opt);
  app.add_option("--versus", o.versus,
                 "largest-batch: with --entry, race the choice against the configuration Lightning's BatchSizeFinder "
                 "gives (the largest power-of-two micro-batch that fits, accumulation = global batch / it) instead of "
                 "the entry's own, and report the ratio with its interval")
      ->check(CLI::IsMember({"largest-batch"}));
  add_ranks_options(app, o);
  app.add_option("--strategy", o.strategy, "auto (fast search) or grid (every candidate)")
      ->check(CLI::IsMember({"auto", "grid"}));
  app.add_option("--switches", o.switches, "comma list of switches to tune (default: all the workload has), or none");
  app.add_option("--race-rounds", o.race_rounds,
                 "most rounds of the finalists' interleaved race after the search (default 12; 0: no race, and no speedup "
                 "is claimed)")
      ->check(CLI::Range(0, 100));
  app.add_option("--format", format,
                 "yaml, json, deepspeed, lightning, hf (Hugging Face TrainingArguments) or accelerate (an Accelerate "
                 "config file for accelerate launch --config_file)")
      ->check(CLI::IsMember({"yaml", "json", "deepspeed", "lightning", "hf", "accelerate"}));
  app.add_option("--journal", o.journal_path,
                 "append every finished trial here (default: beside --out, else under "
                 "${XDG_CACHE_HOME:-~/.cache}/trainbench/, keyed by workload and device)");
  app.add_flag("--resume", o.resume, "skip the trials already in the journal");
  app.add_option("--out", o.out_path, "write the config to this file (atomically) instead of stdout");
  auto* compare_opt = app.add_option(
                             "--compare", o.compare_files,
                             "FILE FILE...: race the configurations these tuned files (--format yaml or json) chose, "
                             "interleaved, each against the first, instead of tuning; says whether they are "
                             "within noise (the workload is the files' unless --workload names it). One FILE with "
                             "--executor native,torch: its configuration in the C++ step against its PyTorch twin")
                          ->expected(1, 64);
  for (const char* tuning_only : {"--batch", "--batch-range", "--strategy", "--switches", "--journal", "--resume"})
    compare_opt->excludes(tuning_only);
  app.add_option("--report", o.report_path,
                 "PAGE.html: also write the tune as one self-contained page (the search, memory, the race, the step's "
                 "time split, the switches' effects, the budget; scripts/tune-page, docs/reading-a-tune-page.md); with "
                 "--from, the page of that tuned file and its journal, nothing run");
  app.add_option("--from", o.from_file,
                 "TUNED.yaml: write the choice of this tuned file (--format yaml or json) in another --format "
                 "(deepspeed, lightning, hf, accelerate) without running anything");
  return workload_opt;
}

// --from re-emits a tuned file: the options that plan, probe or run trials have nothing to do with it.
static void refuse_trial_options_with_from(const CLI::App& app) {
  for (const char* trial_option :
       {"--gpu", "--workload", "--batch", "--batch-range", "--micro-batch", "--budget", "--memory-limit",
        "--trial-seconds", "--executor", "--entry", "--versus", "--ranks", "--mpirun", "--launcher", "--predict",
        "--probe-ranks", "--strategy", "--switches", "--race-rounds", "--journal", "--resume", "--compare"})
    if (const CLI::Option* given = app.get_option_no_throw(trial_option); given && given->count())
      throw UsageError(std::string("--from writes a tuned file in another format without running anything: ") +
                       "leave out " + trial_option);
}

// argv as a shell would take it back: each word that holds more than [A-Za-z0-9_./:=,+-] in single quotes.
static std::string shell_quoted(int argc, const char* const* argv) {
  std::string line;
  for (int i = 0; i < argc; ++i) {
    const std::string word = i == 0 ? std::string("autotune") : std::string(argv[i]);
    const bool plain = !word.empty() && std::all_of(word.begin(), word.end(), [](char ch) {
      return std::isalnum(static_cast<unsigned char>(ch)) || std::string("_./:=,+-@%").find(ch) != std::string::npos;
    });
    std::string quoted = "'";
    for (char ch : word) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    line += (i ? " " : "") + (plain ? word : quoted + "'");
  }
  return line;
}

double ranks_trial_seconds(double budget) { return std::clamp(budget / 30, 3.0, 10.0); }

AutotuneOptions parse_options(int argc, const char* const* argv) {
  AutotuneOptions o;
  std::string format = "yaml", memory_limit_text;
  CLI::App app{"trainbench autotune: the best batch / micro-batch / accumulation config for this machine"};
  CLI::Option* workload_opt = add_options(app, o, format, memory_limit_text);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    o.help = app.help();
    return o;
  } catch (const CLI::ParseError& e) {
    throw UsageError(std::string(e.what()) + "\nRun 'autotune --help' for the options.");
  }
  o.workload_given = workload_opt->count() > 0;
  o.trial_seconds_given = app.count("--trial-seconds") > 0;
  o.format_given = app.count("--format") > 0;
  o.command_line = shell_quoted(argc, argv);
  if (!o.trial_seconds_given && o.ranks > 1) o.trial_seconds = ranks_trial_seconds(o.budget);
  o.format = out_format_from_string(format);
  if (!o.from_file.empty()) refuse_trial_options_with_from(app);
  if (o.predict && o.ranks < 2) throw UsageError("--predict needs --ranks N with N >= 2");
  if (!o.versus.empty() && o.entry.empty())
    throw UsageError("--versus " + o.versus +
                     " races the choice for an --entry against the largest batch that fits: give --entry");
  if (!o.entry.empty()) {
    if (app.count("--executor") && o.executor != "torch")
      throw UsageError("--entry tunes a PyTorch model: it runs with --executor torch, not " + o.executor);
    if (!o.compare_files.empty()) throw UsageError("--entry tunes its own model: leave out --compare");
    if (o.ranks > 1 && app.count("--mpirun"))
      throw UsageError("--mpirun launches the native step's ranks; an entry's ranks start under torchrun "
                       "(--launcher 'torchrun ...')");
    if (app.count("--launcher") && o.predict)
      throw UsageError("--launcher starts the ranks a tune measures; --predict tunes one process and starts its "
                       "probes itself");
    // A bad --launcher is refused before anything runs; with --ranks 1 it makes a group of one rank
    if (o.ranks > 1 || app.count("--launcher")) torchrun_arguments(o.torchrun, o.ranks);
    if (o.ranks > 1 && o.batch > 0 && o.batch % o.ranks)
      throw UsageError("--ranks " + std::to_string(o.ranks) + ": the global batch " + std::to_string(o.batch) +
                       " is not a multiple of the ranks");
    o.executor = "torch";
  }
  o.memory_limit = memory_limit_text.empty() ? 0 : parse_memory_limit(memory_limit_text);
  if (app.count("--launcher") && o.entry.empty())
    throw UsageError("--launcher starts an entry's ranks under torchrun; the native step's ranks start with --mpirun");
  if (o.ranks > 1 && o.executor == "torch" && o.entry.empty())
    throw UsageError(
        "--ranks runs the native step or an --entry on every rank; without --entry, --executor torch is one "
        "process (the twin)");
  if (o.ranks > 1 && !o.compare_files.empty())
    throw UsageError("--compare races one-rank configurations: leave out --ranks");
  if (executor_names(o.executor).size() > 1 && o.compare_files.empty())
    throw UsageError("--executor native,torch races configurations in both executors: give it --compare FILE");
  return o;
}

Machine pick_machine(const std::string& gpu) {
  Machine m;
  const auto& cuda = cuda_status();
  if (gpu == "auto") {
    m.use_cuda = cuda.available();
    if (!m.use_cuda) std::cerr << "autotune: " << cuda.unavailable_reason << "; measuring on the CPU" << std::endl;
  } else if (gpu != "cpu") {
    double n = 0;
    if (!parse_number(gpu, n) || n < 0 || n != std::floor(n))
      throw UsageError("--gpu '" + gpu + "': expected auto, cpu or a device index");
    m.device = static_cast<int>(n);
    try {
      select_cuda_device(m.device);  // UsageError when it does not exist
    } catch (const UsageError& e) {  // said of benchsuite's --device: named as the user typed it here
      const std::string what = e.what();
      const auto colon = what.find(": ");
      throw UsageError("--gpu " + gpu + ": " +
                       (what.rfind("--device", 0) == 0 && colon != std::string::npos ? what.substr(colon + 2) : what));
    }
    m.use_cuda = true;
  }
  m.backend = m.use_cuda ? "cuda" : "cpu";
  m.name = m.use_cuda ? cuda.devices.at(static_cast<std::size_t>(m.device)).name : host_info().cpu_model;
  m.description = {{"backend", m.backend}, {"name", m.name}};
  if (m.use_cuda) {
    const auto& g = cuda.devices.at(static_cast<std::size_t>(m.device));
    m.description.update({{"uuid", g.uuid},
                          {"compute_capability", g.compute_capability},
                          {"memory_bytes", g.memory_bytes},
                          {"driver_version", g.driver_version},
                          {"runtime_version", g.runtime_version},
                          {"cublas_version", g.cublas_version}});
  } else {
    const HostInfo h = host_info();
    m.description.update({{"cores", h.cores}, {"compiler", h.compiler}, {"blas", h.blas}});
  }
  return m;
}

// --memory-limit: "16G", "512M", "3.5GiB", or bytes. Throws UsageError naming the value.
int64_t parse_memory_limit(const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  if (unit.size() > 1 && (unit.substr(1) == "iB" || unit.substr(1) == "B")) unit = unit.substr(0, 1);
  const std::string units = "KMGT";
  const std::size_t power = unit.empty() ? 0 : units.find(static_cast<char>(std::toupper(unit[0])));
  if (used == 0 || !(value > 0) || (!unit.empty() && (unit.size() != 1 || power == std::string::npos)))
    throw UsageError("--memory-limit '" + text +
                     "': expected a size such as 16G, 512M or 3.5GiB (K, M, G, T: powers of 1024)");
  return static_cast<int64_t>(value * std::pow(1024.0, unit.empty() ? 0.0 : static_cast<double>(power + 1)));
}

}  // namespace tb::tune

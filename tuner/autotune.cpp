// autotune: the best batch / micro-batch / accumulation and switches for a workload on this GPU (or
// CPU). The configuration goes to stdout (`autotune --gpu auto > tuned.yaml`), progress to stderr.
// After the search, its finalists and the workload's own configuration are raced interleaved
// (race.h), and a speedup is claimed only where that comparison holds it. `autotune --compare A B`
// races the choices of tuned files against each other. `--executor torch` measures every trial in the
// PyTorch twin of the step (trial.h's TorchExecutor) instead of the C++ step; with `--entry`, the user's
// own PyTorch model (entry.h's EntryExecutor).
// Exit codes: 0 a configuration was chosen (or compared), 1 none ran successfully (or the journal or the tuned
// file could not be written: a full disk; the configuration then goes to stdout), 2 bad usage, 128 + the
// signal when stopped by SIGINT, SIGTERM or SIGHUP (130, 143, 129: the best so far and the journal are still
// written). The steps are in autotune.h.
// The command's parts: its options (autotune_options.cpp), stop signals (autotune_signals.cpp), the plan
// (autotune_plan.cpp), the tune's steps (autotune_steps.cpp), --compare and --from (autotune_compare.cpp),
// each using the others through autotune_parts.h; here, run().
#include "tuner/autotune.h"

#include <signal.h>
#include <sys/prctl.h>

#include <iostream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/comm.h"
#include "runtime/files.h"
#include "tuner/autotune_parts.h"
#include "tuner/distributed.h"
#include "tuner/trial.h"

namespace tb::tune {

int run(int argc, char** argv) {
  // The child sides (a trial, the all-reduce probe; under mpirun, every rank): they end when their parent (autotune,
  // or the launcher) ends, however it ends, and never hold a GPU for a tune that is gone.
  const bool child_side = argc == 3 && (std::string(argv[1]) == "--trial" || std::string(argv[1]) == "--allreduce-probe");
  if (child_side) prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (argc == 3 && std::string(argv[1]) == "--trial") {  // the child side of a trial
    const TrialResult r = run_trial_here(nlohmann::json::parse(argv[2]));
    if (comm::launched_rank() == 0) std::cout << to_json(r).dump() << std::endl;  // one line, rank 0's
    return 0;
  }
  if (argc == 3 && std::string(argv[1]) == "--allreduce-probe")
    return run_allreduce_probe_here(nlohmann::json::parse(argv[2]));
  const AutotuneOptions options = parse_options(argc, argv);
  if (!options.help.empty()) {
    std::cout << options.help;
    return 0;
  }
  if (!options.report_path.empty()) check_output_path(options.report_path, "--report");
  if (!options.from_file.empty()) {
    if (!options.out_path.empty()) check_output_path(options.out_path, "--out");
    return emit_tuned_file(options);
  }
  install_stop_handlers();
  // Where the results go is checked before anything is measured: a tune is not lost to a typo in a folder.
  if (!options.out_path.empty()) check_output_path(options.out_path, "--out");
  if (!options.journal_path.empty()) check_output_path(options.journal_path, "--journal");
  if (!options.compare_files.empty()) {
    try {
      return compare_tuned(options);
    } catch (...) {  // stopped while the executors started: nothing was raced
      if (!stop_requested) throw;
      std::cerr << "autotune: stopped by " << stop_signal_name() << " before the race; nothing was compared" << std::endl;
      return interrupted_exit_code();
    }
  }
  const BudgetClock clock;  // the budget bounds the whole run from here: the plan, probes, trials, the race, output
  std::optional<TunePlan> plan;
  std::optional<Tune> tune;
  try {
    // A stop before the first trial (the worker starting, the entry's probe) ends the run: nothing was measured.
    plan.emplace(plan_tune(options, clock));
    described_ranks = options.predict ? 1 : options.ranks;  // --predict: the trials run one rank's share
    tune.emplace(options, *plan, clock);
    if (stop_requested) throw Interrupted{};
  } catch (...) {
    if (!stop_requested) throw;
    std::cerr << "autotune: stopped by " << stop_signal_name() << " before the first trial ("
              << (options.entry.empty() ? "planning" : "starting the PyTorch worker and validating the entry")
              << "); its processes were stopped; nothing was measured, nothing written" << std::endl;
    return interrupted_exit_code();
  }
  search_and_race(*tune);
  try {
    predict_step(*tune);
  } catch (...) {
    if (!stop_requested) throw;
    tune->out.interrupted = true;  // the prediction's probe was stopped: the search's choice stands, unpredicted
  }
  return output_step(*tune);
}

}  // namespace tb::tune

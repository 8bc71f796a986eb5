// The torch rows of `benchsuite --backend cpu,torch` (or cuda,torch): each stage done the PyTorch way,
// measured by scripts/torch-peers on the problems this benchsuite lists, merged into the same results
// with two kinds of pair: the PyTorch pair ("PyTorch for-loop AdamW -> PyTorch fused": what a user
// gains by changing their code) and the cross pair ("PyTorch fused -> trainbench fused": what is left
// on the table), so that one table says which ratio applies to whose code.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness.h"
#include "results.h"

namespace tb {

// The constants of the stages' input generators and checks that a runner outside this binary needs to
// build the same inputs and hold them to the same tolerances (seeds, CG's window and tolerances, the
// AdamW hyper-parameters, ...), by name ("cg.seed_rhs"): `--list --format json` carries them, so that
// scripts/torch-peers takes them from the C++ headers that define them instead of keeping copies.
nlohmann::json generator_constants();

// One PyTorch row to measure: a PyTorch variant beside one selected row, at that row's problem.
struct TorchBench {
  std::string name;  // "adamw/torch/fused/params=10000000,tensors=200,dtype=fp32"
  std::string stage, variant, label;
  std::string mirrors;    // the backend/variant of the row it stands beside: "cpu/fused"
  std::string rationale;  // what the PyTorch code does
  // The row's problem, and on a CPU variant's problem what that variant implies without an axis for it
  // (attention's CPU variants run fp32; naive_mask_cached is causal).
  std::vector<std::pair<std::string, std::string>> problem;
};

// The PyTorch rows that stand beside `entries` (a run's selection) on `device` (cpu: rows `torch`,
// cuda: rows `torch_cuda`): each PyTorch variant that mirrors an entry's variant on that backend, at the
// entry's problem where the PyTorch variant runs it; in the order of the PyTorch variants, then of the
// entries. The GPU patterns (flash attention, CUDA graphs, the caching allocator, pinned copies) mirror
// no CPU variant.
std::vector<TorchBench> torch_benches(const std::vector<Entry>& entries, const std::string& device);
// The same as `--list --format json`'s "torch" section, what scripts/torch-peers measures.
nlohmann::json torch_benches_json(const std::vector<TorchBench>& benches, const std::string& device);

// Writes under `dir` what each PyTorch row of `listing` (a `--list --format json` document with its
// "torch" section) reads, drawn by the stages' own generators (the Laplacian in CSR, CG's right-hand
// sides, the parameter set's sizes, the epoch's order, hostsync's predictions and reference sums, the
// launch window), and adds to each row its "inputs" ({name: {file, dtype, shape}}, raw native-endian
// arrays) and to the section "inputs_dir". Rows at one problem share their files.
void attach_torch_inputs(nlohmann::json& listing, const std::string& dir);

// What scripts/torch-peers writes: per PyTorch row its raw samples and what it saw (disposition, check
// error, its measured counters, and what it read of the machine at the ends of the row's samples:
// "watch"); everything derived from them (summaries, disturbance, % of peak, pairs) is this harness's.
inline constexpr const char* torch_samples_schema = "trainbench-torch-samples/1";

struct TorchRun {
  std::string device = "cpu";  // cpu (rows `torch`) or cuda (rows `torch_cuda`)
  std::string listing_path;    // this run's `--list --format json` document: the rows its PyTorch rows stand beside
  bool quick = false;
  int repetitions = 0;
  double min_time_s = 0;
  std::string out_path;        // where the script writes its trainbench-torch-samples/1 document
  bool (*stop)() = nullptr;    // asked while it runs: a stop request reaches the script as Ctrl-C
};

// The interpreter that runs the script: $TRAINBENCH_PYTHON, else the virtual environment that
// scripts/install-deps --torch makes ($TRAINBENCH_TORCH_VENV or ~/.local/share/trainbench/torch-venv)
// when it is there, else python3.
std::string torch_python();
// scripts/torch-peers: $TRAINBENCH_TORCH_PEERS, else ../share/trainbench/scripts/torch-peers beside the
// binary (an install), else the source tree's.
std::string torch_peers_script();
// scripts/torch-step (autotune --executor torch's trials): $TRAINBENCH_TORCH_STEP, else found as above.
std::string torch_step_script();
// Throws UsageError, saying how to install it, when the interpreter cannot import torch or `script` is
// missing: checked before anything is measured, so a missing PyTorch costs no run. `who` names the
// option in the message ("--backend torch").
void require_torch(const std::string& who = "--backend torch", const std::string& script = torch_peers_script());
// Runs the script (its progress goes to stderr) and returns its samples document; throws
// std::runtime_error when it fails or writes nothing, UsageError when it rejects its arguments.
nlohmann::json run_torch_peers(const TorchRun& run);
// Writes `listing` (this run's `--list --format json` document, with its rows' inputs) to
// run.listing_path, runs the script, and takes again the rows it measured while other processes held
// the CPUs or the GPU throttled (what it read at each row's ends: "watch"), as the harness takes its
// own rows' samples again; returns the samples document with every row's last attempt.
nlohmann::json measure_torch_rows(const TorchRun& run, const nlohmann::json& listing, const Settings& settings);
// Adds the PyTorch rows of the script's samples document to `into`, which holds the rows they mirror:
// each row's summary (Settings::noise_target), the work of the row it mirrors ("cpu/fused" ->
// stage/cpu/fused/<label>), the PyTorch pairs at each problem, and the cross pairs (each PyTorch row
// against the row it mirrors), judged as every declared pair is (judge_pair); and PyTorch's versions
// to the context (context.torch). % of peak is attach_pct_of_peak's, after.
void merge_torch_rows(Results& into, const nlohmann::json& samples, const Settings& settings);

}  // namespace tb

// The torch rows of `benchsuite --backend cpu,torch` (or cuda,torch): each stage done the PyTorch way,
// measured by scripts/torch-peers on the problems this benchsuite lists, merged into the same results
// with two kinds of pair: the PyTorch pair ("PyTorch for-loop AdamW -> PyTorch fused": what a user
// gains by changing their code) and the cross pair ("PyTorch fused -> trainbench fused": what is left
// on the table), so that one table says which ratio applies to whose code.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "results.h"

namespace tb {

struct TorchRun {
  std::string device = "cpu";  // cpu (rows `torch`) or cuda (rows `torch_cuda`)
  std::string benchsuite;      // this binary: the script lists the problems through it, unless...
  std::string listing_path;    // ... this run's `--list --format json` document is here: its problems are measured
  bool quick = false;
  std::string filter;
  int repetitions = 0;
  double min_time_s = 0;
  std::string out_path;        // where the script writes its trainbench-results/1 document
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
// Runs the script (its progress and table go to stderr) and returns its document; throws
// std::runtime_error when it fails or writes nothing, UsageError when it rejects its arguments.
nlohmann::json run_torch_peers(const TorchRun& run);
// Adds the document's rows, its PyTorch pairs and the cross pairs (each passed torch row against the
// row it `mirrors`, "cpu/fused" -> stage/cpu/fused/<label>, when that one passed; withheld when that
// one was disturbed) to `into`, and PyTorch's versions to the context (context.torch). The torch rows
// themselves are not watched for other processes' load: scripts/torch-peers does not look.
void merge_torch_rows(Results& into, const nlohmann::json& torch_document);

}  // namespace tb

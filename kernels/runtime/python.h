// The Python side of trainbench: which interpreter runs PyTorch, and where its scripts are. benchsuite's
// PyTorch rows (scripts/torch-peers) and autotune's PyTorch worker (scripts/torch-step) find them here.
#pragma once

#include <string>
#include <vector>

namespace tb {

// The interpreter that runs the scripts: $TRAINBENCH_PYTHON, else the virtual environment that
// scripts/install-deps --torch makes ($TRAINBENCH_TORCH_VENV or ~/.local/share/trainbench/torch-venv)
// when it is there, else python3.
std::string torch_python();
// scripts/torch-peers: $TRAINBENCH_TORCH_PEERS, else ../share/trainbench/scripts/torch-peers beside the
// binary (an install), else the source tree's.
std::string torch_peers_script();
// scripts/torch-step (autotune --executor torch's worker): $TRAINBENCH_TORCH_STEP, else found as above.
std::string torch_step_script();
// scripts/tune-page (autotune --report): $TRAINBENCH_TUNE_PAGE, else found as above.
std::string tune_page_script();
// Runs argv (its first word a program found on PATH, or a path) with its stdout sent to this process's stderr,
// its stderr as this process's, and waits for it: its exit code, 127 when it could not be started.
int run_to_stderr(const std::vector<std::string>& argv);
// Throws UsageError, saying how to install it, when the interpreter cannot import torch or `script` is
// missing: checked before anything is measured, so a missing PyTorch costs no run. `who` names the
// option in the message ("--backend torch").
void require_torch(const std::string& who = "--backend torch", const std::string& script = torch_peers_script());

}  // namespace tb

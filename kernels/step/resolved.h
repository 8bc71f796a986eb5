// The workload as the step resolved it, with the constants the step is built from: what a twin of
// the step in another framework is built from (scripts/trainbench/pytorch/step.py), never
// the YAML. Written by dump_step, sent in autotune's PyTorch trials and read by the step's PyTorch row.
#pragma once

#include <nlohmann/json.hpp>

#include "step/workload.h"

namespace tb::step {

inline constexpr const char* kResolvedSchema = "trainbench-step-dump/1";

// {"schema", "workload", "constants"} (seeds, the layernorm and clipping epsilons).
nlohmann::ordered_json resolved_workload(const Workload& w);

}  // namespace tb::step

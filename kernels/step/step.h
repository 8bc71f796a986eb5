// Stage `step`: one whole optimizer step of a workload (tuner/workloads/*.yaml or a user's file),
// what autotune measures. Before timing, the backend's first forward is checked token by token
// against a double-precision forward of the same model on the CPU.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/registry.h"
#include "step/workload.h"

namespace tb::step {

// Per-token losses of sequence `sample` of the dataset through a freshly initialised model, in
// double on the CPU: the reference every backend's first forward is compared with.
std::vector<double> reference_losses(const Workload& w, int32_t sample);
Verdict check_first_losses(const Workload& w, int32_t sample, const std::vector<double>& got, bool bf16);

// FLOPs of one optimizer step: 6 per parameter per token (forward and backward of the matrix
// products) plus the attention products, 12 L B T^2 C halved by the causal mask.
double step_flops(const Workload& w);

// Why this workload cannot run on `backend` here, or "".
std::string unsupported_reason(const Workload& w, bool cuda);

// A step instance: one optimizer step per run(), and the allocator's high-water mark so far.
class StepInstance : public Instance {
 public:
  virtual int64_t peak_bytes() const = 0;
};

std::unique_ptr<StepInstance> make_cpu_step(const Workload& w);
std::unique_ptr<StepInstance> make_cuda_step(const Workload& w, const RunContext& ctx);

}  // namespace tb::step

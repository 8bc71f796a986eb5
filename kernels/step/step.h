// Stage `step`: one whole optimizer step of a workload (tuner/workloads/*.yaml or a user's file),
// what autotune measures. Before timing, the backend's first forward is checked token by token
// against a double-precision forward of the same model on the CPU.
#pragma once

#include <cstdint>
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

// Bytes one step of `w` keeps allocated at its peak (parameters, gradients, moments, activations).
double estimate_bytes(const Workload& w);
// Why this workload cannot run on `backend` here, or "".
std::string unsupported_reason(const Workload& w, bool cuda);

// With cuda_graphs, the step that captures the micro-step: the steps before it run eagerly (the
// first is the one check() compares), the ones after it are replays only.
inline constexpr int64_t graph_capture_step = 1;

// Per-token losses of one micro-batch as the step computed them, and the dataset samples it held.
struct MicroBatchLosses {
  std::vector<int32_t> samples;  // [B]
  std::vector<double> losses;    // [B, T]
};

// Timing marks a backend has taken since it was made, and the events it holds for them (CUDA's
// pool; 0 on the CPU, whose marks are clock reads).
struct MarkCount {
  int64_t taken = 0, pool = 0;
};

// A step instance: one optimizer step per run(), and the allocator's high-water mark so far.
class StepInstance : public Instance {
 public:
  virtual int64_t peak_bytes() const = 0;

  // What tests look at beyond check(). Storage for the next `count` micro-batches' losses is
  // reserved here and read back only by recorded_micro_batches(): recording never waits for the
  // step, so a batch overwritten while its copy is queued shows as a wrong loss.
  virtual void record_micro_batches(int64_t count) = 0;
  virtual std::vector<MicroBatchLosses> recorded_micro_batches() = 0;
  // AdamW's first moment: after one unclipped step from zero, (1 - beta1) x the summed gradients.
  virtual std::vector<double> exp_avg() = 0;
  virtual MarkCount marks() const = 0;
  // Whether the backend's stream is still capturing a graph (always false on the CPU).
  virtual bool capturing() const = 0;
};

std::unique_ptr<StepInstance> make_cpu_step(const Workload& w);
std::unique_ptr<StepInstance> make_cuda_step(const Workload& w, const RunContext& ctx);

}  // namespace tb::step

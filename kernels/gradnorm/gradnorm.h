// Stage `gradnorm`: clip_grad_norm_ over a model-shaped set of gradients (the `adamw` stage's
// parameter set): the 2-norm of all gradients together, then every gradient scaled by
// min(1, max_norm / (norm + 1e-6)). Three ways: a norm per tensor read back by the host each time
// (the K-1 pattern of seeds/003, `p.grad.norm().item()` per node), one multi-tensor norm read once,
// and norm and clip both on the device with no host read (the clip factor never leaves the GPU).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "adamw/param_set.h"
#include "runtime/registry.h"

namespace tb::gradnorm {

using adamw::Dtype;
using adamw::ParamSet;

enum class Kind { per_tensor, multi_tensor, fused };

// Elements per chunk of the multi-tensor passes (a CUDA block's, or a CPU loop iteration's, work).
inline constexpr int64_t chunk = 8192;
// PyTorch's CPU ops run on one thread below this many elements (at::internal::GRAIN_SIZE).
inline constexpr int64_t cpu_grain = 32768;

// Per call: kernel launches (CUDA) or parallel loops (CPU), and device-to-host reads with a stream
// synchronisation (CUDA; what `.item()` costs).
int64_t cuda_launches(const ParamSet& set, Kind kind);
int64_t cuda_host_reads(const ParamSet& set, Kind kind);
int64_t cpu_passes(const ParamSet& set, Kind kind);

// The gradients after the last call, every tensor concatenated and widened to float, and the total
// norm that call computed (before clipping), as clip_grad_norm_ returns it.
struct HostGrads {
  std::vector<float> grad;
  double norm = 0;
};

// Every instance of this stage is also a GradSource, so tests can compare variants directly.
class GradSource {
 public:
  virtual ~GradSource() = default;
  virtual HostGrads grads() = 0;  // synchronises
  virtual int64_t calls() const = 0;
};

// ---- reference: plain loops, the norm in double ------------------------------------------------
// `calls` clip_grad_norm_ calls from the deterministic gradients (seed_grad), the gradients rounded
// to their dtype after each.
HostGrads reference_grads(const ParamSet& set, Dtype dtype, int64_t calls);
// The norm with fp32's tolerance; the gradients with the dtype's, its absolute part taken relative
// to the largest reference gradient (clipping scales them by 1 / norm, far below atol's scale).
Verdict check_grads(const ParamSet& set, Dtype dtype, int64_t calls, const HostGrads& got);

// ---- variants ---------------------------------------------------------------------------------
std::unique_ptr<Instance> make_cpu(const Problem& problem, const RunContext& ctx, Kind kind);
std::unique_ptr<Instance> make_cuda(const Problem& problem, const RunContext& ctx, Kind kind);

}  // namespace tb::gradnorm

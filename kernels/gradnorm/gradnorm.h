// Stage `gradnorm`: clip_grad_norm_ over a model-shaped set of gradients (the `adamw` stage's
// parameter set): the 2-norm of all gradients together, then every gradient scaled by
// min(1, max_norm / (norm + 1e-6)). Three ways: a norm per tensor read back by the host each time
// (the K-1 pattern of docs/sources.md#003-t4-transformer, `p.grad.norm().item()` per node), one multi-tensor norm read once,
// and norm and clip both on the device with no host read (the clip factor never leaves the GPU).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "adamw/param_set.h"
#include "runtime/cpu_elementwise.h"
#include "runtime/registry.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*: the CUDA functions below take one without this
                     // header needing the toolkit's

namespace tb::gradnorm {

using adamw::Dtype;
using adamw::ParamSet;

enum class Kind { per_tensor, multi_tensor, fused };

// Elements per chunk of the multi-tensor passes (a CUDA block's, or a CPU loop iteration's, work).
inline constexpr int64_t chunk = 8192;
// PyTorch's CPU ops run on one thread below this many elements (at::internal::GRAIN_SIZE).
inline constexpr int64_t cpu_grain = cpu::parallel_threshold;

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

// ---- clipping as a function over buffers: what the stage's variants and the training step call ----
// clip_grad_norm_(max_norm) over `set`'s tensors in the arena `grad`, `kind`'s way; returns the total
// norm before clipping. max_norm <= 0: the norm only (no scaling). `partial` holds one double per
// OpenMP thread (the fused way's partial sums).
template <class G>
double cpu_clip(Kind kind, const ParamSet& set, const std::vector<adamw::Chunk>& chunks, G* grad, double max_norm,
                double* partial);
// min(1, max_norm / (norm + 1e-6)), clip_grad_norm_'s coefficient; 1 when max_norm <= 0.
double clip_coefficient(double norm, double max_norm);
// The reference over packed buffers, in double (the training step's oracle).
double reference_clip(double* grad, int64_t n, double max_norm);

// What clipping on the GPU works over, built once for `set` and owned (RAII) by the caller: the
// chunk table, each tensor's first chunk, the norm kernel's block partials and ticket, the per-tensor
// norms (defined in gradnorm_cuda.cu). Correct for any arena laid out as `set` says, the training
// step's packed gradients included.
class CudaClipPlan {
 public:
  virtual ~CudaClipPlan() = default;
  virtual const ParamSet& set() const = 0;
  virtual int64_t device_bytes() const = 0;  // what the plan holds on the device
};
std::unique_ptr<CudaClipPlan> make_cuda_clip_plan(const ParamSet& set, CUstream_st* stream);
// clip_grad_norm_(max_norm) over the arena `grad` on `stream`, `kind`'s way: the total norm before
// clipping into *norm (device memory), the gradients scaled in place. per_tensor and multi_tensor
// read norms back to the host (and synchronise); fused never does, the clip factor computed on the
// device, so it may be captured in a graph. max_norm <= 0: the norm only. bf16 as its bits (uint16_t).
void cuda_clip(Kind kind, CudaClipPlan& plan, float* grad, double max_norm, float* norm, CUstream_st* stream);
void cuda_clip(Kind kind, CudaClipPlan& plan, uint16_t* grad, double max_norm, float* norm, CUstream_st* stream);

// ---- variants ---------------------------------------------------------------------------------
std::unique_ptr<Instance> make_cpu(const Problem& problem, const RunContext& ctx, Kind kind);
std::unique_ptr<Instance> make_cuda(const Problem& problem, const RunContext& ctx, Kind kind);

}  // namespace tb::gradnorm

// Stage `adamw`: one AdamW step with PyTorch's semantics (decoupled weight decay, bias correction
// from the step count) over a model-shaped parameter set, three ways: PyTorch's for-loop path (one
// pass per elementwise op per tensor), its foreach path (the same passes over lists of tensors) and
// one fused pass. fp32, or bf16 parameters and gradients with fp32 optimizer state.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "adamw/param_set.h"
#include "runtime/cpu_elementwise.h"
#include "runtime/registry.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*: the CUDA functions below take one without this
                     // header needing the toolkit's

namespace tb::adamw {

enum class Kind { per_tensor, foreach, fused };

// The constants of step `step` (1 for the first), in float as every variant uses them.
struct StepScalars {
  float lr, beta1, beta2, eps;
  float one_minus_beta1, one_minus_beta2;
  float decay;                  // 1 - lr * weight_decay: param.mul_(decay) of the for-loop path
  float lr_weight_decay;        // lr * weight_decay: param -= lr * weight_decay * param of the fused path
  float step_size;              // lr / (1 - beta1^step)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
};
StepScalars step_scalars(int64_t step);  // the stage's hyperparameters (defaults.h)
// torch.optim.AdamW's hyperparameters: the training step's come from its workload.
struct Hyper {
  double lr, beta1, beta2, eps, weight_decay;
};
Hyper stage_hyper();  // the stage's (defaults.h)
StepScalars step_scalars(const Hyper& h, int64_t step);

// The per-tensor update of torch.optim.AdamW's for-loop path (_single_tensor_adamw), in its order;
// the foreach path (_multi_tensor_adamw) runs the same ops, each over all tensors.
//   0 param.mul_(1 - lr * wd)                     4 root = exp_avg_sq.sqrt()
//   1 exp_avg.lerp_(grad, 1 - beta1)              5 denom = root / sqrt(bias_correction2)
//   2 exp_avg_sq.mul_(beta2)                      6 denom.add_(eps)
//   3 exp_avg_sq.addcmul_(grad, grad, 1 - beta2)  7 param.addcdiv_(exp_avg, denom, -step_size)
// root and denom are the temporaries the for-loop path allocates (op 5 is out of place there);
// foreach has one temporary list and divides it in place (_foreach_div_).
inline constexpr int op_count = 8;
// Tensor lists each op reads or writes (multi_tensor_apply's depth), which bounds a launch's tensors.
inline constexpr int op_depth[op_count] = {1, 2, 1, 3, 2, 1, 1, 3};

// Multi-tensor apply as PyTorch does it: 64Ki-element chunks, at most 320 blocks and, by depth,
// 110 / 64 / 48 tensors per launch (what fits the 4 KiB of kernel parameters).
inline constexpr int64_t list_chunk = 65536;
inline constexpr int list_max_blocks = 320;
inline constexpr int list_max_tensors[3] = {110, 64, 48};
// The fused CUDA kernel: one block per chunk of a chunk table kept on the device; 8Ki elements
// (224 KiB of fp32 traffic) per block, so ~4000 blocks at the default size and a short last wave.
inline constexpr int64_t fused_chunk = 8192;
// CPU multi-tensor loops: work items of this many elements, statically scheduled over the team.
inline constexpr int64_t cpu_chunk = 16384;
// PyTorch's CPU ops (at::internal::GRAIN_SIZE) run on one thread below this many elements.
inline constexpr int64_t cpu_grain = cpu::parallel_threshold;

// Per call: kernel launches (CUDA) or passes over memory, i.e. parallel loops (CPU).
int64_t cuda_launches(const ParamSet& set, Kind kind);
int64_t cpu_passes(const ParamSet& set, Kind kind);

// The optimizer state, every tensor concatenated (no padding), parameters widened to float.
struct HostState {
  std::vector<float> param, exp_avg, exp_avg_sq;
};

// Every instance of this stage is also a StateSource, so that tests can compare variants with each
// other and not only with the reference.
class StateSource {
 public:
  virtual ~StateSource() = default;
  virtual HostState state() = 0;  // synchronises
  virtual int64_t steps() const = 0;
};

// ---- reference: plain loops in double, the oracle ---------------------------------------------
// `steps` AdamW steps from the deterministic start (parameters and gradients from seed_param and
// seed_grad, gradients fixed across steps, exp_avg = exp_avg_sq = 0), each value rounded to its
// storage type after every step.
HostState reference_state(const ParamSet& set, Dtype dtype, int64_t steps);
// Compares `got` after `steps` steps with the reference: parameters with the dtype's tolerance,
// exp_avg and exp_avg_sq (fp32 state) with fp32's.
Verdict check_state(const ParamSet& set, Dtype dtype, int64_t steps, const HostState& got);

// ---- the update as a function over buffers: what the stage's variants and the training step call -----
// The buffers one step updates: `set`'s tensors at set.offsets of each arena.
template <class P>
struct State {
  P* param;
  const P* grad;
  float* exp_avg;
  float* exp_avg_sq;
};

// What a CPU update works over: the set's chunks and the loop paths' temporaries (the for-loop
// path's per tensor, the foreach path's per arena), allocated once.
class CpuPlan {
 public:
  CpuPlan(const ParamSet& set, Kind kind);
  const ParamSet& set() const { return set_; }
  Kind kind() const { return kind_; }
  const std::vector<Chunk>& chunks() const { return chunks_; }
  float* root() { return root_.data(); }
  float* denom() { return denom_.data(); }
  // The temporaries it holds (foreach: one the size of every parameter), for a caller's memory meter.
  int64_t host_bytes() const { return static_cast<int64_t>((root_.size() + denom_.size()) * sizeof(float)); }

 private:
  ParamSet set_;
  Kind kind_;
  std::vector<Chunk> chunks_;
  std::vector<float> root_, denom_;
};
// One AdamW step over every tensor, `plan.kind()`'s way.
void cpu_step(CpuPlan& plan, const State<float>& x, const StepScalars& s);
void cpu_step(CpuPlan& plan, const State<uint16_t>& x, const StepScalars& s);
// The reference update over buffers, in T (the training step's double oracle): packed tensors.
void reference_step(int64_t n, double* param, const double* grad, double* exp_avg, double* exp_avg_sq, const Hyper& h,
                    int64_t step);

// What a CUDA update works over, built once for `set` and `kind` and owned (RAII) by the caller: the
// fused kernel's chunk table, foreach's launch plans, the for-loop and foreach paths' temporaries
// (defined in adamw_cuda.cu). Correct for any arena laid out as `set` says, the training step's
// packed tensors included (a tensor whose start is not 16-byte aligned takes its first elements one
// at a time). Buffers are bound at each step: foreach rebuilds its launch parameters on the host when
// they change, so a step that never changes them allocates nothing and stays capturable.
class CudaPlan {
 public:
  virtual ~CudaPlan() = default;
  virtual const ParamSet& set() const = 0;
  virtual Kind kind() const = 0;
  virtual int64_t device_bytes() const = 0;  // what the plan holds on the device
};
std::unique_ptr<CudaPlan> make_cuda_plan(const ParamSet& set, Kind kind, CUstream_st* stream);
// One AdamW step over every tensor, `plan.kind()`'s way, on `stream`; bf16 as its bits (uint16_t).
void cuda_step(CudaPlan& plan, const State<float>& x, const StepScalars& s, CUstream_st* stream);
void cuda_step(CudaPlan& plan, const State<uint16_t>& x, const StepScalars& s, CUstream_st* stream);

// ---- variants ---------------------------------------------------------------------------------
std::unique_ptr<Instance> make_cpu(const Problem& problem, const RunContext& ctx, Kind kind);
std::unique_ptr<Instance> make_cuda(const Problem& problem, const RunContext& ctx, Kind kind);

}  // namespace tb::adamw

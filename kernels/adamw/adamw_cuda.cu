// AdamW on the GPU, three ways: one kernel per elementwise op per tensor (PyTorch's for-loop path,
// 8 x tensors launches), the same ops over chunked tensor lists in kernel parameters (PyTorch's
// multi_tensor_apply, a few launches per op), and one fused multi-tensor kernel over a chunk table
// on the device (one launch, 28 B per fp32 parameter). make_cuda_plan and cuda_step are what the
// stage's instances and the training step call.
#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <memory>
#include <type_traits>

#include "adamw.h"
#include "adamw/multi_tensor.cuh"
#include "runtime/cuda_raii.h"

namespace tb::adamw {

namespace {

using device::from_float;
using device::to_float;

constexpr int block_size = 256;
constexpr int ilp = 4;  // elements in flight per thread in the op kernels (PyTorch's kILP)

// ---- the eight ops of the for-loop path --------------------------------------------------------
// Each op names the tensor lists it touches (its depth), loads a thread's elements into registers
// (all loads of a thread's ILP elements go out before any store), then computes and stores.

template <class P>
struct DecayParam {  // param.mul_(1 - lr * weight_decay)
  static constexpr int depth = 1;
  float decay;
  struct Ptrs {
    P* param;
  };
  struct Regs {
    float param;
  };
  static __device__ Ptrs bind(void* const* l) { return {static_cast<P*>(l[0])}; }
  static __device__ Regs load(const Ptrs& q, int64_t i) { return {to_float(q.param[i])}; }
  __device__ void store(const Ptrs& q, int64_t i, const Regs& r) const { q.param[i] = from_float<P>(r.param * decay); }
};

template <class P>
struct LerpExpAvg {  // exp_avg.lerp_(grad, 1 - beta1), weight < 0.5: self + weight * (end - self)
  static constexpr int depth = 2;
  float weight;
  struct Ptrs {
    float* exp_avg;
    const P* grad;
  };
  struct Regs {
    float exp_avg, grad;
  };
  static __device__ Ptrs bind(void* const* l) { return {static_cast<float*>(l[0]), static_cast<const P*>(l[1])}; }
  static __device__ Regs load(const Ptrs& q, int64_t i) { return {q.exp_avg[i], to_float(q.grad[i])}; }
  __device__ void store(const Ptrs& q, int64_t i, const Regs& r) const {
    q.exp_avg[i] = r.exp_avg + weight * (r.grad - r.exp_avg);
  }
};

struct ScaleExpAvgSq {  // exp_avg_sq.mul_(beta2)
  static constexpr int depth = 1;
  float beta2;
  struct Ptrs {
    float* exp_avg_sq;
  };
  struct Regs {
    float exp_avg_sq;
  };
  static __device__ Ptrs bind(void* const* l) { return {static_cast<float*>(l[0])}; }
  static __device__ Regs load(const Ptrs& q, int64_t i) { return {q.exp_avg_sq[i]}; }
  __device__ void store(const Ptrs& q, int64_t i, const Regs& r) const { q.exp_avg_sq[i] = r.exp_avg_sq * beta2; }
};

template <class P>
struct AddcmulExpAvgSq {  // exp_avg_sq.addcmul_(grad, grad, value=1 - beta2): three lists, grad twice
  static constexpr int depth = 3;
  float value;
  struct Ptrs {
    float* exp_avg_sq;
    const P* t1;
    const P* t2;
  };
  struct Regs {
    float exp_avg_sq, t1, t2;
  };
  static __device__ Ptrs bind(void* const* l) {
    return {static_cast<float*>(l[0]), static_cast<const P*>(l[1]), static_cast<const P*>(l[2])};
  }
  static __device__ Regs load(const Ptrs& q, int64_t i) { return {q.exp_avg_sq[i], to_float(q.t1[i]), to_float(q.t2[i])}; }
  __device__ void store(const Ptrs& q, int64_t i, const Regs& r) const {
    q.exp_avg_sq[i] = r.exp_avg_sq + value * r.t1 * r.t2;
  }
};

struct SqrtRoot {  // root = exp_avg_sq.sqrt(): out of place, into a temporary
  static constexpr int depth = 2;
  struct Ptrs {
    const float* exp_avg_sq;
    float* root;
  };
  struct Regs {
    float exp_avg_sq;
  };
  static __device__ Ptrs bind(void* const* l) { return {static_cast<const float*>(l[0]), static_cast<float*>(l[1])}; }
  static __device__ Regs load(const Ptrs& q, int64_t i) { return {q.exp_avg_sq[i]}; }
  __device__ void store(const Ptrs& q, int64_t i, const Regs& r) const { q.root[i] = sqrtf(r.exp_avg_sq); }
};

// denom = root / sqrt(bias_correction2): out of place in the for-loop path (a second temporary),
// in place in foreach (_foreach_div_, one list: root and denom are the same).
struct DivRoot {
  static constexpr int depth = 1;
  float divisor;
  struct Ptrs {
    const float* root;
    float* denom;
  };
  struct Regs {
    float root;
  };
  static __device__ Ptrs bind(void* const* l) { return {static_cast<const float*>(l[0]), static_cast<float*>(l[0])}; }
  static __device__ Regs load(const Ptrs& q, int64_t i) { return {q.root[i]}; }
  __device__ void store(const Ptrs& q, int64_t i, const Regs& r) const { q.denom[i] = r.root / divisor; }
};

struct AddEpsDenom {  // denom.add_(eps)
  static constexpr int depth = 1;
  float eps;
  struct Ptrs {
    float* denom;
  };
  struct Regs {
    float denom;
  };
  static __device__ Ptrs bind(void* const* l) { return {static_cast<float*>(l[0])}; }
  static __device__ Regs load(const Ptrs& q, int64_t i) { return {q.denom[i]}; }
  __device__ void store(const Ptrs& q, int64_t i, const Regs& r) const { q.denom[i] = r.denom + eps; }
};

template <class P>
struct AddcdivParam {  // param.addcdiv_(exp_avg, denom, value=-step_size)
  static constexpr int depth = 3;
  float value;
  struct Ptrs {
    P* param;
    const float* exp_avg;
    const float* denom;
  };
  struct Regs {
    float param, exp_avg, denom;
  };
  static __device__ Ptrs bind(void* const* l) {
    return {static_cast<P*>(l[0]), static_cast<const float*>(l[1]), static_cast<const float*>(l[2])};
  }
  static __device__ Regs load(const Ptrs& q, int64_t i) { return {to_float(q.param[i]), q.exp_avg[i], q.denom[i]}; }
  __device__ void store(const Ptrs& q, int64_t i, const Regs& r) const {
    q.param[i] = from_float<P>(r.param + value * r.exp_avg / r.denom);
  }
};

// Elements [begin, end) of one tensor, `ilp` per thread per round, coalesced across the block.
template <class Op>
__device__ __forceinline__ void apply_range(const Op& op, const typename Op::Ptrs& q, int64_t begin, int64_t end) {
  for (int64_t base = begin; base < end; base += int64_t{blockDim.x} * ilp) {
    typename Op::Regs r[ilp] = {};
#pragma unroll
    for (int k = 0; k < ilp; ++k) {
      const int64_t i = base + threadIdx.x + int64_t{k} * blockDim.x;
      if (i < end) r[k] = Op::load(q, i);
    }
#pragma unroll
    for (int k = 0; k < ilp; ++k) {
      const int64_t i = base + threadIdx.x + int64_t{k} * blockDim.x;
      if (i < end) op.store(q, i, r[k]);
    }
  }
}

// One tensor, one op: a block per block_size * ilp elements, as PyTorch's elementwise kernels.
template <class Op>
__global__ void __launch_bounds__(block_size) per_tensor_kernel(Op op, typename Op::Ptrs q, int64_t n) {
  const int64_t begin = int64_t{blockIdx.x} * block_size * ilp;
  apply_range(op, q, begin, min(begin + int64_t{block_size} * ilp, n));
}

// multi_tensor_apply's kernel parameters: the tensor lists and which chunk of which tensor each
// block takes; sized by depth to stay within the 4 KiB a kernel's parameters may use.
template <int Depth>
struct TensorListMeta {
  static constexpr int max_tensors = list_max_tensors[Depth - 1];
  void* addresses[Depth][max_tensors];
  int64_t sizes[max_tensors];
  unsigned char block_to_tensor[list_max_blocks];
  int block_to_chunk[list_max_blocks];
};
static_assert(sizeof(TensorListMeta<1>) <= 4000 && sizeof(TensorListMeta<2>) <= 4000 && sizeof(TensorListMeta<3>) <= 4000,
              "multi_tensor_apply metadata must fit the kernel parameters");

template <class Op>
__global__ void __launch_bounds__(block_size) foreach_kernel(Op op, TensorListMeta<Op::depth> meta) {
  const int t = meta.block_to_tensor[blockIdx.x];
  const int64_t begin = int64_t{meta.block_to_chunk[blockIdx.x]} * list_chunk;
  void* lists[Op::depth];
#pragma unroll
  for (int k = 0; k < Op::depth; ++k) lists[k] = meta.addresses[k][t];
  apply_range(op, Op::bind(lists), begin, min(begin + list_chunk, meta.sizes[t]));
}

template <int Depth>
struct ListLaunchArgs {
  TensorListMeta<Depth> meta;
  int blocks;
};

// The kernel parameters of one foreach op over the buffers `lists` (list k's arena, its elements of
// `bytes[k]` bytes), from its launches planned for the set.
template <int Depth>
std::vector<ListLaunchArgs<Depth>> bind_lists(const ParamSet& set, const std::vector<ListLaunch>& launches,
                                              const std::array<void*, Depth>& lists, const std::array<int, Depth>& bytes) {
  std::vector<ListLaunchArgs<Depth>> out;
  for (const ListLaunch& plan : launches) {
    ListLaunchArgs<Depth> args{};
    for (std::size_t j = 0; j < plan.tensors.size(); ++j) {
      const int64_t t = plan.tensors[j];
      for (int k = 0; k < Depth; ++k) args.meta.addresses[k][j] = static_cast<char*>(lists[k]) + set.offsets[t] * bytes[k];
      args.meta.sizes[j] = set.sizes[t];
    }
    for (std::size_t b = 0; b < plan.blocks.size(); ++b) {
      args.meta.block_to_tensor[b] = static_cast<unsigned char>(plan.blocks[b].first);
      args.meta.block_to_chunk[b] = static_cast<int>(plan.blocks[b].second);
    }
    args.blocks = static_cast<int>(plan.blocks.size());
    out.push_back(args);
  }
  return out;
}

// ---- the fused kernel --------------------------------------------------------------------------

// PyTorch's _fused_adamw arithmetic (ADAMW mode), in fp32 whatever the storage.
__device__ __forceinline__ void adamw_update(float& param, float grad, float& exp_avg, float& exp_avg_sq,
                                             const StepScalars& s) {
  param -= s.lr_weight_decay * param;
  exp_avg = s.beta1 * exp_avg + s.one_minus_beta1 * grad;
  exp_avg_sq = s.beta2 * exp_avg_sq + s.one_minus_beta2 * grad * grad;
  const float denom = sqrtf(exp_avg_sq) / s.bias_correction2_sqrt + s.eps;
  param -= s.step_size * exp_avg / denom;
}

template <class P>
__device__ __forceinline__ void adamw_update_at(P* param, const P* grad, float* exp_avg, float* exp_avg_sq, int i,
                                                const StepScalars& s) {
  float p = to_float(param[i]), m = exp_avg[i], v = exp_avg_sq[i];
  adamw_update(p, to_float(grad[i]), m, v, s);
  param[i] = from_float<P>(p);
  exp_avg[i] = m;
  exp_avg_sq[i] = v;
}

// One block per chunk of the device chunk table, every tensor in one launch; four elements per
// access from the first element where all four buffers are 16-byte aligned (a chunk's start in the
// stages' arenas; up to 3 elements in for the step's packed tensors), one at a time before and after.
template <class P>
__global__ void __launch_bounds__(block_size)
    adamw_fused_kernel(P* param_arena, const P* grad_arena, float* exp_avg_arena, float* exp_avg_sq_arena,
                       const device::DeviceChunk* chunks, StepScalars s) {
  const device::DeviceChunk c = chunks[blockIdx.x];
  P* __restrict__ param = param_arena + c.begin;
  const P* __restrict__ grad = grad_arena + c.begin;
  float* __restrict__ exp_avg = exp_avg_arena + c.begin;
  float* __restrict__ exp_avg_sq = exp_avg_sq_arena + c.begin;
  const int n = c.len;
  const int aligned_from = device::quad_head(param, grad, exp_avg, exp_avg_sq);
  const int head = aligned_from < 0 ? n : min(aligned_from, n);
  const int quads = (n - head) / 4;
  for (int i = threadIdx.x; i < head; i += block_size) adamw_update_at(param, grad, exp_avg, exp_avg_sq, i, s);
  for (int k = threadIdx.x; k < quads; k += block_size) {
    const int at = head + 4 * k;
    float p[4], g[4], m[4], v[4];
    device::load4(param + at, p);
    device::load4(grad + at, g);
    device::load4(exp_avg + at, m);
    device::load4(exp_avg_sq + at, v);
#pragma unroll
    for (int j = 0; j < 4; ++j) adamw_update(p[j], g[j], m[j], v[j], s);
    device::store4(param + at, p);
    device::store4(exp_avg + at, m);
    device::store4(exp_avg_sq + at, v);
  }
  for (int i = head + 4 * quads + threadIdx.x; i < n; i += block_size)
    adamw_update_at(param, grad, exp_avg, exp_avg_sq, i, s);
}

// ---- the update as a function over buffers -----------------------------------------------------

// The buffers the foreach launches were last bound to: their kernel parameters hold addresses.
struct BoundBuffers {
  const void* param = nullptr;
  const void* grad = nullptr;
  const void* exp_avg = nullptr;
  const void* exp_avg_sq = nullptr;
  int param_bytes = 0;
  bool operator==(const BoundBuffers& o) const {
    return param == o.param && grad == o.grad && exp_avg == o.exp_avg && exp_avg_sq == o.exp_avg_sq &&
           param_bytes == o.param_bytes;
  }
};

class CudaPlanImpl final : public CudaPlan {
 public:
  CudaPlanImpl(const ParamSet& set, Kind kind, cudaStream_t stream)
      : set_(set),
        kind_(kind),
        root_(static_cast<std::size_t>(kind == Kind::per_tensor ? std::max<int64_t>(set.largest(), 1)
                                       : kind == Kind::foreach  ? set.arena
                                                                : 0)),
        denom_(static_cast<std::size_t>(kind == Kind::per_tensor ? std::max<int64_t>(set.largest(), 1) : 0)) {
    if (kind == Kind::foreach)
      for (int depth = 1; depth <= 3; ++depth)
        planned_[depth - 1] = plan_list_launches(set, list_max_tensors[depth - 1], list_max_blocks, list_chunk);
    if (kind == Kind::fused) chunks_ = device::upload_chunks(set, fused_chunk, stream);
  }
  const ParamSet& set() const override { return set_; }
  Kind kind() const override { return kind_; }
  int64_t device_bytes() const override { return static_cast<int64_t>(root_.bytes() + denom_.bytes() + chunks_.bytes()); }

  template <class P>
  void step(const State<P>& x, const StepScalars& s, cudaStream_t stream) {
    switch (kind_) {
      case Kind::per_tensor:
        return run_per_tensor(x, s, stream);
      case Kind::foreach:
        return run_foreach(x, s, stream);
      case Kind::fused:
        return run_fused(x, s, stream);
    }
  }

 private:
  template <class Op>
  static void launch_per_tensor(const Op& op, const typename Op::Ptrs& q, int64_t n, cudaStream_t stream) {
    const auto grid = static_cast<unsigned>((n + block_size * ilp - 1) / (block_size * ilp));
    per_tensor_kernel<<<grid, block_size, 0, stream>>>(op, q, n);
    CUDA_CHECK(cudaGetLastError());
  }

  template <class P>
  void run_per_tensor(const State<P>& x, const StepScalars& s, cudaStream_t stream) {
    float* root = root_.data();
    float* denom = denom_.data();
    for (int64_t t = 0; t < set_.count(); ++t) {
      const int64_t n = set_.sizes[t];
      if (n == 0) continue;
      const int64_t o = set_.offsets[t];
      P* param = x.param + o;
      const P* grad = x.grad + o;
      float* exp_avg = x.exp_avg + o;
      float* exp_avg_sq = x.exp_avg_sq + o;
      launch_per_tensor(DecayParam<P>{s.decay}, {param}, n, stream);
      launch_per_tensor(LerpExpAvg<P>{s.one_minus_beta1}, {exp_avg, grad}, n, stream);
      launch_per_tensor(ScaleExpAvgSq{s.beta2}, {exp_avg_sq}, n, stream);
      launch_per_tensor(AddcmulExpAvgSq<P>{s.one_minus_beta2}, {exp_avg_sq, grad, grad}, n, stream);
      launch_per_tensor(SqrtRoot{}, {exp_avg_sq, root}, n, stream);
      launch_per_tensor(DivRoot{s.bias_correction2_sqrt}, {root, denom}, n, stream);
      launch_per_tensor(AddEpsDenom{s.eps}, {denom}, n, stream);
      launch_per_tensor(AddcdivParam<P>{-s.step_size}, {param, exp_avg, denom}, n, stream);
    }
  }

  // The kernel parameters of every op for these buffers: built on the host when the buffers change
  // (the first step), kept while they do not.
  template <class P>
  void bind_foreach(const State<P>& x) {
    const BoundBuffers now{x.param, x.grad, x.exp_avg, x.exp_avg_sq, static_cast<int>(sizeof(P))};
    if (now == bound_) return;
    constexpr int pb = sizeof(P), fb = sizeof(float);
    void* param = x.param;
    void* grad = const_cast<P*>(x.grad);  // the lists are untyped; the ops only read gradients
    void* exp_avg = x.exp_avg;
    void* exp_avg_sq = x.exp_avg_sq;
    void* denom = root_.data();  // foreach divides its one temporary list in place
    const auto& depth1 = planned_[0];
    const auto& depth2 = planned_[1];
    const auto& depth3 = planned_[2];
    decay_ = bind_lists<1>(set_, depth1, {param}, {pb});
    lerp_ = bind_lists<2>(set_, depth2, {exp_avg, grad}, {fb, pb});
    scale_ = bind_lists<1>(set_, depth1, {exp_avg_sq}, {fb});
    addcmul_ = bind_lists<3>(set_, depth3, {exp_avg_sq, grad, grad}, {fb, pb, pb});
    sqrt_ = bind_lists<2>(set_, depth2, {exp_avg_sq, denom}, {fb, fb});
    div_ = bind_lists<1>(set_, depth1, {denom}, {fb});
    add_ = bind_lists<1>(set_, depth1, {denom}, {fb});
    addcdiv_ = bind_lists<3>(set_, depth3, {param, exp_avg, denom}, {pb, fb, fb});
    bound_ = now;
  }

  template <class Op>
  static void launch_lists(const Op& op, const std::vector<ListLaunchArgs<Op::depth>>& launches, cudaStream_t stream) {
    for (const auto& l : launches) {
      foreach_kernel<<<l.blocks, block_size, 0, stream>>>(op, l.meta);
      CUDA_CHECK(cudaGetLastError());
    }
  }

  template <class P>
  void run_foreach(const State<P>& x, const StepScalars& s, cudaStream_t stream) {
    bind_foreach(x);
    launch_lists(DecayParam<P>{s.decay}, decay_, stream);
    launch_lists(LerpExpAvg<P>{s.one_minus_beta1}, lerp_, stream);
    launch_lists(ScaleExpAvgSq{s.beta2}, scale_, stream);
    launch_lists(AddcmulExpAvgSq<P>{s.one_minus_beta2}, addcmul_, stream);
    launch_lists(SqrtRoot{}, sqrt_, stream);
    launch_lists(DivRoot{s.bias_correction2_sqrt}, div_, stream);
    launch_lists(AddEpsDenom{s.eps}, add_, stream);
    launch_lists(AddcdivParam<P>{-s.step_size}, addcdiv_, stream);
  }

  template <class P>
  void run_fused(const State<P>& x, const StepScalars& s, cudaStream_t stream) {
    if (chunks_.size() == 0) return;  // every tensor empty
    adamw_fused_kernel<P><<<static_cast<unsigned>(chunks_.size()), block_size, 0, stream>>>(x.param, x.grad, x.exp_avg,
                                                                                            x.exp_avg_sq, chunks_.data(), s);
    CUDA_CHECK(cudaGetLastError());
  }

  ParamSet set_;
  Kind kind_;
  cuda::DeviceBuffer<float> root_, denom_;  // the temporaries: per tensor (for-loop path) or per arena (foreach)
  // foreach: the launches planned for the set (by depth), and each op's kernel parameters as bound
  std::vector<ListLaunch> planned_[3];
  BoundBuffers bound_;
  std::vector<ListLaunchArgs<1>> decay_, scale_, div_, add_;
  std::vector<ListLaunchArgs<2>> lerp_, sqrt_;
  std::vector<ListLaunchArgs<3>> addcmul_, addcdiv_;
  cuda::DeviceBuffer<device::DeviceChunk> chunks_;  // fused: the chunk table
};

// ---- the instance ------------------------------------------------------------------------------

template <class P>
class CudaAdamw final : public Instance, public StateSource {
 public:
  CudaAdamw(const ParamSet& set, Dtype dtype, Kind kind, const RunContext& ctx)
      : set_(set),
        dtype_(dtype),
        stream_(cuda::as_stream(ctx.cuda_stream)),
        param_(device::upload_initial_arena<P>(set, seed_param, stream_)),
        grad_(device::upload_initial_arena<P>(set, seed_grad, stream_)),
        exp_avg_(static_cast<std::size_t>(set.arena)),
        exp_avg_sq_(static_cast<std::size_t>(set.arena)),
        plan_(make_cuda_plan(set, kind, stream_)) {
    CUDA_CHECK(cudaMemsetAsync(exp_avg_.data(), 0, exp_avg_.bytes(), stream_));
    CUDA_CHECK(cudaMemsetAsync(exp_avg_sq_.data(), 0, exp_avg_sq_.bytes(), stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void run() override {
    const StepScalars s = step_scalars(++steps_);
    if constexpr (std::is_same_v<P, float>) {
      cuda_step(*plan_, State<float>{param_.data(), grad_.data(), exp_avg_.data(), exp_avg_sq_.data()}, s, stream_);
    } else {
      cuda_step(*plan_,
                State<uint16_t>{reinterpret_cast<uint16_t*>(param_.data()), reinterpret_cast<const uint16_t*>(grad_.data()),
                                exp_avg_.data(), exp_avg_sq_.data()},
                s, stream_);
    }
  }

  Verdict check() override {
    CUDA_CHECK(cudaGetLastError());
    return check_state(set_, dtype_, steps_, state());
  }

  HostState state() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return HostState{device::download_gathered(set_, param_.data(), stream_),
                     device::download_gathered(set_, exp_avg_.data(), stream_),
                     device::download_gathered(set_, exp_avg_sq_.data(), stream_)};
  }
  int64_t steps() const override { return steps_; }

 private:
  ParamSet set_;
  Dtype dtype_;
  cudaStream_t stream_;
  cuda::DeviceBuffer<P> param_, grad_;
  cuda::DeviceBuffer<float> exp_avg_, exp_avg_sq_;
  std::unique_ptr<CudaPlan> plan_;
  int64_t steps_ = 0;
};

}  // namespace

std::unique_ptr<CudaPlan> make_cuda_plan(const ParamSet& set, Kind kind, CUstream_st* stream) {
  return std::make_unique<CudaPlanImpl>(set, kind, stream);
}

// make_cuda_plan makes every CudaPlan.
void cuda_step(CudaPlan& plan, const State<float>& x, const StepScalars& s, CUstream_st* stream) {
  static_cast<CudaPlanImpl&>(plan).step(x, s, stream);
}
void cuda_step(CudaPlan& plan, const State<uint16_t>& x, const StepScalars& s, CUstream_st* stream) {
  const State<__nv_bfloat16> bf16{reinterpret_cast<__nv_bfloat16*>(x.param), reinterpret_cast<const __nv_bfloat16*>(x.grad),
                                  x.exp_avg, x.exp_avg_sq};
  static_cast<CudaPlanImpl&>(plan).step(bf16, s, stream);
}

std::unique_ptr<Instance> make_cuda(const Problem& problem, const RunContext& ctx, Kind kind) {
  const ParamSet set = make_param_set(problem.get_int("params"), problem.get_int("tensors"));
  const Dtype dtype = dtype_from_string(problem.get("dtype"));
  if (dtype == Dtype::bf16) return std::make_unique<CudaAdamw<__nv_bfloat16>>(set, dtype, kind, ctx);
  return std::make_unique<CudaAdamw<float>>(set, dtype, kind, ctx);
}

}  // namespace tb::adamw

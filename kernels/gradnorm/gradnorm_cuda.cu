// Gradient norm and clipping on the GPU. per_tensor: per tensor a norm kernel, then a 4-byte
// device-to-host copy and a stream synchronisation (`p.grad.norm().item()`), then a scale kernel per
// tensor. multi_tensor: one multi-tensor norm kernel (a two-stage reduction whose last block sums
// the block partials), one read, one multi-tensor scale kernel. fused: the same two kernels, the scale
// kernel computing the clip factor from the norm in device memory, so the host never waits.
// make_cuda_clip_plan and cuda_clip are what the stage's instances and the training step call.
#include <cub/block/block_reduce.cuh>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <type_traits>
#include <vector>

#include "adamw/multi_tensor.cuh"
#include "gradnorm.h"
#include "runtime/cuda_raii.h"
#include "runtime/defaults.h"

namespace tb::gradnorm {

namespace {

using adamw::device::DeviceChunk;
using adamw::device::from_float;
using adamw::device::to_float;

constexpr int block_size = 256;
constexpr int norm_blocks_per_sm = 8;  // resident 256-thread blocks per SM: enough to stream at full bandwidth

// Sum of squares of chunks [first, first + count) of the table over the arena `grad`, grid-stride
// over chunks, accumulated in fp32 per thread; four elements per access from the chunk's first
// 16-byte-aligned element. Each block writes its partial; the last block to finish (a ticket counter
// that wraps back to 0 for the next launch) adds the partials in a fixed order and writes the norm.
template <class G>
__global__ void __launch_bounds__(block_size) norm_kernel(const G* grad, const DeviceChunk* chunks, int first, int count,
                                                          float* partials, unsigned* ticket, float* norm) {
  using BlockReduce = cub::BlockReduce<float, block_size>;
  __shared__ typename BlockReduce::TempStorage temp;
  __shared__ bool last_block;
  float acc = 0;
  for (int c = blockIdx.x; c < count; c += gridDim.x) {
    const DeviceChunk ch = chunks[first + c];
    const G* __restrict__ g = grad + ch.begin;
    const int aligned_from = adamw::device::quad_head(g);
    const int head = aligned_from < 0 ? ch.len : min(aligned_from, ch.len);
    const int quads = (ch.len - head) / 4;
    for (int i = threadIdx.x; i < head; i += block_size) {
      const float x = to_float(g[i]);
      acc += x * x;
    }
    for (int k = threadIdx.x; k < quads; k += block_size) {
      float x[4];
      adamw::device::load4(g + head + 4 * k, x);
      acc += x[0] * x[0] + x[1] * x[1] + x[2] * x[2] + x[3] * x[3];
    }
    for (int i = head + 4 * quads + threadIdx.x; i < ch.len; i += block_size) {
      const float x = to_float(g[i]);
      acc += x * x;
    }
  }
  const float block_sum = BlockReduce(temp).Sum(acc);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = block_sum;
    __threadfence();
    last_block = atomicInc(ticket, gridDim.x - 1) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  float sum = 0;
  for (int b = threadIdx.x; b < static_cast<int>(gridDim.x); b += block_size) sum += __ldcg(partials + b);
  __syncthreads();  // `temp` is reused
  const float total = BlockReduce(temp).Sum(sum);
  if (threadIdx.x == 0) *norm = sqrtf(total);
}

// Scales chunks [first, first + count) of the arena `grad` by the clip factor: `coef` from the host,
// or, when `device_norm` is set, min(1, max_norm / (norm + eps)) computed here from the norm on the
// device. `norm_out`, when set, receives `norm_value` (the host's total of per_tensor) from one
// thread: the norm reaches the device without a launch or a copy of its own.
template <class G>
__global__ void __launch_bounds__(block_size)
    scale_kernel(G* grad, const DeviceChunk* chunks, int first, float coef, const float* device_norm, float max_norm,
                 float norm_eps, float* norm_out, float norm_value) {
  if (norm_out && blockIdx.x == 0 && threadIdx.x == 0) *norm_out = norm_value;
  if (device_norm) coef = fminf(max_norm / (*device_norm + norm_eps), 1.0f);
  const DeviceChunk ch = chunks[first + blockIdx.x];
  G* __restrict__ g = grad + ch.begin;
  const int aligned_from = adamw::device::quad_head(g);
  const int head = aligned_from < 0 ? ch.len : min(aligned_from, ch.len);
  const int quads = (ch.len - head) / 4;
  for (int i = threadIdx.x; i < head; i += block_size) g[i] = from_float<G>(to_float(g[i]) * coef);
  for (int k = threadIdx.x; k < quads; k += block_size) {
    float x[4];
    adamw::device::load4(g + head + 4 * k, x);
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j] *= coef;
    adamw::device::store4(g + head + 4 * k, x);
  }
  for (int i = head + 4 * quads + threadIdx.x; i < ch.len; i += block_size) g[i] = from_float<G>(to_float(g[i]) * coef);
}

// ---- clipping as a function over buffers ------------------------------------------------------

class CudaClipPlanImpl final : public CudaClipPlan {
 public:
  CudaClipPlanImpl(const ParamSet& set, cudaStream_t stream)
      : set_(set),
        max_norm_blocks_(adamw::device::sm_count(current_device()) * norm_blocks_per_sm),
        chunks_(adamw::device::upload_chunks(set, chunk, stream)),
        partials_(static_cast<std::size_t>(max_norm_blocks_)),
        ticket_(1),
        norms_(static_cast<std::size_t>(std::max<int64_t>(set.count(), 1))) {
    // Where each tensor's chunks start in the table (chunks come in tensor order).
    int first = 0;
    for (const int64_t n : set.sizes) {
      first_chunk_.push_back(first);
      first += static_cast<int>((n + chunk - 1) / chunk);
    }
    first_chunk_.push_back(first);
    CUDA_CHECK(cudaMemsetAsync(ticket_.data(), 0, ticket_.bytes(), stream));
  }
  const ParamSet& set() const override { return set_; }
  int64_t device_bytes() const override {
    return static_cast<int64_t>(chunks_.bytes() + partials_.bytes() + ticket_.bytes() + norms_.bytes());
  }

  template <class G>
  void clip(Kind kind, G* grad, double max_norm, float* norm, cudaStream_t stream) {
    const int all = first_chunk_.back();
    if (all == 0) {  // every tensor empty: nothing to scale, a zero norm
      CUDA_CHECK(cudaMemsetAsync(norm, 0, sizeof(float), stream));
      return;
    }
    switch (kind) {
      case Kind::per_tensor:
        return clip_per_tensor(grad, max_norm, norm, stream);
      case Kind::multi_tensor:
        return clip_multi_tensor(grad, max_norm, norm, stream);
      case Kind::fused:
        return clip_fused(grad, max_norm, norm, stream);
    }
  }

 private:
  static int current_device() {  // the stream's: streams are made on the selected device
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    return device;
  }
  int chunks_of(int64_t t) const { return first_chunk_[t + 1] - first_chunk_[t]; }

  template <class G>
  void launch_norm(const G* grad, int first, int count, float* norm, cudaStream_t stream) {
    const int grid = std::min(count, max_norm_blocks_);
    norm_kernel<<<grid, block_size, 0, stream>>>(grad, chunks_.data(), first, count, partials_.data(), ticket_.data(), norm);
    CUDA_CHECK(cudaGetLastError());
  }

  template <class G>
  void launch_scale(G* grad, int first, int count, float coef, const float* device_norm, double max_norm, float* norm_out,
                    float norm_value, cudaStream_t stream) {
    scale_kernel<<<count, block_size, 0, stream>>>(grad, chunks_.data(), first, coef, device_norm,
                                                   static_cast<float>(max_norm), static_cast<float>(defaults::clip_norm_eps),
                                                   norm_out, norm_value);
    CUDA_CHECK(cudaGetLastError());
  }

  // The norm the host read, as `.item()` gives it: into pageable memory, after a synchronisation.
  float read_back(const float* device_norm, cudaStream_t stream) {
    CUDA_CHECK(cudaMemcpyAsync(&host_norm_, device_norm, sizeof host_norm_, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return host_norm_;
  }

  // The K-1 pattern: each tensor's norm is read by the host before the next is computed; the total
  // reaches *norm with the first scale kernel (or a copy when only the norm is asked for).
  template <class G>
  void clip_per_tensor(G* grad, double max_norm, float* norm, cudaStream_t stream) {
    double total_sq = 0;
    for (int64_t t = 0; t < set_.count(); ++t) {
      if (set_.sizes[t] == 0) continue;
      launch_norm(grad, first_chunk_[t], chunks_of(t), norms_.data() + t, stream);
      const double tensor_norm = read_back(norms_.data() + t, stream);
      total_sq += tensor_norm * tensor_norm;
    }
    const double total = std::sqrt(total_sq);
    if (max_norm <= 0) {
      host_norm_ = static_cast<float>(total);
      CUDA_CHECK(cudaMemcpyAsync(norm, &host_norm_, sizeof host_norm_, cudaMemcpyHostToDevice, stream));
      CUDA_CHECK(cudaStreamSynchronize(stream));  // host_norm_ is pageable and reused
      return;
    }
    const auto coef = static_cast<float>(clip_coefficient(total, max_norm));
    float* norm_out = norm;
    for (int64_t t = 0; t < set_.count(); ++t) {
      if (set_.sizes[t] == 0) continue;
      launch_scale(grad, first_chunk_[t], chunks_of(t), coef, nullptr, max_norm, norm_out, static_cast<float>(total),
                   stream);
      norm_out = nullptr;
    }
  }

  template <class G>
  void clip_multi_tensor(G* grad, double max_norm, float* norm, cudaStream_t stream) {
    const int all = first_chunk_.back();
    launch_norm(grad, 0, all, norm, stream);
    const double total = read_back(norm, stream);
    if (max_norm > 0)
      launch_scale(grad, 0, all, static_cast<float>(clip_coefficient(total, max_norm)), nullptr, max_norm, nullptr, 0.0f,
                   stream);
  }

  template <class G>
  void clip_fused(G* grad, double max_norm, float* norm, cudaStream_t stream) {
    const int all = first_chunk_.back();
    launch_norm(grad, 0, all, norm, stream);
    if (max_norm > 0) launch_scale(grad, 0, all, 1.0f, norm, max_norm, nullptr, 0.0f, stream);
  }

  ParamSet set_;
  int max_norm_blocks_;
  cuda::DeviceBuffer<DeviceChunk> chunks_;
  cuda::DeviceBuffer<float> partials_;
  cuda::DeviceBuffer<unsigned> ticket_;
  cuda::DeviceBuffer<float> norms_;  // per tensor (per_tensor)
  std::vector<int> first_chunk_;
  float host_norm_ = 0;  // pageable, as `.item()` reads into
};

// ---- the instance ------------------------------------------------------------------------------

template <class G>
class CudaGradNorm final : public Instance, public GradSource {
 public:
  CudaGradNorm(const ParamSet& set, Dtype dtype, Kind kind, const RunContext& ctx)
      : set_(set),
        dtype_(dtype),
        kind_(kind),
        stream_(cuda::as_stream(ctx.cuda_stream)),
        grad_(adamw::device::upload_initial_arena<G>(set, adamw::seed_grad, stream_)),
        plan_(make_cuda_clip_plan(set, stream_)),
        norm_(1) {
    CUDA_CHECK(cudaMemsetAsync(norm_.data(), 0, norm_.bytes(), stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void run() override {
    ++calls_;
    if constexpr (std::is_same_v<G, float>)
      cuda_clip(kind_, *plan_, grad_.data(), defaults::clip_max_norm, norm_.data(), stream_);
    else cuda_clip(kind_, *plan_, reinterpret_cast<uint16_t*>(grad_.data()), defaults::clip_max_norm, norm_.data(), stream_);
  }

  Verdict check() override {
    CUDA_CHECK(cudaGetLastError());
    return check_grads(set_, dtype_, calls_, grads());
  }

  // The norm from the device for every kind: the fused way's never left it.
  HostGrads grads() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    HostGrads out{adamw::device::download_gathered(set_, grad_.data(), stream_), 0.0};
    float device_norm = 0;
    CUDA_CHECK(cudaMemcpyAsync(&device_norm, norm_.data(), sizeof device_norm, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    out.norm = device_norm;
    return out;
  }
  int64_t calls() const override { return calls_; }

 private:
  ParamSet set_;
  Dtype dtype_;
  Kind kind_;
  cudaStream_t stream_;
  cuda::DeviceBuffer<G> grad_;
  std::unique_ptr<CudaClipPlan> plan_;
  cuda::DeviceBuffer<float> norm_;  // the total norm of the last call
  int64_t calls_ = 0;
};

}  // namespace

std::unique_ptr<CudaClipPlan> make_cuda_clip_plan(const ParamSet& set, CUstream_st* stream) {
  return std::make_unique<CudaClipPlanImpl>(set, stream);
}

// make_cuda_clip_plan makes every CudaClipPlan.
void cuda_clip(Kind kind, CudaClipPlan& plan, float* grad, double max_norm, float* norm, CUstream_st* stream) {
  static_cast<CudaClipPlanImpl&>(plan).clip(kind, grad, max_norm, norm, stream);
}
void cuda_clip(Kind kind, CudaClipPlan& plan, uint16_t* grad, double max_norm, float* norm, CUstream_st* stream) {
  static_cast<CudaClipPlanImpl&>(plan).clip(kind, reinterpret_cast<__nv_bfloat16*>(grad), max_norm, norm, stream);
}

std::unique_ptr<Instance> make_cuda(const Problem& problem, const RunContext& ctx, Kind kind) {
  const ParamSet set = adamw::make_param_set(problem.get_int("params"), problem.get_int("tensors"));
  const Dtype dtype = adamw::dtype_from_string(problem.get("dtype"));
  if (dtype == Dtype::bf16) return std::make_unique<CudaGradNorm<__nv_bfloat16>>(set, dtype, kind, ctx);
  return std::make_unique<CudaGradNorm<float>>(set, dtype, kind, ctx);
}

}  // namespace tb::gradnorm

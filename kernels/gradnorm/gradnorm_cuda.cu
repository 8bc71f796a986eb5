// Gradient norm and clipping on the GPU. per_tensor: per tensor a norm kernel, then a 4-byte
// device-to-host copy and a stream synchronisation (`p.grad.norm().item()`), then a scale kernel per
// tensor. multi_tensor: one multi-tensor norm kernel (a two-stage reduction whose last block sums
// the block partials), one read, one multi-tensor scale kernel. fused: the same two kernels, the scale
// kernel computing the clip factor from the norm in device memory, so the host never waits.
#include <cub/block/block_reduce.cuh>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

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

// Sum of squares of chunks [first, first + count) of the table, grid-stride over chunks, accumulated
// in fp32 per thread. Each block writes its partial; the last block to finish (a ticket counter that
// wraps back to 0 for the next launch) adds the partials in a fixed order and writes the norm.
template <class G>
__global__ void __launch_bounds__(block_size)
    norm_kernel(const G* const* grads, const DeviceChunk* chunks, int first, int count, float* partials,
                unsigned* ticket, float* norm) {
  using BlockReduce = cub::BlockReduce<float, block_size>;
  __shared__ typename BlockReduce::TempStorage temp;
  __shared__ bool last_block;
  float acc = 0;
  for (int c = blockIdx.x; c < count; c += gridDim.x) {
    const DeviceChunk ch = chunks[first + c];
    const G* __restrict__ g = grads[ch.tensor] + ch.begin;
    int done = 0;
    if (adamw::device::aligned_for_quads(g)) {
      const int quads = ch.len / 4;
      for (int k = threadIdx.x; k < quads; k += block_size) {
        float x[4];
        adamw::device::load4(g + 4 * k, x);
        acc += x[0] * x[0] + x[1] * x[1] + x[2] * x[2] + x[3] * x[3];
      }
      done = quads * 4;
    }
    for (int i = done + threadIdx.x; i < ch.len; i += block_size) {
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

// Scales chunks [first, first + count) by the clip factor: `coef` from the host, or, when
// `device_norm` is set, min(1, max_norm / (norm + eps)) computed here from the norm on the device.
template <class G>
__global__ void __launch_bounds__(block_size)
    scale_kernel(G* const* grads, const DeviceChunk* chunks, int first, float coef, const float* device_norm,
                 float max_norm, float norm_eps) {
  if (device_norm) coef = fminf(max_norm / (*device_norm + norm_eps), 1.0f);
  const DeviceChunk ch = chunks[first + blockIdx.x];
  G* __restrict__ g = grads[ch.tensor] + ch.begin;
  int done = 0;
  if (adamw::device::aligned_for_quads(g)) {
    const int quads = ch.len / 4;
    for (int k = threadIdx.x; k < quads; k += block_size) {
      float x[4];
      adamw::device::load4(g + 4 * k, x);
#pragma unroll
      for (int j = 0; j < 4; ++j) x[j] *= coef;
      adamw::device::store4(g + 4 * k, x);
    }
    done = quads * 4;
  }
  for (int i = done + threadIdx.x; i < ch.len; i += block_size) g[i] = from_float<G>(to_float(g[i]) * coef);
}

float clip_coefficient(double norm) {
  return static_cast<float>(std::min(defaults::clip_max_norm / (norm + defaults::clip_norm_eps), 1.0));
}

template <class G>
class CudaGradNorm final : public Instance, public GradSource {
 public:
  CudaGradNorm(const ParamSet& set, Dtype dtype, Kind kind, const RunContext& ctx)
      : set_(set), dtype_(dtype), kind_(kind), stream_(cuda::as_stream(ctx.cuda_stream)),
        max_norm_blocks_(adamw::device::sm_count(ctx.cuda_device) * norm_blocks_per_sm),
        grad_(adamw::device::upload_initial_arena<G>(set, adamw::seed_grad, stream_)),
        grads_(adamw::device::upload_tensor_pointers(set, grad_.data(), stream_)),
        chunks_(adamw::device::upload_chunks(set, chunk, stream_)), partials_(static_cast<std::size_t>(max_norm_blocks_)),
        ticket_(1), norms_(static_cast<std::size_t>(std::max<int64_t>(set.count(), 1))) {
    // Where each tensor's chunks start in the table (chunks come in tensor order).
    int first = 0;
    for (const int64_t n : set.sizes) {
      first_chunk_.push_back(first);
      first += static_cast<int>((n + chunk - 1) / chunk);
    }
    first_chunk_.push_back(first);
    CUDA_CHECK(cudaMemsetAsync(ticket_.data(), 0, ticket_.bytes(), stream_));
    CUDA_CHECK(cudaMemsetAsync(norms_.data(), 0, norms_.bytes(), stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void run() override {
    ++calls_;
    switch (kind_) {
      case Kind::per_tensor: return run_per_tensor();
      case Kind::multi_tensor: return run_multi_tensor();
      case Kind::fused: return run_fused();
    }
  }

  Verdict check() override {
    CUDA_CHECK(cudaGetLastError());
    return check_grads(set_, dtype_, calls_, grads());
  }

  HostGrads grads() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    HostGrads out{adamw::device::download_gathered(set_, grad_.data(), stream_), norm_};
    if (kind_ == Kind::fused) {  // the norm never left the device
      float device_norm = 0;
      CUDA_CHECK(cudaMemcpyAsync(&device_norm, norms_.data(), sizeof device_norm, cudaMemcpyDeviceToHost, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      out.norm = device_norm;
    }
    return out;
  }
  int64_t calls() const override { return calls_; }

 private:
  int chunks_of(int64_t t) const { return first_chunk_[t + 1] - first_chunk_[t]; }

  void launch_norm(int first, int count, float* norm) {
    const int grid = std::min(count, max_norm_blocks_);
    norm_kernel<<<grid, block_size, 0, stream_>>>(grads_.data(), chunks_.data(), first, count, partials_.data(),
                                                   ticket_.data(), norm);
    CUDA_CHECK(cudaGetLastError());
  }

  void launch_scale(int first, int count, float coef, const float* device_norm) {
    scale_kernel<<<count, block_size, 0, stream_>>>(grads_.data(), chunks_.data(), first, coef, device_norm,
                                                     static_cast<float>(defaults::clip_max_norm),
                                                     static_cast<float>(defaults::clip_norm_eps));
    CUDA_CHECK(cudaGetLastError());
  }

  // The K-1 pattern: each tensor's norm is read by the host before the next is computed.
  void run_per_tensor() {
    double total_sq = 0;
    for (int64_t t = 0; t < set_.count(); ++t) {
      if (set_.sizes[t] == 0) continue;
      launch_norm(first_chunk_[t], chunks_of(t), norms_.data() + t);
      CUDA_CHECK(cudaMemcpyAsync(&host_norm_, norms_.data() + t, sizeof host_norm_, cudaMemcpyDeviceToHost, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      total_sq += static_cast<double>(host_norm_) * host_norm_;
    }
    norm_ = std::sqrt(total_sq);
    const float coef = clip_coefficient(norm_);
    for (int64_t t = 0; t < set_.count(); ++t)
      if (set_.sizes[t] > 0) launch_scale(first_chunk_[t], chunks_of(t), coef, nullptr);
  }

  void run_multi_tensor() {
    const int all = first_chunk_.back();
    launch_norm(0, all, norms_.data());
    CUDA_CHECK(cudaMemcpyAsync(&host_norm_, norms_.data(), sizeof host_norm_, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    norm_ = host_norm_;
    launch_scale(0, all, clip_coefficient(norm_), nullptr);
  }

  void run_fused() {
    const int all = first_chunk_.back();
    launch_norm(0, all, norms_.data());
    launch_scale(0, all, 1.0f, norms_.data());
  }

  ParamSet set_;
  Dtype dtype_;
  Kind kind_;
  cudaStream_t stream_;
  int max_norm_blocks_;
  cuda::DeviceBuffer<G> grad_;
  cuda::DeviceBuffer<G*> grads_;
  cuda::DeviceBuffer<DeviceChunk> chunks_;
  cuda::DeviceBuffer<float> partials_;
  cuda::DeviceBuffer<unsigned> ticket_;
  cuda::DeviceBuffer<float> norms_;  // per tensor (per_tensor) or the total (norms_[0])
  std::vector<int> first_chunk_;
  float host_norm_ = 0;  // pageable, as `.item()` reads into
  double norm_ = 0;
  int64_t calls_ = 0;
};

}  // namespace

std::unique_ptr<Instance> make_cuda(const Problem& problem, const RunContext& ctx, Kind kind) {
  const ParamSet set = adamw::make_param_set(problem.get_int("params"), problem.get_int("tensors"));
  const Dtype dtype = adamw::dtype_from_string(problem.get("dtype"));
  if (dtype == Dtype::bf16) return std::make_unique<CudaGradNorm<__nv_bfloat16>>(set, dtype, kind, ctx);
  return std::make_unique<CudaGradNorm<float>>(set, dtype, kind, ctx);
}

}  // namespace tb::gradnorm

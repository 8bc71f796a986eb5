// The training step on the CUDA backend: the same Model and Trainer as the CPU, over CudaOps.
// Matrix products on cuBLAS (row-major tensors seen as their column-major transposes), the rest as
// grid-stride kernels on the benchmark's stream. Attention, gradient clipping and AdamW are the
// stages' functions (attention, gradnorm, adamw): the step runs the kernels those stages measure,
// with no copy of its own; the clip factor never leaves the device. With the cuda_graphs switch, a
// micro-step (forward and backward) is captured once and replayed.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "adamw/adamw.h"
#include "allreduce/allreduce.h"
#include "attention/attention.h"
#include "cg/rows.h"
#include "gradnorm/gradnorm.h"
#include "layers/layers_cuda.cuh"
#include "runtime/comm.h"
#include "runtime/cuda_bf16.cuh"
#include "runtime/cuda_fill.cuh"
#include "runtime/cuda_lt.h"
#include "runtime/cuda_raii.h"
#include "runtime/cuda_reduce.cuh"
#include "runtime/defaults.h"
#include "step/cpu_ops.h"
#include "step/step.h"
#include "step/trainer.h"
#include "runtime/gelu.h"

namespace tb::step {

namespace {

using cuda::Graph;
using cuda::GraphExec;

constexpr int threads = 256;

#define TB_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); i += int64_t{gridDim.x} * blockDim.x)

// A kernel's output or input as fp32 or as bf16 (the bf16 copy a matrix product reads).
using bf16_bits = attention::bf16_bits;
using cuda::load;
using cuda::store;

__global__ void copy_kernel(float* d, const float* s, int64_t n) { TB_GRID_STRIDE(i, n) d[i] = s[i]; }
__global__ void add_kernel(float* o, const float* a, const float* b, int64_t n) { TB_GRID_STRIDE(i, n) o[i] = a[i] + b[i]; }

__global__ void encoder_forward_kernel(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                                       int64_t Tn, int64_t C) {
  TB_GRID_STRIDE(e, B * Tn * C) {
    const int64_t c = e % C, bt = e / C, t = bt % Tn;
    out[e] = wte[static_cast<int64_t>(tokens[bt]) * C + c] + wpe[t * C + c];
  }
}

__global__ void encoder_backward_kernel(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B,
                                        int64_t Tn, int64_t C) {
  TB_GRID_STRIDE(e, B * Tn * C) {
    const int64_t c = e % C, bt = e / C, t = bt % Tn;
    atomicAdd(&dwte[static_cast<int64_t>(tokens[bt]) * C + c], dout[e]);
    atomicAdd(&dwpe[t * C + c], dout[e]);
  }
}

// A warp per row for dinp. dw and db: each warp sums its rows into its own slice of shared memory,
// where a lane owns its channels (no atomics: a shared atomic per element per row serialised the
// block's warps on the same addresses), the block adds its slices, then one global atomic per
// channel per block.
__global__ void layernorm_backward_kernel(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                                          const float* w, const float* mean, const float* rstd, int64_t N, int64_t C) {
  extern __shared__ float acc[];  // per warp: dw [C], db [C]
  const int warps_per_block = blockDim.x / 32, lane = threadIdx.x % 32;
  for (int64_t c = threadIdx.x; c < 2 * C * warps_per_block; c += blockDim.x) acc[c] = 0.0f;
  __syncthreads();
  float* warp_dw = acc + 2 * C * (threadIdx.x / 32);
  float* warp_db = warp_dw + C;
  for (int64_t row = blockIdx.x * int64_t{warps_per_block} + threadIdx.x / 32; row < N;
       row += int64_t{gridDim.x} * warps_per_block) {
    const float* x = inp + row * C;
    const float* d = dout + row * C;
    float dm = 0, dnm = 0;
    for (int64_t c = lane; c < C; c += 32) {
      const float norm = (x[c] - mean[row]) * rstd[row];
      dm += w[c] * d[c];
      dnm += w[c] * d[c] * norm;
    }
    dm = cuda::warp_sum(dm) / static_cast<float>(C);
    dnm = cuda::warp_sum(dnm) / static_cast<float>(C);
    for (int64_t c = lane; c < C; c += 32) {
      const float norm = (x[c] - mean[row]) * rstd[row];
      dinp[row * C + c] += (w[c] * d[c] - dm - norm * dnm) * rstd[row];
      warp_dw[c] += norm * d[c];
      warp_db[c] += d[c];
    }
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float sw = 0, sb = 0;
    for (int k = 0; k < warps_per_block; ++k) {
      sw += acc[2 * C * k + c];
      sb += acc[2 * C * k + C + c];
    }
    atomicAdd(&dw[c], sw);
    atomicAdd(&db[c], sb);
  }
}

__global__ void bias_rows_kernel(float* out, const float* bias, int64_t N, int64_t OC) {
  TB_GRID_STRIDE(e, N * OC) out[e] = bias[e % OC];
}

constexpr int bias_block_rows = 8;

// Column sums of dout [N, OC] added to dbias: 32 columns per block, rows split over the block's y
// and summed in shared memory first, so a column takes one atomic per block, not one per row group.
template <class In>
__global__ void bias_backward_kernel(float* dbias, const In* dout, int64_t N, int64_t OC) {
  __shared__ float partial[bias_block_rows][32];
  const int64_t col = blockIdx.x * 32 + threadIdx.x;
  float s = 0;
  if (col < OC)
    for (int64_t n = blockIdx.y * int64_t{blockDim.y} + threadIdx.y; n < N; n += int64_t{gridDim.y} * blockDim.y)
      s += load(dout + n * OC + col);
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || col >= OC) return;
  for (int r = 1; r < bias_block_rows; ++r) s += partial[r][threadIdx.x];
  atomicAdd(&dbias[col], s);
}

constexpr float gelu_scale = static_cast<float>(gelu::scale), gelu_cubic = static_cast<float>(gelu::cubic);

template <class Out>
__global__ void gelu_backward_kernel(Out* dinp, const float* inp, const float* dout, int64_t n) {
  TB_GRID_STRIDE(i, n) {
    const float x = inp[i], u = gelu_scale * (x + gelu_cubic * x * x * x), th = tanhf(u);
    const float local = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * gelu_scale * (1.0f + 3.0f * gelu_cubic * x * x);
    store(dinp + i, local * dout[i]);
  }
}

__global__ void softmax_crossentropy_kernel(float* probs, float* losses, const float* logits, const int32_t* targets,
                                            int64_t V) {
  const int64_t row = blockIdx.x;
  const float* l = logits + row * V;
  float* p = probs + row * V;
  float mx = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, l[v]);
  mx = cuda::block_reduce(mx, true);
  float sum = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) sum += __expf(l[v] - mx);
  sum = cuda::block_reduce(sum, false);
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) p[v] = __expf(l[v] - mx) / sum;
  if (threadIdx.x == 0) losses[row] = logf(sum) + mx - l[targets[row]];
}

__global__ void crossentropy_backward_kernel(float* dlogits, const float* probs, const int32_t* targets, float dloss,
                                             int64_t N, int64_t V) {
  TB_GRID_STRIDE(e, N * V) dlogits[e] = (probs[e] - (e % V == targets[e / V] ? 1.0f : 0.0f)) * dloss;
}

// fp32 -> bf16 (round to nearest even); `quads`: four elements a thread, for a 16-byte aligned source
// (a weight inside the parameter arena starts wherever the tensors before it end), else one.
__global__ void to_bf16_kernel(attention::bf16_bits* __restrict__ dst, const float* __restrict__ src, int64_t n,
                               bool quads) {
  if (!quads) {
    TB_GRID_STRIDE(i, n) store(dst + i, src[i]);
    return;
  }
  const int64_t whole = n / 4;
  const float4* src4 = reinterpret_cast<const float4*>(src);
  TB_GRID_STRIDE(i, whole) {
    const float4 x = src4[i];
    const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
    uint2 packed;
    packed.x = *reinterpret_cast<const uint32_t*>(&lo);
    packed.y = *reinterpret_cast<const uint32_t*>(&hi);
    reinterpret_cast<uint2*>(dst)[i] = packed;
  }
  if (blockIdx.x == 0 && threadIdx.x < n - whole * 4) store(dst + whole * 4 + threadIdx.x, src[whole * 4 + threadIdx.x]);
}

__global__ void sum_losses_kernel(float* acc, const float* losses, int64_t n, float scale) {
  float s = 0;
  TB_GRID_STRIDE(i, n) s += losses[i];
  s = cuda::block_reduce(s, false);
  if (threadIdx.x == 0) atomicAdd(acc, s * scale);
}

}  // namespace

// The CUDA backend of Model and Trainer (float). Counts device bytes for the peak-memory figure.
class CudaOps {
 public:
  using value_type = float;
  using Mark = int;  // an index into the event pool
  static constexpr bool supports_graphs = true;

  template <class U>
  using Buffer = TrackedBuffer<cuda::DeviceBuffer<U>>;

  // Host staging for batches: pinned (async copies) or pageable (what a loader without pin_memory
  // hands over). Host memory: not counted in the device's peak. `copied` is recorded after the
  // last copy queued from it: the host may refill it once that event has completed.
  template <class U>
  class Staging {
   public:
    Staging() = default;
    Staging(int64_t n, bool pinned) {
      if (pinned) pinned_ = cuda::PinnedBuffer<U>(static_cast<std::size_t>(n));
      else pageable_ = HostBuffer<U>(static_cast<std::size_t>(n));
    }
    U* data() { return pinned_.data() ? pinned_.data() : pageable_.data(); }
    cudaEvent_t copied() const { return copied_; }

   private:
    cuda::PinnedBuffer<U> pinned_;
    HostBuffer<U> pageable_;
    cuda::Event copied_;
  };

  CudaOps(cudaStream_t stream, int device)
      : stream_(stream), device_(device), meter_(std::make_shared<MemoryMeter>()), rows_(stream, device) {
    CUBLAS_CHECK(cublasSetStream(handle_, stream));
    // A fixed cuBLAS workspace: no allocation inside a captured graph.
    CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_.data(), workspace_.bytes()));
    events_.resize(64);
    read_slot_ = cuda::PinnedBuffer<float>(4);
    // Once here, not per launch (the per-warp slices of a wide layernorm need more than the default).
    CUDA_CHECK(cudaDeviceGetAttribute(&max_shared_bytes_, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    CUDA_CHECK(
        cudaFuncSetAttribute(layernorm_backward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_shared_bytes_));
  }
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  template <class U>
  Buffer<U> alloc(int64_t n) {
    return Buffer<U>(n, meter_);
  }
  template <class U>
  Staging<U> alloc_host(int64_t n, bool pinned) {
    return Staging<U>(n, pinned);
  }
  const MemoryMeter& memory() const { return *meter_; }
  cudaStream_t stream() const { return stream_; }

  Mark mark() {
    if (next_event_ == static_cast<int>(events_.size())) events_.resize(events_.size() * 2);
    CUDA_CHECK(cudaEventRecord(events_[next_event_], stream_));
    ++marks_taken_;
    return next_event_++;
  }
  int64_t marks_taken() const { return marks_taken_; }
  int64_t event_pool() const { return static_cast<int64_t>(events_.size()); }
  double seconds_between(Mark a, Mark b) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, events_[a], events_[b]));
    return ms * 1e-3;
  }
  double seconds_since(Mark m) {
    const Mark now = mark();
    CUDA_CHECK(cudaEventSynchronize(events_[now]));
    return seconds_between(m, now);
  }
  void synchronize() {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    next_event_ = 0;  // every recorded event has completed: the pool can be reused
  }

  void upload(float* dst, const float* host, int64_t n) {
    CUDA_CHECK(cudaMemcpyAsync(dst, host, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void download(float* host, const float* src, int64_t n) {
    CUDA_CHECK(cudaMemcpyAsync(host, src, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  // Pinned: queued on the stream; pageable: the copy returns when the data has left the host buffer.
  void upload_tokens(int32_t* dst, const int32_t* src, int64_t n, bool async) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    if (!async) CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  // Blocks until the copy last queued from `staging` has read it.
  template <class U>
  void wait_until_free(Staging<U>& staging) {
    CUDA_CHECK(cudaEventSynchronize(staging.copied()));
  }
  void upload_staged(int32_t* dst, Staging<int32_t>& src, int64_t n, bool async) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaEventRecord(src.copied(), stream_));
    if (!async) CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  // The collate stage's resident gather (what its cuda/resident layout=token_rows measures).
  void gather_tokens(int32_t* batch, const int32_t* rows, const int32_t* picked, int64_t B, int64_t Tn) {
    collate::cuda_gather_token_rows(rows, Tn, picked, B, batch, stream_);
  }

  void zero(float* p, int64_t n) { CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), stream_)); }
  void copy(float* d, const float* s, int64_t n) { launch(copy_kernel, n, d, s, n); }
  void add(float* o, const float* a, const float* b, int64_t n) { launch(add_kernel, n, o, a, b, n); }

  void encoder_forward(float* out, const int32_t* tok, const float* wte, const float* wpe, int64_t B, int64_t Tn,
                       int64_t C) {
    launch(encoder_forward_kernel, B * Tn * C, out, tok, wte, wpe, B, Tn, C);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tok, int64_t B, int64_t Tn, int64_t C) {
    launch(encoder_backward_kernel, B * Tn * C, dwte, dwpe, dout, tok, B, Tn, C);
  }
  // bf16_only: the output feeds only bf16 matrix products; only their bf16 copy of it is written.
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int64_t N,
                         int64_t C, bool bf16_only) {
    if (bf16_only)
      layers::cuda_layernorm_forward(written_bf16(kept_bf16_, out, N * C), mean, rstd, inp, w, b, N, C, stream_);
    else layers::cuda_layernorm_forward(out, mean, rstd, inp, w, b, N, C, stream_);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                          const float* mean, const float* rstd, int64_t N, int64_t C) {
    // As many warps (each with its own [2C] slice) as fit the default 48 KiB, up to 8; a wider
    // layernorm takes one warp per block and the opt-in limit.
    const int64_t slice = 2 * C * static_cast<int64_t>(sizeof(float));
    const int warps = static_cast<int>(std::clamp<int64_t>(default_shared_bytes / slice, 1, threads / 32));
    const int64_t smem = warps * slice;
    if (smem > max_shared_bytes_)
      throw CallError(__FILE__, __LINE__, "layernorm_backward",
                      "d_model " + std::to_string(C) + " needs " + std::to_string(smem) + " bytes of shared memory, " +
                          std::to_string(max_shared_bytes_) + " available");
    const int block = 32 * warps;
    layernorm_backward_kernel<<<cuda::grid_for(N * 32, block, device_), block, static_cast<std::size_t>(smem), stream_>>>(
        dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    check_launch();
  }
  // out[N, OC] = inp[N, C] W^T + bias; column-major: out^T (OC x N) = W (op T of the stored C x OC) inp^T.
  // With a bias, the GEMM adds onto the broadcast bias (beta 1); without (the LM head, N x V), it
  // overwrites (beta 0): no fill and no read of the output.
  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int64_t N, int64_t C, int64_t OC,
                      bool bf16) {
    if (bf16) {  // the bias added in the product's epilogue, which reads it 16-byte aligned
      const bool fused_bias = bias && alignment_of(bias) >= 16;
      if (bias && !fused_bias) launch(bias_rows_kernel, N * OC, out, bias, N, OC);
      const Bf16Operand w16 = keep_bf16(w, C * OC), in16 = keep_bf16(inp, N * C);
      gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, w16, C, in16, C, bias && !fused_bias ? 1.0f : 0.0f, out, OC,
                fused_bias ? bias : nullptr);
      return;
    }
    if (bias) launch(bias_rows_kernel, N * OC, out, bias, N, OC);
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, 1.0f, w, C, inp, C, bias ? 1.0f : 0.0f, out, OC);
  }
  // dinp^T (C x N) += W^T dout^T; dW^T (C x OC) += inp^T dout; dbias += column sums of dout.
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w, int64_t N,
                       int64_t C, int64_t OC, bool bf16) {
    if (bf16) {  // dout cast once for both products and the bias's sums (autocast's grad_output is bf16 too)
      const Bf16Operand d16 = gradient_bf16(dout, N * OC);
      const Bf16Operand w16 = kept_bf16(w, C * OC), in16 = kept_bf16(inp, N * C);
      gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, w16, C, d16, OC, 0.0f, dinp, C);  // dinp overwritten
      gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, in16, C, d16, OC, 1.0f, dw, C);
      if (dbias) bias_backward(dbias, d16, N, OC);
      return;
    }
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, 1.0f, w, C, dout, OC, 0.0f, dinp, C);  // dinp overwritten
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dw, C);
    if (dbias) bias_backward(dbias, dout, N, OC);
  }
  // Causal attention through the attention stage's kernels, straight on the packed rows: Q, K, V
  // are columns [0, C), [C, 2C), [2C, 3C) of qkv's rows of 3C, head h at column h * hs of each; out
  // and dout are rows of C. saved: P [B, NH, T, T] (naive) or each row's log-sum-exp [B, NH, T] (fused).
  // bf16: fused runs the tensor-core kernels on bf16 copies of the operands (autocast's SDPA), where
  // they take the head size (32, 64, 128; else the fp32 kernel); naive runs its products in bf16.
  void attention_forward(float* out, float* saved, const float* qkv, int64_t B, int64_t Tn, int64_t C, int64_t NH,
                         bool fused, bool bf16) {
    const attention::Shape s = attention_shape(B, Tn, C, NH);
    const attention::Operands<float> x = attention_operands(s, qkv, out, C);
    if (fused && bf16 && attention::cuda_bf16_reason(s).empty()) {
      Bf16Attention& ws = bf16_attention(s);
      pack_qkv(s, qkv, ws);
      attention::cuda_bf16_forward(s, true, ws.q.data(), ws.k.data(), ws.v.data(), ws.o.data(), saved, stream_);
      attention::cuda_unpack_bf16(s, ws.o.data(), out, x.out, stream_);
    } else if (fused) {
      attention::cuda_fused_forward(s, x, saved, stream_);
    } else {
      attention::cuda_naive_forward(s, x, saved, handle_, stream_, bf16);
    }
  }
  // dqkv overwritten. scratch: dP [B, NH, T, T] (naive) or delta [B, NH, T] (fused, fp32).
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* out,
                          const float* saved, int64_t B, int64_t Tn, int64_t C, int64_t NH, bool fused, bool bf16) {
    const attention::Shape s = attention_shape(B, Tn, C, NH);
    // O is only read in backward; Operands carries it writable for the forward.
    const attention::Operands<float> x = attention_operands(s, qkv, const_cast<float*>(out), C);
    const attention::Gradients<float> g{dqkv, dqkv + C, dqkv + 2 * C, dout};
    if (fused && bf16 && attention::cuda_bf16_reason(s).empty()) {
      // The forward's bf16 operands again: Q, K, V round the same way, and O came from bf16 exactly.
      Bf16Attention& ws = bf16_attention(s);
      pack_qkv(s, qkv, ws);
      attention::cuda_pack_bf16(s, out, x.out, ws.o.data(), stream_);
      attention::cuda_pack_bf16(s, dout, x.out, ws.dout.data(), stream_);
      const attention::Bf16Operands operands{ws.q.data(), ws.k.data(), ws.v.data(), ws.o.data(), ws.dout.data()};
      attention::cuda_bf16_backward(s, true, operands, saved, g, x.in, ws.scratch.data(), stream_);
    } else if (fused) {
      attention::cuda_fused_backward(s, x, saved, g, scratch, stream_);
    } else {
      attention::cuda_naive_backward(s, x, saved, g, scratch, handle_, stream_, bf16);
    }
  }
  // bf16_only: as layernorm_forward's (GELU's output and its input's gradient feed only products).
  void gelu_forward(float* out, const float* inp, int64_t n, bool bf16_only) {
    if (bf16_only) layers::cuda_gelu_forward(written_bf16(kept_bf16_, out, n), inp, n, stream_, device_);
    else layers::cuda_gelu_forward(out, inp, n, stream_, device_);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, bool bf16_only) {
    if (bf16_only) launch(gelu_backward_kernel<bf16_bits>, n, written_bf16(gradients_bf16_, dinp, n), inp, dout, n);
    else launch(gelu_backward_kernel<float>, n, dinp, inp, dout, n);
  }
  void softmax_crossentropy(float* probs, float* losses, const float* logits, const int32_t* targets, int64_t N, int64_t V) {
    softmax_crossentropy_kernel<<<static_cast<unsigned>(N), threads, 0, stream_>>>(probs, losses, logits, targets, V);
    check_launch();
  }
  void crossentropy_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss, int64_t N, int64_t V) {
    launch(crossentropy_backward_kernel, N * V, dlogits, probs, targets, dloss, N, V);
  }
  // The propagator's solve runs on the cg stage's primitives (cg/rows.h), on this stream.
  cg::CudaRows& rows() { return rows_; }

  // Data parallelism: NCCL's all-reduce on this stream, `bucket` elements per call from the end.
  void allreduce_sum(float* data, int64_t n, int64_t bucket) {
    comm::for_each_bucket_from_end(n, bucket, [&](int64_t begin, int64_t length) {
      allreduce::cuda_allreduce_sum(data + begin, length, stream_, device_);
    });
  }

  // clip_grad_norm_ the gradnorm stage's fused way for every optimizer kind: PyTorch's
  // clip_grad_norm_ on CUDA never reads the norm back (torch.clamp of a device tensor, then
  // _foreach_mul_), whichever optimizer follows; the per-tensor `.item()` pattern is the stage's
  // anti-pattern, not what a training loop runs. The norm stays on the device, read with the loss.
  void clip_gradients(float* norm, float* grads, const adamw::ParamSet& set, OptimizerKind /*kind*/, double grad_clip) {
    if (!clip_plan_ || !same_layout(clip_plan_->set(), set)) {  // the first (eager) step: before any capture
      if (clip_plan_) meter_->add(-clip_plan_->device_bytes());
      clip_plan_ = gradnorm::make_cuda_clip_plan(set, stream_);
      meter_->add(clip_plan_->device_bytes());
    }
    gradnorm::cuda_clip(gradnorm::Kind::fused, *clip_plan_, grads, grad_clip, norm, stream_);
  }
  // AdamW step `step` the adamw stage's `kind` way; its temporaries (the loop paths') are counted.
  void adamw(OptimizerKind kind, const adamw::ParamSet& set, float* params, const float* grads, float* m, float* v,
             const adamw::Hyper& h, int64_t step) {
    const adamw::Kind stage_kind = kind == OptimizerKind::per_tensor ? adamw::Kind::per_tensor
                                   : kind == OptimizerKind::foreach  ? adamw::Kind::foreach
                                                                     : adamw::Kind::fused;
    if (!adamw_plan_ || adamw_plan_->kind() != stage_kind || !same_layout(adamw_plan_->set(), set)) {
      if (adamw_plan_) meter_->add(-adamw_plan_->device_bytes());
      adamw_plan_ = adamw::make_cuda_plan(set, stage_kind, stream_);
      meter_->add(adamw_plan_->device_bytes());
    }
    adamw::cuda_step(*adamw_plan_, adamw::State<float>{params, grads, m, v}, adamw::step_scalars(h, step), stream_);
  }
  void sum_losses(float* acc, const float* losses, int64_t n, float scale) {
    sum_losses_kernel<<<grid(n), threads, 0, stream_>>>(acc, losses, n, scale);
    check_launch();
  }
  void read_scalars(float* host, const float* src, int64_t n) {
    CUDA_CHECK(cudaMemcpyAsync(host, src, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  // Copies into pinned memory behind an event and returns the previous copy's values, which have
  // long arrived: the host never waits for the step in flight.
  bool read_scalars_async(float* host, const float* src, int64_t n) {
    const bool had = async_pending_;
    if (had) {
      CUDA_CHECK(cudaEventSynchronize(async_done_));
      std::copy(read_slot_.data(), read_slot_.data() + n, host);
    }
    CUDA_CHECK(cudaMemcpyAsync(read_slot_.data(), src, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaEventRecord(async_done_, stream_));
    async_pending_ = true;
    return had;
  }

  // CUDA graphs: capture the work `enqueue` puts on the stream, replay it with one launch.
  template <class F>
  void capture(F&& enqueue) {
    cuda::CaptureScope scope(stream_);
    enqueue();
    const Graph graph = scope.end();
    exec_ = GraphExec(graph);
  }
  void replay() { CUDA_CHECK(cudaGraphLaunch(exec_.get(), stream_)); }
  bool captured() const { return exec_.get() != nullptr; }
  bool capturing() const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream_, &status));
    return status != cudaStreamCaptureStatusNone;
  }

 private:
  static constexpr std::size_t workspace_bytes = 32u << 20;
  static constexpr int64_t default_shared_bytes = 48 * 1024;

  int grid(int64_t n) const { return cuda::grid_for(n, threads, device_); }
  void check_launch() { CUDA_CHECK(cudaGetLastError()); }
  template <class K, class... Args>
  void launch(K kernel, int64_t n, Args... args) {
    if (n == 0) return;
    kernel<<<grid(n), threads, 0, stream_>>>(args...);
    check_launch();
  }
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A,
            int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    CUBLAS_CHECK(cublasGemmEx(handle_, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha, A,
                              CUDA_R_32F, static_cast<int>(lda), B, CUDA_R_32F, static_cast<int>(ldb), &beta, C, CUDA_R_32F,
                              static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  // bf16_matmuls: the products take bf16 operands, accumulate in fp32 and write fp32, as autocast's
  // linear does after casting its input and weight. Handing cuBLAS fp32 operands with
  // CUBLAS_COMPUTE_32F_FAST_16BF instead rounds the same way but picks kernels that read fp32 (tf32
  // and sm80 tiles on an H100, about half of a step's time at t4_transformer's sizes): one cast pass
  // per operand costs less. As autograd keeps autocast's bf16 copies for backward, the forward's
  // copies of a product's input and weight are kept, per source buffer, for that product's backward:
  // a layer's backward follows its forward (or its recomputation, with checkpointing) with no write
  // to either in between. Copies are allocated at the first, eager step, so a captured graph never
  // allocates.
  using Bf16Operand = const bf16_bits*;
  using Bf16Copies = std::map<const float*, Buffer<bf16_bits>>;
  bf16_bits* sized(Buffer<bf16_bits>& copy, int64_t n) {
    if (copy.size() < n) {  // the old buffer is freed: cudaFree waits for its readers
      TB_REQUIRE(!capturing(), "a bf16 operand grew during graph capture (the eager step sizes them)");
      copy = alloc<bf16_bits>(n);
    }
    return copy.data();
  }
  bf16_bits* cast_bf16(Buffer<bf16_bits>& copy, const float* src, int64_t n) {
    bf16_bits* dst = sized(copy, n);
    const bool quads = alignment_of(src) >= 16;  // dst: a fresh allocation
    to_bf16_kernel<<<grid(quads ? n / 4 + 1 : n), threads, 0, stream_>>>(dst, src, n, quads);
    check_launch();
    return dst;
  }
  // Where a kernel writes `of`'s bf16 copy itself (bf16_only): the next product reads it uncast.
  bf16_bits* written_bf16(Bf16Copies& copies, const float* of, int64_t n) {
    fresh_bf16_.insert(of);
    return sized(copies[of], n);
  }
  Bf16Operand keep_bf16(const float* src, int64_t n) {
    Buffer<bf16_bits>& copy = kept_bf16_[src];
    if (fresh_bf16_.erase(src) > 0) return copy.data();
    return cast_bf16(copy, src, n);
  }
  Bf16Operand kept_bf16(const float* src, int64_t n) {
    const auto it = kept_bf16_.find(src);
    TB_REQUIRE(it != kept_bf16_.end() && it->second.size() >= n,
               "a bf16 product's backward before its forward (no kept copy of its operand)");
    return it->second.data();
  }
  // An output gradient: the copy its producer wrote (gelu_backward's), else a cast into one scratch.
  Bf16Operand gradient_bf16(const float* src, int64_t n) {
    if (fresh_bf16_.erase(src) > 0) return gradients_bf16_[src].data();
    return cast_bf16(gradient_scratch_bf16_, src, n);
  }
  template <class In>
  void bias_backward(float* dbias, const In* dout, int64_t N, int64_t OC) {
    const dim3 block(32, bias_block_rows),
        blocks(static_cast<unsigned>((OC + 31) / 32), static_cast<unsigned>(std::min<int64_t>((N + 63) / 64, 1024)));
    bias_backward_kernel<<<blocks, block, 0, stream_>>>(dbias, dout, N, OC);
    check_launch();
  }

  // C = A B (+ beta C) (+ bias per row of C, in the epilogue) on cuBLASLt, bf16 A and B, fp32 C. Each
  // shape's descriptors and the heuristic's first algorithm are made once and kept (an eager step of a
  // small model makes dozens of products, and four descriptors a product cost host time on every one);
  // only the bias pointer changes between calls. A captured graph replays the algorithm.
  void gemm_bf16(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, Bf16Operand A, int64_t lda,
                 Bf16Operand B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias = nullptr) {
    // cuBLASLt assumes 256-byte aligned matrices unless told: a gradient inside the parameter arena
    // may start anywhere a float can.
    const uint32_t align_a = alignment_of(A), align_b = alignment_of(B), align_c = alignment_of(C);
    const GemmShape shape{ta, tb, m, n, k, lda, ldb, ldc, bias != nullptr, beta != 0.0f, align_a, align_b, align_c};
    auto found = lt_plans_.find(shape);
    if (found == lt_plans_.end()) found = lt_plans_.emplace(shape, plan_gemm_bf16(shape)).first;
    LtPlan& plan = found->second;
    if (bias)
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(lt_, plan.desc.get(), &alpha, A, plan.a.get(), B, plan.b.get(), &beta, C, plan.c.get(), C,
                                plan.c.get(), &plan.algo, workspace_.data(), workspace_.bytes(), stream_));
  }
  // One product shape's cuBLASLt descriptors and the algorithm the heuristic puts first for them.
  struct LtPlan {
    cuda::MatmulDesc desc;
    cuda::MatrixLayout a, b, c;
    cublasLtMatmulAlgo_t algo{};
  };
  struct GemmShape;
  LtPlan plan_gemm_bf16(const GemmShape& s) {
    LtPlan plan;
    cublasLtMatmulDesc_t raw_desc = nullptr;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    plan.desc = cuda::MatmulDesc(raw_desc);
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, &s.ta, sizeof s.ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, &s.tb, sizeof s.tb));
    if (s.bias) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    }
    const auto layout = [](cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
      cublasLtMatrixLayout_t l = nullptr;
      CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
      return cuda::MatrixLayout(l);
    };
    plan.a = s.ta == CUBLAS_OP_N ? layout(CUDA_R_16BF, s.m, s.k, s.lda) : layout(CUDA_R_16BF, s.k, s.m, s.lda);
    plan.b = s.tb == CUBLAS_OP_N ? layout(CUDA_R_16BF, s.k, s.n, s.ldb) : layout(CUDA_R_16BF, s.n, s.k, s.ldb);
    plan.c = layout(CUDA_R_32F, s.m, s.n, s.ldc);
    cublasLtMatmulPreference_t raw_pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&raw_pref));
    const cuda::MatmulPreference pref(raw_pref);
    const uint64_t bytes = workspace_.bytes();
    CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof bytes));
    for (const auto& [attribute, align] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, s.align_a},
                                           std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, s.align_b},
                                           std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, s.align_c},
                                           std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, s.align_c}})
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(raw_pref, attribute, &align, sizeof align));
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt_, raw_desc, plan.a.get(), plan.b.get(), plan.c.get(), plan.c.get(),
                                                raw_pref, 1, &result, &returned));
    TB_REQUIRE(returned > 0, "cuBLASLt has no bf16 algorithm for a " + std::to_string(s.m) + " x " + std::to_string(s.n) +
                                 " x " + std::to_string(s.k) + " product");
    plan.algo = result.algo;
    return plan;
  }
  struct GemmShape {
    cublasOperation_t ta, tb;
    int64_t m, n, k, lda, ldb, ldc;
    bool bias, accumulate;
    uint32_t align_a, align_b, align_c;
    bool operator<(const GemmShape& o) const {
      return std::tie(ta, tb, m, n, k, lda, ldb, ldc, bias, accumulate, align_a, align_b, align_c) <
             std::tie(o.ta, o.tb, o.m, o.n, o.k, o.lda, o.ldb, o.ldc, o.bias, o.accumulate, o.align_a, o.align_b, o.align_c);
    }
  };
  // The largest power of two, up to 256, that divides p's address.
  static uint32_t alignment_of(const void* p) {
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    uint32_t align = 256;
    while (align > 1 && address % align != 0) align /= 2;
    return align;
  }
  static attention::Shape attention_shape(int64_t B, int64_t Tn, int64_t C, int64_t NH) {
    return attention::Shape{B, NH, Tn, C / NH};
  }
  static attention::Operands<float> attention_operands(const attention::Shape& s, const float* qkv, float* out, int64_t C) {
    return attention::Operands<float>{qkv, qkv + C, qkv + 2 * C, out, attention::bshd(s, 3 * C), attention::bshd(s, C)};
  }
  // The bf16 attention's operands [B, NH, T, hs] and the backward's scratch, made at the first
  // (eager) step for the one model a backend serves, metered like every buffer.
  struct Bf16Attention {
    int64_t elements = 0;
    Buffer<attention::bf16_bits> q, k, v, o, dout;
    Buffer<float> scratch;
  };
  Bf16Attention& bf16_attention(const attention::Shape& s) {
    if (!bf16_attention_) {
      bf16_attention_ = std::make_unique<Bf16Attention>();
      bf16_attention_->elements = s.elements();
      for (auto* b :
           {&bf16_attention_->q, &bf16_attention_->k, &bf16_attention_->v, &bf16_attention_->o, &bf16_attention_->dout})
        *b = alloc<attention::bf16_bits>(s.elements());
      bf16_attention_->scratch = alloc<float>(attention::cuda_bf16_backward_scratch(s));
    }
    TB_REQUIRE(bf16_attention_->elements == s.elements(), "one bf16 attention workspace serves one model shape");
    return *bf16_attention_;
  }
  void pack_qkv(const attention::Shape& s, const float* qkv, Bf16Attention& ws) {
    const int64_t C = s.d_model();
    const attention::Strides rows = attention::bshd(s, 3 * C);
    attention::cuda_pack_bf16(s, qkv, rows, ws.q.data(), stream_);
    attention::cuda_pack_bf16(s, qkv + C, rows, ws.k.data(), stream_);
    attention::cuda_pack_bf16(s, qkv + 2 * C, rows, ws.v.data(), stream_);
  }
  // Whether a plan made for `a` serves `b`: the same tensors at the same offsets.
  static bool same_layout(const adamw::ParamSet& a, const adamw::ParamSet& b) {
    return a.sizes == b.sizes && a.offsets == b.offsets && a.arena == b.arena;
  }

  cudaStream_t stream_;
  int device_;
  std::shared_ptr<MemoryMeter> meter_;
  cuda::CublasHandle handle_;
  cuda::DeviceBuffer<unsigned char> workspace_{workspace_bytes};
  int max_shared_bytes_ = 0;
  std::vector<cuda::Event> events_;
  int next_event_ = 0;
  int64_t marks_taken_ = 0;
  cuda::PinnedBuffer<float> read_slot_;
  cuda::Event async_done_;
  bool async_pending_ = false;
  // The optimizer stages' plans, made at the first (eager) step for the model's parameter set.
  std::unique_ptr<gradnorm::CudaClipPlan> clip_plan_;
  std::unique_ptr<adamw::CudaPlan> adamw_plan_;
  cg::CudaRows rows_;
  std::unique_ptr<Bf16Attention> bf16_attention_;
  cuda::LtHandle lt_;
  Bf16Copies kept_bf16_;       // products' inputs and weights, kept for their backward (see keep_bf16)
  Bf16Copies gradients_bf16_;  // output gradients written in bf16 by their producer
  Buffer<bf16_bits> gradient_scratch_bf16_;
  std::set<const float*> fresh_bf16_;  // copies written by their producer, not yet read
  std::map<GemmShape, LtPlan> lt_plans_;
  GraphExec exec_;
};

namespace {

class CudaStep final : public StepInstance {
 public:
  CudaStep(const Workload& w, const RunContext& ctx)
      : w_(w), ops_(cuda::as_stream(ctx.cuda_stream), ctx.cuda_device), trainer_(ops_, w) {}
  void run() override { trainer_.step(false); }
  Verdict check() override {
    ops_.synchronize();
    if (trainer_.steps() == 0) return Verdict{false, 0, "no step has run"};
    return check_first_losses(w_, trainer_.first_sample(), trainer_.first_losses(), w_.switches.bf16_matmuls);
  }
  int64_t peak_bytes() const override { return ops_.memory().peak; }
  void record_micro_batches(int64_t count) override { trainer_.record_micro_batches(count); }
  std::vector<MicroBatchLosses> recorded_micro_batches() override { return trainer_.recorded_micro_batches(); }
  std::vector<double> exp_avg() override { return trainer_.exp_avg_values(); }
  MarkCount marks() const override { return MarkCount{ops_.marks_taken(), ops_.event_pool()}; }
  bool capturing() const override { return ops_.capturing(); }
  std::vector<std::pair<std::string, double>> observed() const override {
    auto* self = const_cast<CudaStep*>(this);  // profiling runs more steps of this trainer
    return observe(self->trainer_, self->ops_, 3);
  }

 private:
  Workload w_;
  CudaOps ops_;
  Trainer<CudaOps> trainer_;
};

}  // namespace

std::unique_ptr<StepInstance> make_cuda_step(const Workload& w, const RunContext& ctx) {
  return std::make_unique<CudaStep>(w, ctx);
}

}  // namespace tb::step

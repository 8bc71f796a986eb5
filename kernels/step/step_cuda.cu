// The training step on the CUDA backend: the same Model and Trainer as the CPU, over CudaOps.
// Matrix products on cuBLAS (row-major tensors seen as their column-major transposes), the rest as
// grid-stride kernels on the benchmark's stream; the clip factor never leaves the device. With the
// cuda_graphs switch, a micro-step (forward and backward) is captured once and replayed.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "allreduce/allreduce.h"
#include "runtime/comm.h"
#include "runtime/cuda_fill.cuh"
#include "runtime/cuda_raii.h"
#include "runtime/defaults.h"
#include "step/cpu_ops.h"
#include "step/step.h"
#include "step/trainer.h"

namespace tb::step {

namespace {

using cuda::Graph;
using cuda::GraphExec;

constexpr int threads = 256;

#define TB_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); i += int64_t{gridDim.x} * blockDim.x)

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum (or max) over the block; every thread gets the result.
__device__ inline float block_reduce(float v, bool is_max) {
  __shared__ float scratch[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  v = is_max ? warp_max(v) : warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  v = lane < warps ? scratch[lane] : (is_max ? -INFINITY : 0.0f);
  return is_max ? warp_max(v) : warp_sum(v);
}

__global__ void copy_kernel(float* d, const float* s, int64_t n) { TB_GRID_STRIDE(i, n) d[i] = s[i]; }
__global__ void add_kernel(float* o, const float* a, const float* b, int64_t n) { TB_GRID_STRIDE(i, n) o[i] = a[i] + b[i]; }
__global__ void sub_kernel(float* o, const float* a, const float* b, int64_t n) { TB_GRID_STRIDE(i, n) o[i] = a[i] - b[i]; }

__global__ void gather_tokens_kernel(int32_t* tokens, int32_t* targets, const int32_t* dataset, const int32_t* indices,
                                     int64_t B, int64_t Tn) {
  TB_GRID_STRIDE(e, B * Tn) {
    const int64_t b = e / Tn, t = e % Tn;
    const int32_t* row = dataset + static_cast<int64_t>(indices[b]) * (Tn + 1);
    tokens[e] = row[t];
    targets[e] = row[t + 1];
  }
}

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

// One warp per row.
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp, const float* w,
                                         const float* b, int64_t N, int64_t C, float eps) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + row * C;
  float s = 0;
  for (int64_t c = lane; c < C; c += 32) s += x[c];
  const float m = warp_sum(s) / static_cast<float>(C);
  float v = 0;
  for (int64_t c = lane; c < C; c += 32) v += (x[c] - m) * (x[c] - m);
  const float r = rsqrtf(warp_sum(v) / static_cast<float>(C) + eps);
  for (int64_t c = lane; c < C; c += 32) out[row * C + c] = (x[c] - m) * r * w[c] + b[c];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
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
    dm = warp_sum(dm) / static_cast<float>(C);
    dnm = warp_sum(dnm) / static_cast<float>(C);
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
__global__ void bias_backward_kernel(float* dbias, const float* dout, int64_t N, int64_t OC) {
  __shared__ float partial[bias_block_rows][32];
  const int64_t col = blockIdx.x * 32 + threadIdx.x;
  float s = 0;
  if (col < OC)
    for (int64_t n = blockIdx.y * int64_t{blockDim.y} + threadIdx.y; n < N; n += int64_t{gridDim.y} * blockDim.y)
      s += dout[n * OC + col];
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || col >= OC) return;
  for (int r = 1; r < bias_block_rows; ++r) s += partial[r][threadIdx.x];
  atomicAdd(&dbias[col], s);
}

// [B, T, 3, NH, hs] <-> [B, NH, T, hs] for q, k, v (llm.c's permute), and back for y.
__global__ void permute_kernel(float* q, float* k, float* v, const float* qkv, int64_t B, int64_t Tn, int64_t NH, int64_t hs) {
  const int64_t C = NH * hs;
  TB_GRID_STRIDE(e, B * NH * Tn * hs) {
    const int64_t d = e % hs, t = (e / hs) % Tn, h = (e / (hs * Tn)) % NH, b = e / (hs * Tn * NH);
    const int64_t src = (b * Tn + t) * 3 * C + h * hs + d;
    q[e] = qkv[src];
    k[e] = qkv[src + C];
    v[e] = qkv[src + 2 * C];
  }
}
__global__ void unpermute_kernel(float* out, const float* y, int64_t B, int64_t Tn, int64_t NH, int64_t hs) {
  TB_GRID_STRIDE(e, B * NH * Tn * hs) {
    const int64_t d = e % hs, t = (e / hs) % Tn, h = (e / (hs * Tn)) % NH, b = e / (hs * Tn * NH);
    out[(b * Tn + t) * NH * hs + h * hs + d] = y[e];
  }
}
__global__ void permute_grad_kernel(float* dy, const float* dout, int64_t B, int64_t Tn, int64_t NH, int64_t hs) {
  TB_GRID_STRIDE(e, B * NH * Tn * hs) {
    const int64_t d = e % hs, t = (e / hs) % Tn, h = (e / (hs * Tn)) % NH, b = e / (hs * Tn * NH);
    dy[e] = dout[(b * Tn + t) * NH * hs + h * hs + d];
  }
}
__global__ void unpermute_qkv_grad_kernel(float* dqkv, const float* dq, const float* dk, const float* dv, int64_t B,
                                          int64_t Tn, int64_t NH, int64_t hs) {
  const int64_t C = NH * hs;
  TB_GRID_STRIDE(e, B * NH * Tn * hs) {
    const int64_t d = e % hs, t = (e / hs) % Tn, h = (e / (hs * Tn)) % NH, b = e / (hs * Tn * NH);
    const int64_t dst = (b * Tn + t) * 3 * C + h * hs + d;
    dqkv[dst] += dq[e];
    dqkv[dst + C] += dk[e];
    dqkv[dst + 2 * C] += dv[e];
  }
}

// Causal softmax of one score row per block (scale applied here); keys after the query are zero.
__global__ void causal_softmax_kernel(float* att, int64_t Tn, float scale) {
  const int64_t row = blockIdx.x, i = row % Tn;
  float* a = att + row * Tn;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) mx = fmaxf(mx, a[j] * scale);
  mx = block_reduce(mx, true);
  float sum = 0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) sum += __expf(a[j] * scale - mx);
  sum = block_reduce(sum, false);
  for (int64_t j = threadIdx.x; j < Tn; j += blockDim.x) a[j] = j <= i ? __expf(a[j] * scale - mx) / sum : 0.0f;
}

// dS = A * (dA - sum(dA * A)) per row, in place over dA.
__global__ void softmax_backward_kernel(float* datt, const float* att, int64_t Tn) {
  const int64_t row = blockIdx.x, i = row % Tn;
  float* d = datt + row * Tn;
  const float* a = att + row * Tn;
  float dot = 0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) dot += d[j] * a[j];
  dot = block_reduce(dot, false);
  for (int64_t j = threadIdx.x; j < Tn; j += blockDim.x) d[j] = j <= i ? a[j] * (d[j] - dot) : 0.0f;
}

__global__ void gelu_forward_kernel(float* out, const float* inp, int64_t n) {
  TB_GRID_STRIDE(i, n) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
  }
}
__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, int64_t n) {
  TB_GRID_STRIDE(i, n) {
    const float x = inp[i], u = 0.7978845608f * (x + 0.044715f * x * x * x), th = tanhf(u);
    const float local = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * 0.7978845608f * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += local * dout[i];
  }
}

__global__ void softmax_crossentropy_kernel(float* probs, float* losses, const float* logits, const int32_t* targets,
                                            int64_t V) {
  const int64_t row = blockIdx.x;
  const float* l = logits + row * V;
  float* p = probs + row * V;
  float mx = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, l[v]);
  mx = block_reduce(mx, true);
  float sum = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) sum += __expf(l[v] - mx);
  sum = block_reduce(sum, false);
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) p[v] = __expf(l[v] - mx) / sum;
  if (threadIdx.x == 0) losses[row] = logf(sum) + mx - l[targets[row]];
}

__global__ void crossentropy_backward_kernel(float* dlogits, const float* probs, const int32_t* targets, float dloss,
                                             int64_t N, int64_t V) {
  TB_GRID_STRIDE(e, N * V) dlogits[e] = (probs[e] - (e % V == targets[e / V] ? 1.0f : 0.0f)) * dloss;
}

__global__ void laplacian_kernel(float* y, const float* x, int64_t N, int64_t C, int64_t k, float alpha) {
  TB_GRID_STRIDE(e, N * C) {
    const int64_t i = e % C;
    const float* row = x + (e - i);
    float neighbours = 0;
    for (int64_t d = 1; d <= k / 2; ++d) neighbours += row[(i - d + C) % C] + row[(i + d) % C];
    y[e] = x[e] + alpha * (static_cast<float>(k) * x[e] - neighbours);
  }
}

__global__ void row_dots_kernel(float* out, const float* a, const float* b, int64_t C) {
  const int64_t row = blockIdx.x;
  float s = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += a[row * C + c] * b[row * C + c];
  s = block_reduce(s, false);
  if (threadIdx.x == 0) out[row] = s;
}

// One CG iteration of one row per block (see CpuOps::cg_step).
__global__ void cg_step_kernel(float* x, float* r, float* p, const float* ap, float* rs, float* rs_new, const float* pap,
                               int64_t C) {
  const int64_t row = blockIdx.x;
  const float a = pap[row] > 0.0f ? rs[row] / pap[row] : 0.0f;
  float s = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const int64_t e = row * C + c;
    x[e] += a * p[e];
    r[e] -= a * ap[e];
    s += r[e] * r[e];
  }
  s = block_reduce(s, false);
  const float beta = rs[row] > 0.0f ? s / rs[row] : 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) p[row * C + c] = r[row * C + c] + beta * p[row * C + c];
  __syncthreads();
  if (threadIdx.x == 0) {
    rs_new[row] = s;
    rs[row] = s;
  }
}

// out[0] = max_n sqrt(rs/bb), out[1] = sum rs, out[2] = sum bb (one block).
__global__ void residual_summary_kernel(float* out, const float* rs, const float* bb, int64_t N) {
  float worst = 0, r = 0, b = 0;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
    if (bb[n] > 0.0f) worst = fmaxf(worst, sqrtf(rs[n] / bb[n]));
    r += rs[n];
    b += bb[n];
  }
  worst = block_reduce(worst, true);
  r = block_reduce(r, false);
  b = block_reduce(b, false);
  if (threadIdx.x == 0) {
    out[0] = worst;
    out[1] = r;
    out[2] = b;
  }
}

__global__ void sum_squares_kernel(double* out, const float* g, int64_t n) {
  double s = 0;
  TB_GRID_STRIDE(i, n) s += static_cast<double>(g[i]) * g[i];
  const float partial = block_reduce(static_cast<float>(s), false);
  if (threadIdx.x == 0) atomicAdd(out, static_cast<double>(partial));
}
__global__ void sqrt_kernel(float* norm, const double* sum) { *norm = static_cast<float>(sqrt(*sum)); }

__device__ inline float device_clip_factor(const float* norm, float clip) {
  return clip > 0.0f ? fminf(1.0f, clip / (*norm + 1e-6f)) : 1.0f;
}

struct AdamwArgs {
  float b1, b2, eps, decay, step_size, bc2, clip;
};

__global__ void adamw_fused_kernel(float* p, float* g, float* m, float* v, int64_t n, AdamwArgs a, const float* norm) {
  const float f = device_clip_factor(norm, a.clip);
  TB_GRID_STRIDE(i, n) {
    const float gi = g[i] * f;
    const float mi = a.b1 * m[i] + (1.0f - a.b1) * gi;
    const float vi = a.b2 * v[i] + (1.0f - a.b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * a.decay - a.step_size * mi / (sqrtf(vi) / a.bc2 + a.eps);
    g[i] = gi;
  }
}

// One elementwise op of PyTorch's loop paths over [offset, offset + n) (see CpuOps::adamw).
__global__ void adamw_op_kernel(int op, float* p, float* g, float* m, float* v, float* denom, int64_t n, AdamwArgs a,
                                const float* norm) {
  const float f = op == 0 ? device_clip_factor(norm, a.clip) : 1.0f;
  TB_GRID_STRIDE(i, n) {
    switch (op) {
      case 0: g[i] *= f; break;
      case 1: p[i] *= a.decay; break;
      case 2: m[i] += (1.0f - a.b1) * (g[i] - m[i]); break;
      case 3: v[i] *= a.b2; break;
      case 4: v[i] += (1.0f - a.b2) * g[i] * g[i]; break;
      case 5: denom[i] = sqrtf(v[i]); break;
      case 6: denom[i] = denom[i] / a.bc2 + a.eps; break;
      case 7: p[i] -= a.step_size * m[i] / denom[i]; break;
    }
  }
}

__global__ void sum_losses_kernel(float* acc, const float* losses, int64_t n, float scale) {
  float s = 0;
  TB_GRID_STRIDE(i, n) s += losses[i];
  s = block_reduce(s, false);
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

  CudaOps(cudaStream_t stream, int device) : stream_(stream), device_(device), meter_(std::make_shared<MemoryMeter>()) {
    CUBLAS_CHECK(cublasSetStream(handle_, stream));
    // A fixed cuBLAS workspace: no allocation inside a captured graph.
    CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_.data(), workspace_.bytes()));
    events_.resize(64);
    read_slot_ = cuda::PinnedBuffer<float>(4);
    scratch_double_ = cuda::DeviceBuffer<double>(1);
    summary_ = cuda::DeviceBuffer<float>(3);
    // Once here, not per launch (the per-warp slices of a wide layernorm need more than the default).
    CUDA_CHECK(cudaDeviceGetAttribute(&max_shared_bytes_, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    CUDA_CHECK(cudaFuncSetAttribute(layernorm_backward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_shared_bytes_));
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
  void gather_tokens(int32_t* tokens, int32_t* targets, const int32_t* dataset, const int32_t* indices, int64_t B,
                     int64_t Tn) {
    gather_tokens_kernel<<<grid(B * Tn), threads, 0, stream_>>>(tokens, targets, dataset, indices, B, Tn);
    check_launch();
  }

  void zero(float* p, int64_t n) { CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), stream_)); }
  void copy(float* d, const float* s, int64_t n) { launch(copy_kernel, n, d, s, n); }
  void add(float* o, const float* a, const float* b, int64_t n) { launch(add_kernel, n, o, a, b, n); }
  void subtract(float* o, const float* a, const float* b, int64_t n) { launch(sub_kernel, n, o, a, b, n); }

  void encoder_forward(float* out, const int32_t* tok, const float* wte, const float* wpe, int64_t B, int64_t Tn, int64_t C) {
    launch(encoder_forward_kernel, B * Tn * C, out, tok, wte, wpe, B, Tn, C);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tok, int64_t B, int64_t Tn, int64_t C) {
    launch(encoder_backward_kernel, B * Tn * C, dwte, dwpe, dout, tok, B, Tn, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int64_t N,
                         int64_t C) {
    const int64_t blocks = (N * 32 + threads - 1) / threads;
    layernorm_forward_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream_>>>(
        out, mean, rstd, inp, w, b, N, C, static_cast<float>(defaults::layernorm_eps));
    check_launch();
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
    if (bias) launch(bias_rows_kernel, N * OC, out, bias, N, OC);
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, 1.0f, w, C, inp, C, bias ? 1.0f : 0.0f, out, OC, bf16);
  }
  // dinp^T (C x N) += W^T dout^T; dW^T (C x OC) += inp^T dout; dbias += column sums of dout.
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w, int64_t N,
                       int64_t C, int64_t OC, bool bf16) {
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, 1.0f, w, C, dout, OC, 1.0f, dinp, C, bf16);
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dw, C, bf16);
    if (dbias) {
      const dim3 block(32, bias_block_rows), blocks(static_cast<unsigned>((OC + 31) / 32), static_cast<unsigned>(std::min<int64_t>((N + 63) / 64, 1024)));
      bias_backward_kernel<<<blocks, block, 0, stream_>>>(dbias, dout, N, OC);
      check_launch();
    }
  }
  void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t Tn, int64_t C, int64_t NH) {
    const int64_t hs = C / NH, n = B * Tn * C;
    float *q = scratch(0, n), *k = scratch(1, n), *v = scratch(2, n), *y = scratch(3, n);
    launch(permute_kernel, n, q, k, v, qkv, B, Tn, NH, hs);
    const int batch = static_cast<int>(B * NH);
    // att^T = K Q^T per head (column-major), raw scores; the softmax scales them.
    batched(CUBLAS_OP_T, CUBLAS_OP_N, Tn, Tn, hs, 1.0f, k, hs, Tn * hs, q, hs, Tn * hs, 0.0f, att, Tn, Tn * Tn, batch);
    causal_softmax_kernel<<<static_cast<unsigned>(B * NH * Tn), threads, 0, stream_>>>(att, Tn, 1.0f / sqrtf(static_cast<float>(hs)));
    check_launch();
    // y^T = V^T att^T.
    batched(CUBLAS_OP_N, CUBLAS_OP_N, hs, Tn, Tn, 1.0f, v, hs, Tn * hs, att, Tn, Tn * Tn, 0.0f, y, hs, Tn * hs, batch);
    launch(unpermute_kernel, n, out, y, B, Tn, NH, hs);
  }
  void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv, const float* att, int64_t B,
                          int64_t Tn, int64_t C, int64_t NH) {
    const int64_t hs = C / NH, n = B * Tn * C;
    float *q = scratch(0, n), *k = scratch(1, n), *v = scratch(2, n), *dy = scratch(3, n);
    float *dq = scratch(4, n), *dk = scratch(5, n), *dv = scratch(6, n);
    launch(permute_kernel, n, q, k, v, qkv, B, Tn, NH, hs);  // the forward's scratch may be stale
    launch(permute_grad_kernel, n, dy, dout, B, Tn, NH, hs);
    const int batch = static_cast<int>(B * NH);
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));
    batched(CUBLAS_OP_T, CUBLAS_OP_N, Tn, Tn, hs, 1.0f, v, hs, Tn * hs, dy, hs, Tn * hs, 0.0f, datt, Tn, Tn * Tn, batch);
    batched(CUBLAS_OP_N, CUBLAS_OP_T, hs, Tn, Tn, 1.0f, dy, hs, Tn * hs, att, Tn, Tn * Tn, 0.0f, dv, hs, Tn * hs, batch);
    softmax_backward_kernel<<<static_cast<unsigned>(B * NH * Tn), threads, 0, stream_>>>(datt, att, Tn);
    check_launch();
    batched(CUBLAS_OP_N, CUBLAS_OP_N, hs, Tn, Tn, scale, k, hs, Tn * hs, datt, Tn, Tn * Tn, 0.0f, dq, hs, Tn * hs, batch);
    batched(CUBLAS_OP_N, CUBLAS_OP_T, hs, Tn, Tn, scale, q, hs, Tn * hs, datt, Tn, Tn * Tn, 0.0f, dk, hs, Tn * hs, batch);
    launch(unpermute_qkv_grad_kernel, n, dqkv, dq, dk, dv, B, Tn, NH, hs);
  }
  void gelu_forward(float* out, const float* inp, int64_t n) { launch(gelu_forward_kernel, n, out, inp, n); }
  void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
    launch(gelu_backward_kernel, n, dinp, inp, dout, n);
  }
  void softmax_crossentropy(float* probs, float* losses, const float* logits, const int32_t* targets, int64_t N, int64_t V) {
    softmax_crossentropy_kernel<<<static_cast<unsigned>(N), threads, 0, stream_>>>(probs, losses, logits, targets, V);
    check_launch();
  }
  void crossentropy_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss, int64_t N, int64_t V) {
    launch(crossentropy_backward_kernel, N * V, dlogits, probs, targets, dloss, N, V);
  }
  void laplacian_apply(float* y, const float* x, int64_t N, int64_t C, int64_t k, float alpha) {
    launch(laplacian_kernel, N * C, y, x, N, C, k, alpha);
  }
  void row_dots(float* out, const float* a, const float* b, int64_t N, int64_t C) {
    row_dots_kernel<<<static_cast<unsigned>(N), 128, 0, stream_>>>(out, a, b, C);
    check_launch();
  }
  void cg_step(float* x, float* r, float* p, const float* ap, float* rs, float* rs_new, const float* pap, int64_t N, int64_t C) {
    cg_step_kernel<<<static_cast<unsigned>(N), 128, 0, stream_>>>(x, r, p, ap, rs, rs_new, pap, C);
    check_launch();
  }
  // The host-checked CG reads its convergence test back: one synchronisation per call.
  double max_relative(const float* rs, const float* bb, int64_t N) { return summary(rs, bb, N)[0]; }
  double total_relative(const float* rs, const float* bb, int64_t N) {
    const auto s = summary(rs, bb, N);
    return s[2] > 0 ? std::sqrt(s[1] / s[2]) : 0.0;
  }

  // Data parallelism: NCCL's all-reduce on this stream, `bucket` elements per call from the end.
  void allreduce_sum(float* data, int64_t n, int64_t bucket) {
    comm::for_each_bucket_from_end(n, bucket, [&](int64_t begin, int64_t length) {
      allreduce::cuda_allreduce_sum(data + begin, length, stream_, device_);
    });
  }

  void grad_norm(float* norm, const float* grads, int64_t n) {
    CUDA_CHECK(cudaMemsetAsync(scratch_double_.data(), 0, sizeof(double), stream_));
    sum_squares_kernel<<<grid(n), threads, 0, stream_>>>(scratch_double_.data(), grads, n);
    sqrt_kernel<<<1, 1, 0, stream_>>>(norm, scratch_double_.data());
    check_launch();
  }
  void adamw(OptimizerKind kind, float* params, const float* grads_in, float* m, float* v,
             const std::vector<TensorSpan>& tensors, const AdamwScalars& s, const float* norm, double clip) {
    float* grads = const_cast<float*>(grads_in);  // clipping scales the gradients in place, as PyTorch does
    const AdamwArgs a{static_cast<float>(s.beta1), static_cast<float>(s.beta2), static_cast<float>(s.eps),
                      static_cast<float>(1.0 - s.lr * s.weight_decay), static_cast<float>(s.step_size),
                      static_cast<float>(s.bias_correction2_sqrt), static_cast<float>(clip)};
    int64_t total = 0;
    for (const auto& t : tensors) total = std::max(total, t.offset + t.size);
    if (kind == OptimizerKind::fused) {
      adamw_fused_kernel<<<grid(total), threads, 0, stream_>>>(params, grads, m, v, total, a, norm);
      check_launch();
      return;
    }
    float* denom = scratch(7, total);
    auto pass = [&](int op, int64_t offset, int64_t n) {
      if (n == 0) return;
      adamw_op_kernel<<<grid(n), threads, 0, stream_>>>(op, params + offset, grads + offset, m + offset, v + offset,
                                                         denom + offset, n, a, norm);
      check_launch();
    };
    if (kind == OptimizerKind::per_tensor) {
      for (const auto& t : tensors) pass(0, t.offset, t.size);
      for (const auto& t : tensors)
        for (int op = 1; op < 8; ++op) pass(op, t.offset, t.size);
      return;
    }
    // foreach: each op over lists of up to 48 tensors per launch (multi_tensor_apply's bound for the
    // deepest ops); the tensors of a list are contiguous here, so one launch covers their span.
    constexpr std::size_t per_launch = 48;
    for (int op = 0; op < 8; ++op)
      for (std::size_t first = 0; first < tensors.size(); first += per_launch) {
        const std::size_t last = std::min(tensors.size(), first + per_launch) - 1;
        pass(op, tensors[first].offset, tensors[last].offset + tensors[last].size - tensors[first].offset);
      }
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
            int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc, bool bf16) {
    CUBLAS_CHECK(cublasGemmEx(handle_, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha, A,
                              CUDA_R_32F, static_cast<int>(lda), B, CUDA_R_32F, static_cast<int>(ldb), &beta, C, CUDA_R_32F,
                              static_cast<int>(ldc), bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
  }
  void batched(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A,
               int64_t lda, int64_t sa, const float* B, int64_t ldb, int64_t sb, float beta, float* C, int64_t ldc,
               int64_t sc, int batch) {
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle_, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                                            &alpha, A, CUDA_R_32F, static_cast<int>(lda), sa, B, CUDA_R_32F,
                                            static_cast<int>(ldb), sb, &beta, C, CUDA_R_32F, static_cast<int>(ldc), sc, batch,
                                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  // Scratch buffers by slot, grown on first use to the largest size asked for (counted).
  float* scratch(int slot, int64_t n) {
    if (static_cast<int>(scratch_.size()) <= slot) scratch_.resize(slot + 1), scratch_size_.resize(slot + 1, 0);
    if (scratch_size_[slot] < n) {
      scratch_[slot] = alloc<float>(n);
      scratch_size_[slot] = n;
    }
    return scratch_[slot].data();
  }
  std::array<float, 3> summary(const float* rs, const float* bb, int64_t N) {
    residual_summary_kernel<<<1, 1024, 0, stream_>>>(summary_.data(), rs, bb, N);
    check_launch();
    std::array<float, 3> out{};
    CUDA_CHECK(cudaMemcpyAsync(out.data(), summary_.data(), sizeof(out), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return out;
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
  std::vector<Buffer<float>> scratch_;
  std::vector<int64_t> scratch_size_;
  cuda::PinnedBuffer<float> read_slot_;
  cuda::Event async_done_;
  bool async_pending_ = false;
  cuda::DeviceBuffer<double> scratch_double_;
  cuda::DeviceBuffer<float> summary_;
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

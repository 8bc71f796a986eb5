// The transformer layers that more than one stage runs, on the GPU: layernorm and GELU (forward) as
// launchers on a stream, templated on the output (float, or the bf16 bits a bf16 product reads). The
// step's CudaOps and the attention stage's transformer block both launch these, so the CUDA backend has
// one layernorm and one GELU (the CPU ones: layers.h). Header-only: each .cu that launches them
// instantiates the kernels it uses.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/cuda_bf16.cuh"
#include "runtime/cuda_check.h"
#include "runtime/cuda_fill.cuh"
#include "runtime/cuda_reduce.cuh"
#include "runtime/defaults.h"
#include "runtime/gelu.h"

namespace tb::layers {

namespace detail {

constexpr int threads = 256;

// One warp per row.
template <class Out>
__global__ void layernorm_forward_kernel(Out* out, float* mean, float* rstd, const float* inp, const float* w,
                                         const float* b, int64_t N, int64_t C, float eps) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + row * C;
  float s = 0;
  for (int64_t c = lane; c < C; c += 32) s += x[c];
  const float m = cuda::warp_sum(s) / static_cast<float>(C);
  float v = 0;
  for (int64_t c = lane; c < C; c += 32) v += (x[c] - m) * (x[c] - m);
  const float r = rsqrtf(cuda::warp_sum(v) / static_cast<float>(C) + eps);
  for (int64_t c = lane; c < C; c += 32) cuda::store(out + row * C + c, (x[c] - m) * r * w[c] + b[c]);
  if (lane == 0 && mean) mean[row] = m;
  if (lane == 0 && rstd) rstd[row] = r;
}

template <class Out>
__global__ void gelu_forward_kernel(Out* out, const float* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float x = inp[i];
    cuda::store(out + i, 0.5f * x * (1.0f + tanhf(gelu::inner(x))));
  }
}

}  // namespace detail

// out = (inp - mean) * rstd * w + b over each of N rows of C, one warp per row (eps:
// defaults::layernorm_eps); each row's mean and rstd go where those pointers are not null (the
// step's backward reads them). Throws CallError when the launch fails.
template <class Out>
void cuda_layernorm_forward(Out* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int64_t N,
                            int64_t C, cudaStream_t stream) {
  if (N == 0) return;
  const int64_t blocks = (N * 32 + detail::threads - 1) / detail::threads;
  detail::layernorm_forward_kernel<<<static_cast<unsigned>(blocks), detail::threads, 0, stream>>>(
      out, mean, rstd, inp, w, b, N, C, static_cast<float>(defaults::layernorm_eps));
  CUDA_CHECK(cudaGetLastError());
}

// out = gelu(inp), the tanh approximation (runtime/gelu.h), grid-stride over `device`'s SMs; out may
// be inp. Throws CallError when the launch fails.
template <class Out>
void cuda_gelu_forward(Out* out, const float* inp, int64_t n, cudaStream_t stream, int device) {
  if (n == 0) return;
  detail::gelu_forward_kernel<<<cuda::grid_for(n, detail::threads, device), detail::threads, 0, stream>>>(out, inp, n);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tb::layers

// Deterministic device inputs: element i of a buffer is uniform_at(seed, i), the same value the CPU
// reference regenerates (bf16 buffers hold it rounded to nearest even, as round_to_bf16 does).
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "cuda_check.h"
#include "random.h"

namespace tb::cuda {

// A grid-stride launch size: enough blocks to fill every SM several times over, and no more.
inline int grid_for(int64_t items, int block, int device) {
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return static_cast<int>(std::clamp<int64_t>((items + block - 1) / block, 1, int64_t{sms} * 16));
}

namespace detail {
template <class T>
__device__ inline T from_float(float x) {
  return static_cast<T>(x);
}
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <class T>
__global__ void fill_uniform_kernel(T* out, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = from_float<T>(uniform_at(seed, static_cast<uint64_t>(i), lo, hi));
}
}  // namespace detail

template <class T>
void fill_uniform(T* out, int64_t n, uint64_t seed, cudaStream_t stream, int device, float lo = -1.0f, float hi = 1.0f) {
  if (n == 0) return;
  detail::fill_uniform_kernel<<<grid_for(n, 256, device), 256, 0, stream>>>(out, n, seed, lo, hi);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tb::cuda

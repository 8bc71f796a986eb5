// Warp and block reductions of floats for the CUDA kernels (shuffles, then one shared slot per warp).
#pragma once

#include <cmath>

namespace tb::cuda {

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum (or max) over the block; every thread gets the result. The first barrier lets consecutive calls
// reuse the scratch.
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

}  // namespace tb::cuda

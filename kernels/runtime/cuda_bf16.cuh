// A kernel's output or input as fp32 or as bf16 (the bf16 copy a matrix product reads), one overload
// each: a kernel templated on its element type writes and reads through these. bf16 travels as its 16
// bits (uint16_t, attention::bf16_bits), so that host headers need no cuda_bf16.h.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace tb::cuda {

__device__ inline void store(float* p, float v) { *p = v; }
__device__ inline void store(uint16_t* p, float v) {
  const __nv_bfloat16 b = __float2bfloat16_rn(v);
  *p = *reinterpret_cast<const uint16_t*>(&b);
}
__device__ inline float load(const float* p) { return *p; }
__device__ inline float load(const uint16_t* p) { return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p)); }

}  // namespace tb::cuda

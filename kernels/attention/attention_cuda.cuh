// What the CUDA attention files share: the bf16 type, the shared-memory opt-in, row addressing, the
// stage's device tensors (Q, K, V, O in fp32 or bf16 from the reference's inputs) and their download.
// Each file includes it into its own anonymous namespace copy; the few functions one family calls in
// another are declared at the end.
#pragma once

#include <cuda_bf16.h>

#include <string>
#include <type_traits>
#include <vector>

#include "attention.h"
#include "runtime/cuda_fill.cuh"
#include "runtime/cuda_raii.h"

namespace tb::attention {

namespace {

using bf16 = __nv_bfloat16;

// Shared memory a block may use without opting in (cudaFuncAttributeMaxDynamicSharedMemorySize).
constexpr std::size_t default_shared_bytes = 48 * 1024;

// Raises `kernel`'s dynamic shared memory limit to `bytes` where the default is too small, or says
// why the device cannot. Cheap and legal during stream capture (FlashAttention sets it at every
// launch), so launchers call it each time.
template <class Kernel>
void allow_shared_bytes(Kernel kernel, std::size_t bytes, const char* what) {
  if (bytes <= default_shared_bytes) return;
  int device = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  TB_REQUIRE(bytes <= static_cast<std::size_t>(optin), std::string(what) + " needs " + std::to_string(bytes) +
                                                           " bytes of shared memory per block, the device " +
                                                           std::to_string(optin));
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// The max or sum of v over the block (a multiple of 32 threads), with blockDim.x / 32 floats of
// shared scratch; every thread gets the result.
__device__ inline float block_reduce(float v, bool is_max, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? scratch[threadIdx.x] : (is_max ? -INFINITY : 0.0f);
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, v, o);
      v = is_max ? fmaxf(v, other) : v + other;
    }
  if (threadIdx.x == 0) scratch[0] = v;
  __syncthreads();
  return scratch[0];
}

// Where row `s` of head (b, h) starts in an operand laid out as `st`.
__host__ __device__ inline int64_t row_offset(const Strides& st, int64_t b, int64_t h, int64_t s) {
  return b * st.batch + h * st.head + s * st.row;
}

// After the stream's work: a copy to pageable memory returns when it has landed.
template <class T>
std::vector<float> download_as_float(const T* device, int64_t n, cudaStream_t stream) {
  std::vector<T> host(static_cast<std::size_t>(n));
  CUDA_CHECK(cudaMemcpyAsync(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> out(host.size());
  for (std::size_t i = 0; i < host.size(); ++i) {
    if constexpr (std::is_same_v<T, bf16>) out[i] = __bfloat162float(host[i]);
    else out[i] = host[i];
  }
  return out;
}

// Q, K, V, O on the device in fp32 or bf16, filled with the reference's inputs.
struct Tensors {
  Tensors(const Shape& s, DType t, cudaStream_t stream, int device) : type(t) {
    const auto n = static_cast<std::size_t>(s.elements());
    if (t == DType::bf16) {
      q16 = cuda::DeviceBuffer<bf16>(n), k16 = cuda::DeviceBuffer<bf16>(n), v16 = cuda::DeviceBuffer<bf16>(n);
      o16 = cuda::DeviceBuffer<bf16>(n);
      cuda::fill_uniform(q16.data(), s.elements(), seed_q, stream, device);
      cuda::fill_uniform(k16.data(), s.elements(), seed_k, stream, device);
      cuda::fill_uniform(v16.data(), s.elements(), seed_v, stream, device);
    } else {
      q32 = cuda::DeviceBuffer<float>(n), k32 = cuda::DeviceBuffer<float>(n), v32 = cuda::DeviceBuffer<float>(n);
      o32 = cuda::DeviceBuffer<float>(n);
      cuda::fill_uniform(q32.data(), s.elements(), seed_q, stream, device);
      cuda::fill_uniform(k32.data(), s.elements(), seed_k, stream, device);
      cuda::fill_uniform(v32.data(), s.elements(), seed_v, stream, device);
    }
  }
  // The fp32 tensors as the kernels over buffers take them, [B, H, S, D].
  Operands<float> operands(const Shape& s) const {
    return Operands<float>{q32.data(), k32.data(), v32.data(), o32.data(), bhsd(s), bhsd(s)};
  }
  std::vector<float> output(int64_t n, cudaStream_t stream) const {
    return type == DType::bf16 ? download_as_float(o16.data(), n, stream) : download_as_float(o32.data(), n, stream);
  }
  // A bf16 buffer as the tensor-core functions take it.
  static bf16_bits* bits(const cuda::DeviceBuffer<bf16>& b) { return reinterpret_cast<bf16_bits*>(b.data()); }
  DType type;
  cuda::DeviceBuffer<float> q32, k32, v32, o32;
  cuda::DeviceBuffer<bf16> q16, k16, v16, o16;
};

}  // namespace

// Across the families: the fp32 fused forward, causal or full (attention_fused_fp32.cu), which the
// stage's fused rows run full; the stage's own naive path over Tensors (attention_naive.cu).
void fused_fp32(const Shape& s, bool causal, const Operands<float>& x, float* lse, cudaStream_t stream);

}  // namespace tb::attention

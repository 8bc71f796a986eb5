// CUDA pieces shared by the optimizer stages (`adamw`, `gradnorm`): fp32/bf16 loads and stores,
// scalar and four-wide, the parameter set's arenas on the device, and a chunk table kept in device
// memory so that one launch can cover every tensor of any arena laid out as the set says (the
// stages' padded arenas, or the training step's packed parameters, whose tensors start anywhere).
// Included only by .cu files.
#pragma once

#include <cuda_bf16.h>

#include <cstring>
#include <type_traits>
#include <vector>

#include "adamw/param_set.h"
#include "runtime/cuda_raii.h"
#include "runtime/host_buffer.h"

namespace tb::adamw::device {

// ---- element access -------------------------------------------------------------------------------
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return __float2bfloat16_rn(x);
}

template <class T>
__device__ __forceinline__ bool aligned_for_quads(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T)) == 0;
}

// How many leading elements to take one at a time so that every pointer, advanced by that many, is
// aligned_for_quads; -1 when no count does (the pointers are misaligned differently). 0 for the
// stages' arenas; 0 to 3 for a packed arena whose buffers share their offsets.
template <class T, class... Rest>
__device__ __forceinline__ int quad_head(const T* first, const Rest*... rest) {
  const int head = static_cast<int>((4 - reinterpret_cast<uintptr_t>(first) / sizeof(T) % 4) % 4);
  const bool all_aligned = aligned_for_quads(first + head) && (aligned_for_quads(rest + head) && ...);
  return all_aligned ? head : -1;
}

// Four consecutive elements in one access (16 B of fp32, 8 B of bf16); `p` aligned_for_quads.
__device__ __forceinline__ void load4(const float* p, float (&x)[4]) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
}
__device__ __forceinline__ void load4(const __nv_bfloat16* p, float (&x)[4]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  __nv_bfloat162 lo, hi;
  memcpy(&lo, &raw.x, sizeof lo);
  memcpy(&hi, &raw.y, sizeof hi);
  const float2 a = __bfloat1622float2(lo), b = __bfloat1622float2(hi);
  x[0] = a.x, x[1] = a.y, x[2] = b.x, x[3] = b.y;
}
__device__ __forceinline__ void store4(float* p, const float (&x)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
}
__device__ __forceinline__ void store4(__nv_bfloat16* p, const float (&x)[4]) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(x[0], x[1]), hi = __floats2bfloat162_rn(x[2], x[3]);
  uint2 raw;
  memcpy(&raw.x, &lo, sizeof lo);
  memcpy(&raw.y, &hi, sizeof hi);
  *reinterpret_cast<uint2*>(p) = raw;
}

// ---- host side -------------------------------------------------------------------------------------
// A chunk as a kernel reads it (16 B): `len` elements of tensor `tensor` from element `begin` of the
// arena (the tensor's offset plus the chunk's start in it), so the table serves any buffers laid out
// as the set says: a kernel takes the arenas' base pointers and the table.
struct DeviceChunk {
  int32_t tensor;
  int32_t len;
  int64_t begin;
};

// Set-up copies go on the benchmark's stream, ordered with its work (a plain cudaMemcpy runs on the
// legacy stream, which a non-blocking stream does not wait for). From pageable memory the call
// returns once the source has been staged, so the host vector may go when it returns.
template <class T>
cuda::DeviceBuffer<T> upload(const std::vector<T>& host, cudaStream_t stream) {
  cuda::DeviceBuffer<T> out(host.size());
  if (!host.empty()) CUDA_CHECK(cudaMemcpyAsync(out.data(), host.data(), out.bytes(), cudaMemcpyHostToDevice, stream));
  return out;
}

inline cuda::DeviceBuffer<DeviceChunk> upload_chunks(const ParamSet& set, int64_t chunk_elements, cudaStream_t stream) {
  std::vector<DeviceChunk> table;
  for (const Chunk& c : make_chunks(set, chunk_elements))
    table.push_back(
        DeviceChunk{static_cast<int32_t>(c.tensor), static_cast<int32_t>(c.len), set.offsets[c.tensor] + c.begin});
  return upload(table, stream);
}

// The deterministic start of an arena (fp32 values or bf16 bits), generated on the host and copied.
template <class T>
cuda::DeviceBuffer<T> upload_initial_arena(const ParamSet& set, uint64_t seed, cudaStream_t stream) {
  const auto chunks = make_chunks(set, 65536);
  cuda::DeviceBuffer<T> out(static_cast<std::size_t>(set.arena));
  if constexpr (std::is_same_v<T, float>) {
    HostBuffer<float> host(out.size());
    fill_arena(set, chunks, seed, host.data());
    CUDA_CHECK(cudaMemcpyAsync(out.data(), host.data(), out.bytes(), cudaMemcpyHostToDevice, stream));
  } else {
    HostBuffer<uint16_t> host(out.size());
    fill_arena_bf16(set, chunks, seed, host.data());
    CUDA_CHECK(cudaMemcpyAsync(out.data(), host.data(), out.bytes(), cudaMemcpyHostToDevice, stream));
  }
  return out;
}

// An arena's tensors, concatenated and widened to float, after the stream's work. Synchronous: a
// copy to pageable memory returns when it has landed.
template <class T>
std::vector<float> download_gathered(const ParamSet& set, const T* arena, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    HostBuffer<float> host(static_cast<std::size_t>(set.arena));
    CUDA_CHECK(cudaMemcpyAsync(host.data(), arena, host.bytes(), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return gather(set, host.data());
  } else {
    HostBuffer<uint16_t> host(static_cast<std::size_t>(set.arena));
    CUDA_CHECK(cudaMemcpyAsync(host.data(), arena, host.bytes(), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return gather_bf16(set, host.data());
  }
}

inline int sm_count(int device) {
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

}  // namespace tb::adamw::device

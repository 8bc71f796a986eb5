// Deterministic inputs: element i of a stream depends only on (seed, i), so buffers can be filled in
// parallel (first touch) and a reference can regenerate any element without storing it.
#pragma once

#include <cstdint>
#include <cstring>

// Callable from host and device code without the CPU build ever seeing a CUDA header.
#ifdef __CUDACC__
#define TB_HOST_DEVICE __host__ __device__
#else
#define TB_HOST_DEVICE
#endif

namespace tb {

TB_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [lo, hi), 24 random bits: exactly representable in fp32 and bf16-friendly ranges.
TB_HOST_DEVICE inline float uniform_at(uint64_t seed, uint64_t i, float lo = -1.0f, float hi = 1.0f) {
  const uint64_t bits = splitmix64(seed * 0x632be59bd9b4e019ull + i) >> 40;
  return lo + (hi - lo) * static_cast<float>(bits) * (1.0f / 16777216.0f);
}

// Round to the nearest bfloat16 (ties to even), kept in a float: what __float2bfloat16_rn stores.
inline float round_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

inline float bf16_bits_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

}  // namespace tb

// Vector math for the CPU kernels: 8 floats at a time in GCC's vector extensions, so that one source
// compiles to AVX2 (one register), AVX-512 or SSE (two) in the target_clones of the function that
// includes it. 16-wide vectors spill and scalarise their selects on AVX2 (measured: a GELU 5x slower). libm's
// expf and tanhf are scalar calls; PyTorch's CPU kernels use vectorised ones (Sleef), and a softmax
// or a GELU that calls libm per element runs several times slower than theirs.
#pragma once

#include <cstdint>
#include <cstring>

// Every function here is always inlined into its caller's clone, so no vector crosses a call: the
// ABI note GCC gives for 32-byte vector returns without AVX does not apply (in the including file
// too, where the calls are).
#pragma GCC diagnostic ignored "-Wpsabi"
#define TB_SIMD inline __attribute__((always_inline))

namespace tb::simd {

// 8 floats, declared unaligned and may_alias so that it can be loaded from and stored to any float
// address.
inline constexpr int lanes = 8;
typedef float vf8 __attribute__((vector_size(32), aligned(4), may_alias));
typedef int32_t vi8 __attribute__((vector_size(32)));

TB_SIMD vf8 load8(const float* p) { return *reinterpret_cast<const vf8*>(p); }
TB_SIMD void store8(float* p, vf8 value) { *reinterpret_cast<vf8*>(p) = value; }

// exp(v) lane by lane: the Cephes expf polynomial after range reduction (relative error about 2e-7).
// Below -87.3 (masked scores, a far tail) the result is exactly 0; above 88.3 it is exp(88.3).
TB_SIMD vf8 exp8(vf8 v) {
  const vf8 lo = vf8{} - 87.3f, hi = vf8{} + 88.3f;
  const auto underflow = v < lo;
  v = underflow ? lo : v;
  v = v > hi ? hi : v;
  const vf8 fx = v * 1.44269504088896341f + 0.5f;
  vf8 n = __builtin_convertvector(__builtin_convertvector(fx, vi8), vf8);
  n = n > fx ? n - 1.0f : n;  // floor
  const vf8 r = v - n * 0.693359375f + n * 2.12194440e-4f;
  vf8 y = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) * r +
           1.6666665459e-1f) *
              r +
          5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const vi8 bits = (__builtin_convertvector(n, vi8) + 127) << 23;
  vf8 pow2;
  std::memcpy(&pow2, &bits, sizeof pow2);
  return underflow ? vf8{} : y * pow2;
}

// tanh(u) = 1 - 2 / (exp(2u) + 1): exact limits +-1 for large |u|; near 0 its absolute error stays
// at float's rounding of 1 (6e-8), which is all a GELU's 0.5 x (1 + tanh) can see.
TB_SIMD vf8 tanh8(vf8 u) { return 1.0f - 2.0f / (exp8(u + u) + 1.0f); }

}  // namespace tb::simd

#undef TB_SIMD

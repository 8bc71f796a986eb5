// layers.h on the CPU, in the formulas of llm.c's train_gpt2.c.
#include "layers/layers.h"

#include <cmath>

#include "runtime/cpu_clones.h"
#include "runtime/cpu_elementwise.h"
#include "runtime/defaults.h"
#include "runtime/gelu.h"
#include "runtime/simd_math.h"

namespace tb::layers {

namespace {

template <class T>
void gelu_forward_scalar(T* out, const T* inp, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) out[i] = T(0.5) * inp[i] * (T(1) + std::tanh(gelu::inner(inp[i])));
}

TB_CPU_CLONES void gelu_forward_range(float* out, const float* inp, int64_t begin, int64_t end) {
  int64_t i = begin;
  for (; i + simd::lanes <= end; i += simd::lanes) {
    const simd::vf8 x = simd::load8(inp + i);
    const simd::vf8 u = static_cast<float>(gelu::scale) * (x + static_cast<float>(gelu::cubic) * x * x * x);
    simd::store8(out + i, 0.5f * x * (1.0f + simd::tanh8(u)));
  }
  gelu_forward_scalar(out, inp, i, end);
}

}  // namespace

template <class T>
void cpu_layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int64_t N, int64_t C) {
  const T eps = static_cast<T>(defaults::layernorm_eps);
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T m = 0;
    for (int64_t c = 0; c < C; ++c) m += x[c];
    m /= static_cast<T>(C);
    T v = 0;
    for (int64_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= static_cast<T>(C);
    const T s = T(1) / std::sqrt(v + eps);
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = (x[c] - m) * s * w[c] + b[c];
    if (mean) mean[n] = m;
    if (rstd) rstd[n] = s;
  }
}

template <class T>
void cpu_gelu_forward(T* out, const T* inp, int64_t n) {
  if constexpr (std::is_same_v<T, float>)
    cpu::over_pieces(n, [&](int64_t begin, int64_t end) { gelu_forward_range(out, inp, begin, end); });
  else cpu::over_pieces(n, [&](int64_t begin, int64_t end) { gelu_forward_scalar(out, inp, begin, end); });
}

template void cpu_layernorm_forward(float*, float*, float*, const float*, const float*, const float*, int64_t, int64_t);
template void cpu_layernorm_forward(double*, double*, double*, const double*, const double*, const double*, int64_t,
                                    int64_t);
template void cpu_gelu_forward(float*, const float*, int64_t);
template void cpu_gelu_forward(double*, const double*, int64_t);

}  // namespace tb::layers

// The step's layernorm and GELU (forward) on the CPU as plain functions over host memory, for code
// outside the step that runs the same layers: the attention stage's transformer block. CpuOps calls
// them too, so the CPU backend has one layernorm and one GELU (the CUDA backend's: cuda_layers.cuh).
#pragma once

#include <cstdint>

namespace tb::step {

// out = (inp - mean) * rstd * w + b over each of N rows of C (eps: defaults::layernorm_eps); each
// row's mean and rstd go where those pointers are not null (the step's backward reads them).
template <class T>
void cpu_layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int64_t N, int64_t C);

// out = gelu(inp), the tanh approximation (runtime/gelu.h); out may be inp.
template <class T>
void cpu_gelu_forward(T* out, const T* inp, int64_t n);

}  // namespace tb::step

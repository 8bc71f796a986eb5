// The transformer layers that more than one stage runs, on the CPU: layernorm and GELU (forward) as
// plain functions over host memory. The step's CpuOps and the attention stage's transformer block both
// call these, so the CPU backend has one layernorm and one GELU (the CUDA ones: layers_cuda.cuh).
#pragma once

#include <cstdint>

namespace tb::layers {

// out = (inp - mean) * rstd * w + b over each of N rows of C (eps: defaults::layernorm_eps); each
// row's mean and rstd go where those pointers are not null (the step's backward reads them).
template <class T>
void cpu_layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int64_t N, int64_t C);

// out = gelu(inp), the tanh approximation (runtime/gelu.h); out may be inp. float runs 8 lanes at a
// time with a vector tanh, as PyTorch's CPU kernel does; double (the oracle) calls std::tanh.
template <class T>
void cpu_gelu_forward(T* out, const T* inp, int64_t n);

}  // namespace tb::layers

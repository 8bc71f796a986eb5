// The step's layernorm and GELU (forward) on the GPU as launchers on a stream, for code outside the
// step that runs the same layers: the attention stage's transformer block. CudaOps launches them too,
// so the CUDA backend has one layernorm and one GELU (the CPU backend's: layers.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tb::step {

// out = (inp - mean) * rstd * w + b over each of N rows of C, one warp per row (eps:
// defaults::layernorm_eps); each row's mean and rstd go where those pointers are not null (the
// step's backward reads them). Throws CallError when the launch fails.
void cuda_layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                            int64_t N, int64_t C, cudaStream_t stream);

// out = gelu(inp), the tanh approximation (runtime/gelu.h), grid-stride over `device`'s SMs; out may
// be inp. Throws CallError when the launch fails.
void cuda_gelu_forward(float* out, const float* inp, int64_t n, cudaStream_t stream, int device);

}  // namespace tb::step

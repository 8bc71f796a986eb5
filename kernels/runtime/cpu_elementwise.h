// The elementwise loops the CPU backends share (the step's CpuOps, cg's CpuRows), OpenMP over
// elements, and the one rule for when a loop is worth a parallel region.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "runtime/simd_math.h"

namespace tb::cpu {

// Below this much work a parallel region costs more than it saves (fork, join and a barrier: tens of
// microseconds on a loaded machine); the step's small models are all small loops. The same number as
// PyTorch's CPU ops (at::internal::GRAIN_SIZE), which run on one thread below it; the stages' CPU
// variants (adamw, gradnorm, allreduce) use it too.
inline constexpr int64_t parallel_threshold = 32768;
inline bool parallel_worth(int64_t work) { return work >= parallel_threshold; }

template <class T>
void zero(T* x, int64_t n) {
#pragma omp parallel for schedule(static) if (parallel_worth(n))
  for (int64_t i = 0; i < n; ++i) x[i] = T(0);
}

template <class T>
void copy(T* dst, const T* src, int64_t n) {
#pragma omp parallel for schedule(static) if (parallel_worth(n))
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

template <class T>
void add(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for schedule(static) if (parallel_worth(n))
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <class T>
void subtract(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for schedule(static) if (parallel_worth(n))
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] - b[i];
}

// piece(begin, end) on one contiguous piece per thread of a team (a parallel region only where
// parallel_worth(n)), each piece whole vectors of simd::lanes, so that only the last has a scalar tail.
template <class F>
void over_pieces(int64_t n, F&& piece) {
#pragma omp parallel if (parallel_worth(n))
  {
    const int64_t team = omp_get_num_threads(), me = omp_get_thread_num();
    const int64_t vectors = (n + simd::lanes - 1) / simd::lanes;
    piece(std::min(n, vectors * me / team * simd::lanes), std::min(n, vectors * (me + 1) / team * simd::lanes));
  }
}

}  // namespace tb::cpu

// The elementwise loops the CPU backends share (the step's CpuOps, cg's CpuRows), OpenMP over
// elements, and the one rule for when a loop is worth a parallel region.
#pragma once

#include <cstdint>

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

}  // namespace tb::cpu

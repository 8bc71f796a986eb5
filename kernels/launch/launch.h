// Stage `launch`: what launching small kernels costs, and what a CUDA graph buys back (docs/sources.md#002-trainer2's
// Trainer2 window: 64 steps x ~12 kernels, "5 ms of launch overhead per window"). The window is a
// plain-C++ program of small kernels; the device runs it eagerly, as a captured graph, with the
// capture counted, and as a graph updated in place; the reference runs the same program in loops.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "runtime/random.h"
#include "runtime/registry.h"

namespace tb::launch {

inline constexpr int state_buffers = 4;  // the window's tensors: each kernel reads one, updates another
inline constexpr uint64_t seed_state = 41, seed_coefficients = 42;

// One kernel of the window: state[dst] = a * state[dst] + b * state[src] + c, elementwise.
struct WindowKernel {
  int64_t step = 0;
  int64_t index = 0;  // within its step
  int dst = 0, src = 1;
  float a = 0, b = 0, c = 0;
  bool takes_lr = false;  // the step's update: b is -lr, a by-value argument that changes with the schedule
};

// The window: `steps` steps of `kernels_per_step` kernels, the last of each step the update. The
// coefficients keep |a| + |b| < 1, so the state stays bounded over any number of windows.
std::vector<WindowKernel> build_window(int64_t steps, int64_t kernels_per_step);

// Bytes a window's kernels move: each reads dst and src and writes dst.
double window_bytes(int64_t steps, int64_t kernels_per_step, int64_t elements);
// The empty kernel reads and writes its 8-byte launch counter.
inline constexpr double empty_kernel_bytes = 16;

// The learning rate of window `w` when it changes between windows (graph_update), and the fixed one
// the other variants use. Both are powers of two: exact in fp32.
float lr_for_window(int64_t window);
inline constexpr float fixed_lr = 0.125f;
inline float coefficient_b(const WindowKernel& k, float lr) { return k.takes_lr ? -lr : k.b; }

// One element of one kernel, the same on the device and in the reference: two correctly rounded
// fused multiply-adds, so the device result is bit-for-bit the reference's.
TB_HOST_DEVICE inline float update_element(float a, float dst, float b, float src, float c) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(a, dst, __fmaf_rn(b, src, c));
#else
  return std::fma(a, dst, std::fma(b, src, c));
#endif
}

// The state before the first window: state_buffers x elements, buffer-major.
std::vector<float> initial_state(int64_t elements);
// ---- reference: plain loops -------------------------------------------------------------------
// The state after `windows` windows; window w runs with lr_for_window(w) when `scheduled`, else
// with fixed_lr.
std::vector<float> reference_state(const std::vector<WindowKernel>& window, int64_t elements, int64_t windows,
                                   bool scheduled);
// Bit-exact comparison (the device does the same fused multiply-adds).
Verdict check_state(const std::vector<float>& got, const std::vector<float>& want, int64_t elements);

// ---- graph economics ----------------------------------------------------------------------------
// The launch overhead per kernel that a replay removes: (eager window - replayed window) / kernels.
double saving_per_kernel_s(double eager_window_s, double replay_window_s, int64_t kernels);
// How many replays pay back capturing and instantiating: the smallest n >= 1 with
// capture + n * replay <= n * eager. Infinite when a replay is not faster than the eager window.
double breakeven_replays(double capture_instantiate_s, double eager_window_s, double replay_window_s);

// ---- CUDA variants (launch_cuda.cu) ----------------------------------------------------------------
enum class Mode { eager, graph, graph_with_capture, graph_update };
std::unique_ptr<Instance> make_cuda_empty(const Problem&, const RunContext&, bool wait);
std::unique_ptr<Instance> make_cuda_window(const Problem&, const RunContext&, Mode mode);

}  // namespace tb::launch

// The window program of `launch`, its oracle (plain loops) and the graph break-even arithmetic.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "launch.h"

namespace tb::launch {

std::vector<WindowKernel> build_window(int64_t steps, int64_t kernels_per_step) {
  std::vector<WindowKernel> window;
  window.reserve(static_cast<std::size_t>(steps * kernels_per_step));
  for (int64_t s = 0; s < steps; ++s)
    for (int64_t k = 0; k < kernels_per_step; ++k) {
      WindowKernel w;
      w.step = s;
      w.index = k;
      w.dst = static_cast<int>(k % state_buffers);
      w.src = static_cast<int>((w.dst + 1 + s % (state_buffers - 1)) % state_buffers);  // never dst
      const auto g = static_cast<uint64_t>(3 * (s * kernels_per_step + k));
      w.a = uniform_at(seed_coefficients, g, 0.5f, 0.75f);
      w.b = uniform_at(seed_coefficients, g + 1, -0.125f, 0.125f);
      w.c = uniform_at(seed_coefficients, g + 2, -0.5f, 0.5f);
      w.takes_lr = k == kernels_per_step - 1;
      window.push_back(w);
    }
  return window;
}

double window_bytes(int64_t steps, int64_t kernels_per_step, int64_t elements) {
  return static_cast<double>(steps) * static_cast<double>(kernels_per_step) * 3.0 * sizeof(float) *
         static_cast<double>(elements);
}

float lr_for_window(int64_t window) { return window % 2 == 0 ? fixed_lr : fixed_lr / 2; }

std::vector<float> initial_state(int64_t elements) {
  std::vector<float> state(static_cast<std::size_t>(state_buffers * elements));
  for (std::size_t i = 0; i < state.size(); ++i) state[i] = uniform_at(seed_state, i);
  return state;
}

std::vector<float> reference_state(const std::vector<WindowKernel>& window, int64_t elements, int64_t windows,
                                   bool scheduled) {
  std::vector<float> state = initial_state(elements);
  for (int64_t w = 0; w < windows; ++w) {
    const float lr = scheduled ? lr_for_window(w) : fixed_lr;
    for (const WindowKernel& k : window) {
      float* dst = state.data() + k.dst * elements;
      const float* src = state.data() + k.src * elements;
      const float b = coefficient_b(k, lr);
      for (int64_t i = 0; i < elements; ++i) dst[i] = update_element(k.a, dst[i], b, src[i], k.c);
    }
  }
  return state;
}

Verdict check_state(const std::vector<float>& got, const std::vector<float>& want, int64_t elements) {
  if (got.size() != want.size())
    return Verdict{false, INFINITY,
                   "state has " + std::to_string(got.size()) + " values, reference " + std::to_string(want.size())};
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {  // NaN fails too
      std::ostringstream msg;
      msg.precision(9);
      msg << "state buffer " << static_cast<int64_t>(i) / elements << "[" << static_cast<int64_t>(i) % elements
          << "] = " << got[i] << ", reference " << want[i];
      return Verdict{false, std::isfinite(got[i]) ? std::abs(static_cast<double>(got[i]) - want[i]) : INFINITY, msg.str()};
    }
  }
  return Verdict{true, 0.0, ""};
}

double saving_per_kernel_s(double eager_window_s, double replay_window_s, int64_t kernels) {
  return kernels > 0 ? (eager_window_s - replay_window_s) / static_cast<double>(kernels) : 0.0;
}

double breakeven_replays(double capture_instantiate_s, double eager_window_s, double replay_window_s) {
  const double saving = eager_window_s - replay_window_s;
  if (!(saving > 0)) return std::numeric_limits<double>::infinity();
  return std::max(1.0, std::ceil(capture_instantiate_s / saving));
}

}  // namespace tb::launch

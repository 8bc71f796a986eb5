// GELU's tanh approximation, the one GPT-2 and PyTorch's approximate='tanh' use:
// gelu(x) = 0.5 x (1 + tanh(scale (x + cubic x^3))). One definition for the CPU and CUDA step (and layers/,
// whose GELU the attention stage's block runs too) and the double references (constexpr: usable in device code too).
#pragma once

namespace tb::gelu {
inline constexpr double scale = 0.7978845608028654;  // sqrt(2 / pi)
inline constexpr double cubic = 0.044715;
// The argument of tanh: scale (x + cubic x^3), in T's precision.
template <class T>
constexpr T inner(T x) {
  return static_cast<T>(scale) * (x + static_cast<T>(cubic) * x * x * x);
}
}  // namespace tb::gelu

// The optimizer of the training step: AdamW with PyTorch's semantics, three ways (the pairs of the
// adamw stage), and gradient clipping by the global norm with the factor kept on the backend.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "runtime/error.h"

namespace tb::step {

enum class OptimizerKind { per_tensor, foreach, fused };

inline OptimizerKind optimizer_kind(const std::string& name) {
  if (name == "per_tensor") return OptimizerKind::per_tensor;
  if (name == "foreach") return OptimizerKind::foreach;
  if (name == "fused") return OptimizerKind::fused;
  throw UsageError("unknown optimizer variant '" + name + "' (per_tensor, foreach, fused)");
}

struct TensorSpan {
  int64_t offset, size;
};

// The scalars of AdamW step `step` (1 for the first), as torch.optim.AdamW computes them.
struct AdamwScalars {
  double lr, beta1, beta2, eps, weight_decay;
  double step_size;              // lr / (1 - beta1^step)
  double bias_correction2_sqrt;  // sqrt(1 - beta2^step)
  static AdamwScalars at(double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step) {
    const double t = static_cast<double>(step);
    return AdamwScalars{lr, beta1, beta2, eps, weight_decay, lr / (1.0 - std::pow(beta1, t)),
                        std::sqrt(1.0 - std::pow(beta2, t))};
  }
};

// clip_grad_norm_'s factor: min(1, max_norm / (norm + clip_norm_eps)); 1 when clipping is off.
inline constexpr double clip_norm_eps = 1e-6;
template <class T>
inline T clip_factor(T norm, double max_norm) {
  if (max_norm <= 0) return T(1);
  const double f = max_norm / (static_cast<double>(norm) + clip_norm_eps);
  return static_cast<T>(f < 1.0 ? f : 1.0);
}

}  // namespace tb::step

// The optimizer of the training step: the adamw stage's three AdamW variants, and clipping by the
// global norm the gradnorm stage's way (kernels/adamw, kernels/gradnorm).
#pragma once

#include <cstdint>
#include <string>

#include "runtime/defaults.h"
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

// clip_grad_norm_'s max_norm / (norm + clip_norm_eps), fixed in PyTorch (the gradnorm stage's).
inline constexpr double clip_norm_eps = defaults::clip_norm_eps;

}  // namespace tb::step

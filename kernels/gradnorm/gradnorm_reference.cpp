// The oracle for `gradnorm`: torch.nn.utils.clip_grad_norm_ element by element, the norm in double;
// plus the launch and read counts every variant shares.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "gradnorm.h"
#include "runtime/defaults.h"
#include "runtime/random.h"
#include "runtime/tolerance.h"

namespace tb::gradnorm {

int64_t cuda_launches(const ParamSet& set, Kind kind) {
  // per tensor: a norm kernel and a scale kernel; otherwise one multi-tensor norm and one scale
  return kind == Kind::per_tensor ? 2 * set.nonempty() : 2;
}

int64_t cuda_host_reads(const ParamSet& set, Kind kind) {
  switch (kind) {
    case Kind::per_tensor:
      return set.nonempty();
    case Kind::multi_tensor:
      return 1;
    case Kind::fused:
      return 0;
  }
  return 0;
}

int64_t cpu_passes(const ParamSet& set, Kind kind) {
  switch (kind) {
    case Kind::per_tensor:
      return 2 * set.nonempty();
    case Kind::multi_tensor:
      return 2;
    case Kind::fused:
      return 1;  // one parallel region: reduce, barrier, scale
  }
  return 0;
}

double reference_clip(double* grad, int64_t n, double max_norm) {
  double sum_sq = 0;
  for (int64_t i = 0; i < n; ++i) sum_sq += grad[i] * grad[i];
  const double norm = std::sqrt(sum_sq);
  if (max_norm > 0) {
    const double coef = std::min(max_norm / (norm + defaults::clip_norm_eps), 1.0);
    for (int64_t i = 0; i < n; ++i) grad[i] *= coef;
  }
  return norm;
}

HostGrads reference_grads(const ParamSet& set, Dtype dtype, int64_t calls) {
  HostGrads out;
  out.grad.resize(static_cast<std::size_t>(set.total));
  for (int64_t i = 0; i < set.total; ++i) out.grad[i] = adamw::initial_value(adamw::seed_grad, i, dtype);
  for (int64_t c = 0; c < calls; ++c) {
    double sum_sq = 0;
    for (const float g : out.grad) sum_sq += static_cast<double>(g) * g;
    out.norm = std::sqrt(sum_sq);
    const double coef = std::min(defaults::clip_max_norm / (out.norm + defaults::clip_norm_eps), 1.0);
    for (float& g : out.grad) {
      const auto scaled = static_cast<float>(g * coef);
      g = dtype == Dtype::bf16 ? round_to_bf16(scaled) : scaled;
    }
  }
  return out;
}

Verdict check_grads(const ParamSet& set, Dtype dtype, int64_t calls, const HostGrads& got) {
  if (got.grad.size() != static_cast<std::size_t>(set.total))
    return Verdict{false, INFINITY,
                   "gradients have the wrong number of elements (expected " + std::to_string(set.total) + ")"};
  const HostGrads want = reference_grads(set, dtype, calls);
  std::ostringstream msg;
  msg.precision(9);
  if (!tolerance::fp32.accepts(got.norm, want.norm)) {
    msg << "total norm = " << got.norm << ", reference " << want.norm << " (call " << calls << ")";
    return Verdict{false, std::abs(got.norm - want.norm), msg.str()};
  }
  double scale = 0;
  for (const float g : want.grad) scale = std::max(scale, static_cast<double>(std::abs(g)));
  const Tolerance dtype_tol = dtype == Dtype::bf16 ? tolerance::bf16 : tolerance::fp32;
  const Tolerance tol{dtype_tol.atol * scale, dtype_tol.rtol};
  double worst = std::abs(got.norm - want.norm);
  for (int64_t t = 0; t < set.count(); ++t)
    for (int64_t j = 0; j < set.sizes[t]; ++j) {
      const auto i = static_cast<std::size_t>(set.starts[t] + j);
      const double g = got.grad[i], w = want.grad[i];
      worst = std::max(worst, std::isfinite(g) ? std::abs(g - w) : INFINITY);
      if (!tol.accepts(g, w)) {
        msg << "grad of tensor " << t << " (" << set.sizes[t] << " elements) [" << j << "] = " << g << ", reference " << w
            << " after " << calls << " call(s), " << adamw::to_string(dtype);
        return Verdict{false, worst, msg.str()};
      }
    }
  return Verdict{true, worst, ""};
}

}  // namespace tb::gradnorm

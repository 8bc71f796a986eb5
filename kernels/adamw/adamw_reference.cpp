// The oracle for `adamw`: AdamW element by element in double, PyTorch's formula, from the
// deterministic start; plus the per-step constants and the launch counts every variant shares.
#include <cmath>
#include <sstream>

#include "adamw.h"
#include "runtime/defaults.h"
#include "runtime/random.h"
#include "runtime/tolerance.h"

namespace tb::adamw {

Hyper stage_hyper() {
  using namespace defaults;
  return Hyper{adamw_lr, adamw_beta1, adamw_beta2, adamw_eps, adamw_weight_decay};
}

StepScalars step_scalars(int64_t step) { return step_scalars(stage_hyper(), step); }

StepScalars step_scalars(const Hyper& h, int64_t step) {
  const double s = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, s);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, s);
  StepScalars out{};
  out.lr = static_cast<float>(h.lr);
  out.beta1 = static_cast<float>(h.beta1);
  out.beta2 = static_cast<float>(h.beta2);
  out.eps = static_cast<float>(h.eps);
  out.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  out.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  out.decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  out.lr_weight_decay = static_cast<float>(h.lr * h.weight_decay);
  out.step_size = static_cast<float>(h.lr / bias_correction1);
  out.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  return out;
}

void reference_step(int64_t n, double* param, const double* grad, double* exp_avg, double* exp_avg_sq, const Hyper& h,
                    int64_t step) {
  const double s = static_cast<double>(step);
  const double step_size = h.lr / (1.0 - std::pow(h.beta1, s)), bc2_sqrt = std::sqrt(1.0 - std::pow(h.beta2, s));
  for (int64_t i = 0; i < n; ++i) {
    param[i] -= h.lr * h.weight_decay * param[i];  // decoupled weight decay
    exp_avg[i] = h.beta1 * exp_avg[i] + (1.0 - h.beta1) * grad[i];
    exp_avg_sq[i] = h.beta2 * exp_avg_sq[i] + (1.0 - h.beta2) * grad[i] * grad[i];
    param[i] -= step_size * exp_avg[i] / (std::sqrt(exp_avg_sq[i]) / bc2_sqrt + h.eps);
  }
}

int64_t cuda_launches(const ParamSet& set, Kind kind) {
  switch (kind) {
    case Kind::per_tensor:
      return op_count * set.nonempty();
    case Kind::foreach: {
      int64_t launches = 0;
      for (const int depth : op_depth)
        launches += static_cast<int64_t>(
            plan_list_launches(set, list_max_tensors[depth - 1], list_max_blocks, list_chunk).size());
      return launches;
    }
    case Kind::fused:
      return 1;
  }
  return 0;
}

int64_t cpu_passes(const ParamSet& set, Kind kind) {
  switch (kind) {
    case Kind::per_tensor:
      return op_count * set.nonempty();
    case Kind::foreach:
      return op_count;
    case Kind::fused:
      return 1;
  }
  return 0;
}

HostState reference_state(const ParamSet& set, Dtype dtype, int64_t steps) {
  using namespace defaults;
  HostState out;
  const auto n = static_cast<std::size_t>(set.total);
  out.param.resize(n);
  out.exp_avg.resize(n);
  out.exp_avg_sq.resize(n);
  std::vector<double> step_size(static_cast<std::size_t>(steps) + 1), bc2_sqrt(static_cast<std::size_t>(steps) + 1);
  for (int64_t s = 1; s <= steps; ++s) {
    step_size[s] = adamw_lr / (1.0 - std::pow(adamw_beta1, static_cast<double>(s)));
    bc2_sqrt[s] = std::sqrt(1.0 - std::pow(adamw_beta2, static_cast<double>(s)));
  }
  for (int64_t i = 0; i < set.total; ++i) {
    double param = initial_value(seed_param, i, dtype);
    const double grad = initial_value(seed_grad, i, dtype);
    double exp_avg = 0, exp_avg_sq = 0;
    for (int64_t s = 1; s <= steps; ++s) {
      param -= adamw_lr * adamw_weight_decay * param;  // decoupled weight decay
      exp_avg = adamw_beta1 * exp_avg + (1.0 - adamw_beta1) * grad;
      exp_avg_sq = adamw_beta2 * exp_avg_sq + (1.0 - adamw_beta2) * grad * grad;
      const double denom = std::sqrt(exp_avg_sq) / bc2_sqrt[s] + adamw_eps;
      param -= step_size[s] * exp_avg / denom;
      // What the buffers hold between steps.
      const float stored = static_cast<float>(param);
      param = dtype == Dtype::bf16 ? round_to_bf16(stored) : stored;
      exp_avg = static_cast<float>(exp_avg);
      exp_avg_sq = static_cast<float>(exp_avg_sq);
    }
    out.param[i] = static_cast<float>(param);
    out.exp_avg[i] = static_cast<float>(exp_avg);
    out.exp_avg_sq[i] = static_cast<float>(exp_avg_sq);
  }
  return out;
}

Verdict check_state(const ParamSet& set, Dtype dtype, int64_t steps, const HostState& got) {
  const auto n = static_cast<std::size_t>(set.total);
  if (got.param.size() != n || got.exp_avg.size() != n || got.exp_avg_sq.size() != n)
    return Verdict{false, INFINITY, "state has the wrong number of elements (expected " + std::to_string(n) + ")"};
  const HostState want = reference_state(set, dtype, steps);
  const Tolerance param_tol = dtype == Dtype::bf16 ? tolerance::bf16 : tolerance::fp32;
  struct Field {
    const char* name;
    const std::vector<float>& got;
    const std::vector<float>& want;
    Tolerance tol;
  };
  const Field fields[] = {{"param", got.param, want.param, param_tol},
                          {"exp_avg", got.exp_avg, want.exp_avg, tolerance::fp32},
                          {"exp_avg_sq", got.exp_avg_sq, want.exp_avg_sq, tolerance::fp32}};
  double worst = 0;
  for (int64_t t = 0; t < set.count(); ++t)
    for (int64_t j = 0; j < set.sizes[t]; ++j) {
      const auto i = static_cast<std::size_t>(set.starts[t] + j);
      for (const Field& f : fields) {
        const double g = f.got[i], w = f.want[i];
        worst = std::max(worst, std::isfinite(g) ? std::abs(g - w) : INFINITY);
        if (!f.tol.accepts(g, w)) {
          std::ostringstream msg;
          msg.precision(9);
          msg << f.name << " of tensor " << t << " (" << set.sizes[t] << " elements) [" << j << "] = " << g << ", reference "
              << w << " after " << steps << " step(s), " << to_string(dtype);
          return Verdict{false, worst, msg.str()};
        }
      }
    }
  return Verdict{true, worst, ""};
}

}  // namespace tb::adamw

#include <cmath>
#include <sstream>

#include "step/cpu_ops.h"
#include "step/step.h"
#include "step/trainer.h"
#include "runtime/tolerance.h"

namespace tb::step {

std::vector<double> reference_losses(const Workload& w, int32_t sample) {
  CpuOps<double> ops;
  Switches plain;  // no checkpointing, no lazy gate: the plain definition of the forward
  plain.lazy_cg = false;
  PropagatorSpec prop = w.propagator;
  prop.cg_tol = std::min(prop.cg_tol, 1e-10);
  Model<CpuOps<double>> model(ops, w.model, prop, plain, 1);
  const int64_t Tn = w.model.seq_len;
  const std::vector<int32_t> data = make_dataset(w.data.samples, Tn, w.model.vocab);
  std::vector<int32_t> tokens(data.begin() + sample * (Tn + 1), data.begin() + sample * (Tn + 1) + Tn);
  std::vector<int32_t> targets(data.begin() + sample * (Tn + 1) + 1, data.begin() + (sample + 1) * (Tn + 1));
  tokens.insert(tokens.end(), targets.begin(), targets.end());
  model.forward(tokens.data(), tokens.data() + Tn);
  return std::vector<double>(model.losses(), model.losses() + Tn);
}

Verdict check_first_losses(const Workload& w, int32_t sample, const std::vector<double>& got, bool bf16) {
  const std::vector<double> want = reference_losses(w, sample);
  const Tolerance tol = bf16 ? tolerance::step_bf16 : tolerance::step_fp32;
  double worst = 0;
  for (std::size_t t = 0; t < want.size(); ++t) {
    worst = std::max(worst, std::abs(got.at(t) - want[t]));
    if (!tol.accepts(got[t], want[t])) {
      std::ostringstream msg;
      msg.precision(8);
      msg << "loss of token " << t << " of sample " << sample << " = " << got[t] << ", double reference " << want[t];
      return Verdict{false, worst, msg.str()};
    }
  }
  return Verdict{true, worst, ""};
}

double step_flops(const Workload& w) {
  const double tokens = static_cast<double>(w.batch.global * w.model.seq_len);
  const double Tn = static_cast<double>(w.model.seq_len), C = static_cast<double>(w.model.d_model);
  const double attention = 12.0 * static_cast<double>(w.model.layers) * static_cast<double>(w.batch.global) * Tn * Tn * C /
                           2;
  return 6.0 * static_cast<double>(w.parameter_count()) * tokens + attention;
}

}  // namespace tb::step

#include "step/resolved.h"

#include "runtime/defaults.h"
#include "step/model.h"
#include "step/optimizer.h"
#include "step/trainer.h"

namespace tb::step {

nlohmann::ordered_json resolved_workload(const Workload& w) {
  using ordered = nlohmann::ordered_json;
  const auto& m = w.model;
  const auto& p = w.propagator;
  const auto& o = w.optimizer;
  ordered workload{
      {"name", w.name},
      {"source", w.source},
      {"path", w.path},
      {"model",
       {{"layers", m.layers},
        {"d_model", m.d_model},
        {"heads", m.heads},
        {"seq_len", m.seq_len},
        {"vocab", m.vocab},
        {"mlp_ratio", m.mlp_ratio}}},
      {"propagator",
       {{"enabled", p.enabled},
        {"sparsity", p.sparsity},
        {"alpha", p.alpha},
        {"cg_tol", p.cg_tol},
        {"lazy_tol", p.lazy_tol},
        {"max_iters", p.max_iters}}},
      {"optimizer",
       {{"variant", o.variant},
        {"lr", o.lr},
        {"weight_decay", o.weight_decay},
        {"betas", {o.beta1, o.beta2}},
        {"eps", o.eps},
        {"grad_clip", o.grad_clip}}},
      {"data", {{"samples", w.data.samples}, {"location", w.data.location}, {"per_sample_copy", w.data.per_sample_copy}}},
      {"batch",
       {{"global", w.batch.global},
        {"micro", w.batch.micro},
        {"accumulation", w.batch.accumulation()},
        {"global_range", {w.batch.global_min, w.batch.global_max}}}},
      {"logging", {{"sync", w.logging.sync}, {"interval", w.logging.interval}}},
      {"switches",
       {{"attention", w.switches.fused_attention ? "fused" : "naive"},
        {"cuda_graphs", w.switches.cuda_graphs},
        {"activation_checkpointing", w.switches.activation_checkpointing},
        {"bf16_matmuls", w.switches.bf16_matmuls},
        {"lazy_cg", w.switches.lazy_cg}}},
  };
  return ordered{{"schema", kResolvedSchema},
                 {"workload", workload},
                 {"constants",
                  {{"seed_params", seed_params},
                   {"seed_data", seed_data},
                   {"layernorm_eps", defaults::layernorm_eps},
                   {"clip_norm_eps", clip_norm_eps}}}};
}

}  // namespace tb::step

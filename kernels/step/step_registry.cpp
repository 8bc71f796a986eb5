// Stage `step`. Workloads are presets in tuner/workloads/ (from the reports) or a user's YAML file.
#include <algorithm>

#include "attention/attention.h"
#include "runtime/device_info.h"
#include "runtime/error.h"
#include "runtime/registry.h"
#include "step/step.h"

namespace tb {

namespace {

using namespace step;

std::string workload_reason(const std::string& value) {
  try {
    load_workload(value);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

Work step_work(const Problem& p, const char* axis, Backend backend) {
  const Workload w = load_workload(p.get(axis));
  Work work;
  work.flops = step_flops(w);
  work.bytes = 16.0 * static_cast<double>(w.parameter_count());  // the optimizer's own traffic
  work.bound = Work::Bound::compute;
  work.peak_key = backend == Backend::cpu ? "cpu.gemm_fp32"
                                          : (w.switches.bf16_matmuls ? "cuda.gemm_bf16" : "cuda.gemm_fp32");
  work.counters = {{"samples_per_call", static_cast<double>(w.batch.global)},
                   {"accumulation", static_cast<double>(w.batch.accumulation())},
                   {"params_m", static_cast<double>(w.parameter_count()) / 1e6}};
  return work;
}

}  // namespace

namespace step {
// Parameters, gradients and two moments in fp32, the activations kept for backward (one layer's
// with checkpointing), the logits, probabilities and their gradient. Attention keeps P [B, NH, T, T]
// per layer, plus dP for the layer in backward (naive), or one log-sum-exp per row (fused): fused
// attention frees the only activation that grows with T^2. bf16 fused attention (CUDA) adds one
// workspace: bf16 Q, K, V, O, dO and the backward's dQ accumulator and delta. bf16 matmuls keep bf16
// copies of their operands.
double estimate_bytes(const Workload& w) {
  const double N = static_cast<double>(w.batch.micro * w.model.seq_len), C = static_cast<double>(w.model.d_model);
  const double H = static_cast<double>(w.model.mlp_ratio) * C, V = static_cast<double>(w.model.vocab);
  const double att = static_cast<double>(w.batch.micro * w.model.heads) * static_cast<double>(w.model.seq_len) *
                     (w.switches.fused_attention ? 1.0 : static_cast<double>(w.model.seq_len));
  const double layer = N * (9 * C + 2 * H + 4) + att;
  const double layers = w.switches.activation_checkpointing ? 1.0 : static_cast<double>(w.model.layers);
  const double floats = 4.0 * static_cast<double>(w.parameter_count()) + layers * layer + layer +
                        static_cast<double>(w.model.layers + 1) * N * C + 3 * N * V +
                        (w.propagator.enabled ? 8 * N * C : 0) +
                        (w.switches.bf16_matmuls && w.switches.fused_attention ? 3.5 * N * C + att : 0);
  // bf16 matmuls: the bf16 copies of each product's input and weight kept for its backward, and of
  // the largest output gradient (2 bytes: half a float each).
  const double kept_bf16 = layers * N * (3 * C + H) + N * C + static_cast<double>(w.parameter_count()) +
                           N * std::max({V, H, 3 * C});
  return 4.0 * (floats + (w.switches.bf16_matmuls ? 0.5 * kept_bf16 : 0));
}

std::string unsupported_reason(const Workload& w, bool cuda) {
  if (!cuda && w.switches.bf16_matmuls) return "bf16 matmuls are a CUDA switch";
  if (!cuda && w.switches.cuda_graphs) return "CUDA graphs need the CUDA backend";
  if (w.switches.cuda_graphs && w.propagator.enabled)
    return "CUDA graphs need a step of fixed length; the host-checked CG of the propagator is not";
  if (const int64_t head_dim = w.model.d_model / w.model.heads;
      cuda && w.switches.fused_attention && head_dim > attention::cuda_fused_backward_max_head_dim)
    return "fused attention on CUDA trains heads of at most " + std::to_string(attention::cuda_fused_backward_max_head_dim) +
           " dims, this model's have " + std::to_string(head_dim) + ": set switches: {attention: naive}";
  const double bytes = estimate_bytes(w);
  return cuda ? device_memory_reason(bytes) : host_memory_reason(bytes);
}

#ifndef TRAINBENCH_HAVE_CUDA
// Built without CUDA: callers (autotune's trials) reach this only past a session that would have
// refused first, but the symbol must exist for them to link.
std::unique_ptr<StepInstance> make_cuda_step(const Workload&, const RunContext&) {
  throw CallError(__FILE__, __LINE__, "make_cuda_step", "trainbench was built without the CUDA backend");
}
#endif
}  // namespace step

void register_stage_step(Registry& registry) {
  Stage s;
  s.name = "step";
  s.question = "one whole training step of a workload: samples/s, where the time goes, peak memory";
  s.source = "all reports (tuner/workloads/*.yaml cite theirs)";
  s.axes = {
      Axis{"cpu_workload",
           AxisKind::text,
           {"small_gpt"},
           {"tiny"},
           "a preset or a workload .yaml, on the CPU",
           {},
           workload_reason},
      Axis{"workload",
           AxisKind::text,
           {"sem_v55", "t4_transformer", "small_gpt", "trainer2_window", "energy_flow_bridge"},
           {"tiny", "small_gpt"},
           "a preset or a workload .yaml, on the GPU",
           {},
           workload_reason},
  };
  s.variants = {
      Variant{"train",
              Backend::cpu,
              "forward, backward, accumulation, clipping and AdamW with the workload's policies",
              {"cpu_workload"},
              [](const Problem& p) { return step_work(p, "cpu_workload", Backend::cpu); },
              [](const Problem& p) { return unsupported_reason(load_workload(p.get("cpu_workload")), false); },
              [](const Problem& p, const RunContext&) { return make_cpu_step(load_workload(p.get("cpu_workload"))); }},
      Variant{"train",
              Backend::cuda,
              "the same step on the GPU: cuBLAS matrix products, device-side clipping",
              {"workload"},
              [](const Problem& p) { return step_work(p, "workload", Backend::cuda); },
              [](const Problem& p) { return unsupported_reason(load_workload(p.get("workload")), true); },
              cuda_factory([](const Problem& p, const RunContext& c) {
                return make_cuda_step(load_workload(p.get("workload")), c);
              })},
  };
  registry.add(std::move(s));
}

}  // namespace tb

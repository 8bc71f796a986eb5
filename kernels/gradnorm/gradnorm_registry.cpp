// Stage `gradnorm`: sizes and max_norm in runtime/defaults.h; the parameter set is adamw's.
#include <string>

#include "gradnorm.h"
#include "runtime/defaults.h"

namespace tb {

namespace {

using gradnorm::Kind;

std::string str(int64_t v) { return std::to_string(v); }

constexpr int64_t max_tensors = 1000000;

// Effective bandwidth: the minimal traffic of a norm and a clip, one read of every gradient for the
// norm and one read and one write for the scale, whatever the variant does on top.
Work gradnorm_work(const Problem& p, Backend backend, Kind kind) {
  const adamw::ParamSet set = adamw::make_param_set(p.get_int("params"), p.get_int("tensors"));
  const double eb = adamw::element_bytes(adamw::dtype_from_string(p.get("dtype")));
  const double n = static_cast<double>(set.total);
  Work w{3 * eb * n, 3 * n, Work::Bound::memory, backend == Backend::cuda ? "cuda.copy" : "cpu.memory"};
  w.footprint_bytes = eb * n;  // the gradients
  if (backend == Backend::cuda)
    w.counters = {{"launches", static_cast<double>(gradnorm::cuda_launches(set, kind))},
                  {"host_reads", static_cast<double>(gradnorm::cuda_host_reads(set, kind))},
                  {"tensors", static_cast<double>(set.count())}};
  else
    w.counters = {{"launches", static_cast<double>(gradnorm::cpu_passes(set, kind))},
                  {"tensors", static_cast<double>(set.count())}};
  return w;
}

std::string gradnorm_unsupported(const Problem& p, Backend backend) {
  if (p.get_int("tensors") > max_tensors) return "tensors above " + str(max_tensors);
  const adamw::ParamSet set = adamw::make_param_set(p.get_int("params"), p.get_int("tensors"));
  const double eb = adamw::element_bytes(adamw::dtype_from_string(p.get("dtype")));
  const double buffers = eb * static_cast<double>(set.arena);
  const double check = 8.0 * static_cast<double>(set.total);  // the gradients and the reference's, as float
  if (backend == Backend::cpu) return adamw::memory_reason(Backend::cpu, buffers + check);
  const std::string host = adamw::memory_reason(Backend::cpu, check + 4.0 * static_cast<double>(set.arena));
  return host.empty() ? adamw::memory_reason(Backend::cuda, buffers) : host;
}

Variant variant(Backend backend, Kind kind, const char* id, const char* rationale) {
  Variant v;
  v.id = id;
  v.backend = backend;
  v.rationale = rationale;
  v.axes = {"params", "tensors", "dtype"};
  v.work = [backend, kind](const Problem& p) { return gradnorm_work(p, backend, kind); };
  v.unsupported = [backend](const Problem& p) { return gradnorm_unsupported(p, backend); };
  if (backend == Backend::cpu)
    v.make = [kind](const Problem& p, const RunContext& c) { return gradnorm::make_cpu(p, c, kind); };
  else v.make = cuda_factory([kind](const Problem& p, const RunContext& c) { return gradnorm::make_cuda(p, c, kind); });
  return v;
}

}  // namespace

void register_stage_gradnorm(Registry& registry) {
  Stage s;
  s.name = "gradnorm";
  s.question = "what a per-tensor norm with a host read each costs against one multi-tensor norm, and clipping with no read";
  s.source =
      "docs/sources.md#003-t4-transformer (K-1: p.grad.norm().item() per node; clip_grad_norm_(max_norm=1.0)); 29.9M "
      "params: docs/sources.md#000-sem-v55";
  s.axes = {
      Axis{"params",
           AxisKind::positive_int,
           {str(defaults::adamw_params)},
           {str(defaults::quick_gradnorm_params)},
           "gradient elements (all tensors together)",
           {}},
      Axis{"tensors",
           AxisKind::positive_int,
           {str(defaults::adamw_tensors)},
           {str(defaults::quick_adamw_tensors)},
           "tensors the gradients are split into (the adamw stage's parameter set)",
           {}},
      Axis{"dtype",
           AxisKind::choice,
           {"fp32", "bf16"},
           {"fp32", "bf16"},
           "gradients: fp32 or bf16 (fp32 norm)",
           {"fp32", "bf16"}},
  };
  s.variants = {
      variant(Backend::cpu, Kind::per_tensor, "per_tensor",
              "a norm per tensor, then a scale per tensor, each parallel above PyTorch's grain"),
      variant(Backend::cpu, Kind::multi_tensor, "multi_tensor",
              "one parallel reduction over every tensor's chunks, then one parallel scale"),
      variant(Backend::cpu, Kind::fused, "fused",
              "reduction and scale in one parallel region: per-thread partials, a barrier, no second fork"),
      variant(Backend::cuda, Kind::per_tensor, "per_tensor",
              "K-1: per tensor a norm kernel and .item() (4-byte D2H + sync), then a scale kernel per tensor"),
      variant(Backend::cuda, Kind::multi_tensor, "multi_tensor",
              "one multi-tensor two-stage norm, one read by the host, one multi-tensor scale"),
      variant(Backend::cuda, Kind::fused, "fused",
              "multi-tensor norm, then a scale kernel that computes the clip factor on the device: no host read"),
  };
  s.pairs = {
      Pair{"per_tensor", "fused", "gradnorm: fused vs per-tensor"},
      Pair{"multi_tensor", "fused", "gradnorm: fused (no read) vs multi-tensor (one read)"},
  };
  registry.add(std::move(s));
}

}  // namespace tb

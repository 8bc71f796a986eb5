// Stage `adamw`: sizes and hyper-parameters in runtime/defaults.h.
#include <string>

#include "adamw.h"
#include "runtime/defaults.h"

namespace tb {

namespace {

using adamw::Kind;

std::string str(int64_t v) { return std::to_string(v); }

// Beyond this the per-tensor variants are a benchmark of the launch queue alone.
constexpr int64_t max_tensors = 1000000;

// Effective bandwidth: every variant is credited with the minimal traffic, that of one fused pass
// (read param, grad, exp_avg, exp_avg_sq; write param, exp_avg, exp_avg_sq): 28 B per fp32
// parameter, 22 B per bf16 one. The passes the other variants make on top are what they lose.
Work adamw_work(const Problem& p, Backend backend, Kind kind) {
  const adamw::ParamSet set = adamw::make_param_set(p.get_int("params"), p.get_int("tensors"));
  const double eb = adamw::element_bytes(adamw::dtype_from_string(p.get("dtype")));
  const double n = static_cast<double>(set.total);
  Work w{(3 * eb + 16) * n, 15 * n, Work::Bound::memory, backend == Backend::cuda ? "cuda.copy" : "cpu.memory"};
  w.footprint_bytes = (2 * eb + 8) * n;  // params and grads, and the two fp32 moments
  const int64_t launches = backend == Backend::cuda ? adamw::cuda_launches(set, kind) : adamw::cpu_passes(set, kind);
  w.counters = {{"launches", static_cast<double>(launches)}, {"tensors", static_cast<double>(set.count())}};
  return w;
}

std::string adamw_unsupported(const Problem& p, Backend backend, Kind kind) {
  if (p.get_int("tensors") > max_tensors) return "tensors above " + str(max_tensors);
  const adamw::ParamSet set = adamw::make_param_set(p.get_int("params"), p.get_int("tensors"));
  const double eb = adamw::element_bytes(adamw::dtype_from_string(p.get("dtype")));
  const double arena = static_cast<double>(set.arena);
  const double temporaries = kind == Kind::per_tensor ? 2.0 * static_cast<double>(set.largest())
                             : kind == Kind::foreach  ? arena
                                                      : 0.0;
  const double buffers = arena * (2 * eb + 8) + 4 * temporaries;
  const double check = 24.0 * static_cast<double>(set.total);  // the state and the reference's, as float
  if (backend == Backend::cpu) return adamw::memory_reason(Backend::cpu, buffers + check);
  const std::string host = adamw::memory_reason(Backend::cpu, check + 4 * arena);
  return host.empty() ? adamw::memory_reason(Backend::cuda, buffers) : host;
}

Variant variant(Backend backend, Kind kind, const char* id, const char* rationale) {
  Variant v;
  v.id = id;
  v.backend = backend;
  v.rationale = rationale;
  v.axes = {"params", "tensors", "dtype"};
  v.work = [backend, kind](const Problem& p) { return adamw_work(p, backend, kind); };
  v.unsupported = [backend, kind](const Problem& p) { return adamw_unsupported(p, backend, kind); };
  if (backend == Backend::cpu)
    v.make = [kind](const Problem& p, const RunContext& c) { return adamw::make_cpu(p, c, kind); };
  else v.make = cuda_factory([kind](const Problem& p, const RunContext& c) { return adamw::make_cuda(p, c, kind); });
  return v;
}

}  // namespace

void register_stage_adamw(Registry& registry) {
  Stage s;
  s.name = "adamw";
  s.question = "what fusing the optimizer buys at 29.9M params in ~200 tensors: per-tensor ops, foreach lists, one pass";
  s.source =
      "docs/sources.md#004-small-gpt (AdamW 27.5% of the step, in addcmul_/addcdiv_), docs/sources.md#003-t4-transformer; "
      "29.9M params: docs/sources.md#000-sem-v55";
  s.axes = {
      Axis{"params",
           AxisKind::positive_int,
           {str(defaults::adamw_params)},
           {str(defaults::quick_adamw_params)},
           "parameters in the set (all tensors together)",
           {}},
      Axis{"tensors",
           AxisKind::positive_int,
           {str(defaults::adamw_tensors)},
           {str(defaults::quick_adamw_tensors)},
           "tensors the parameters are split into (embedding, layers' weights, biases, norm scales)",
           {}},
      Axis{"dtype",
           AxisKind::choice,
           {"fp32", "bf16"},
           {"fp32", "bf16"},
           "parameters and gradients: fp32, or bf16 with fp32 optimizer state",
           {"fp32", "bf16"}},
  };
  s.variants = {
      variant(Backend::cpu, Kind::per_tensor, "per_tensor",
              "PyTorch's for-loop AdamW: 8 elementwise passes per tensor (mul_, lerp_, mul_, addcmul_, sqrt, div_, "
              "add_, addcdiv_), parallel above the grain"),
      variant(Backend::cpu, Kind::foreach, "foreach",
              "the same 8 passes, each one parallel loop over every tensor's chunks (foreach lists)"),
      variant(Backend::cpu, Kind::fused, "fused",
              "one OpenMP loop over all chunks in AVX-512/AVX2 vectors, prefetched: read p, g, m, v and write p, m, v "
              "once (28 B/param)"),
      variant(Backend::cuda, Kind::per_tensor, "per_tensor",
              "PyTorch's for-loop AdamW: one kernel per elementwise op per tensor (8 x tensors launches)"),
      variant(Backend::cuda, Kind::foreach, "foreach",
              "multi_tensor_apply: each of the 8 ops over chunked tensor lists in kernel parameters"),
      variant(Backend::cuda, Kind::fused, "fused",
              "one multi-tensor kernel, one launch: a device chunk table, 16-byte loads, 28 B/param"),
  };
  s.pairs = {
      Pair{"per_tensor", "fused", "AdamW: fused vs per-tensor"},
      Pair{"foreach", "fused", "AdamW: fused vs foreach"},
      Pair{"per_tensor", "foreach", "AdamW: foreach vs per-tensor"},
  };
  registry.add(std::move(s));
}

}  // namespace tb

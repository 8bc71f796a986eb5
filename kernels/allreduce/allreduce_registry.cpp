// Stage `allreduce`: sizes in runtime/defaults.h; the parameter set is adamw's.
#include <string>

#include "allreduce.h"
#include "runtime/defaults.h"
#include "runtime/comm.h"

namespace tb {

namespace {

using allreduce::Kind;

std::string str(int64_t v) { return std::to_string(v); }

bool has_backward(Kind kind) { return kind == Kind::serial || kind == Kind::overlap; }
bool has_buckets(Kind kind) { return kind == Kind::bucketed || has_backward(kind); }

Work allreduce_work(const Problem& p, Backend backend, Kind kind) {
  const allreduce::Setup s = allreduce::setup_for(p, kind);
  const adamw::ParamSet& set = s.set;
  const double eb = adamw::element_bytes(s.dtype);
  const auto calls = allreduce::calls_for(kind, set, eb, s.cap_bytes);
  double buffer = 0;
  for (const auto& c : calls) buffer += eb * static_cast<double>(c.length);
  const int ranks = comm::launched_ranks();
  Work w;
  w.bytes = allreduce::rated_bytes(buffer, ranks);
  w.bound = Work::Bound::memory;
  w.peak_key = backend == Backend::cuda ? "cuda.allreduce" : "cpu.allreduce";
  w.footprint_bytes = 2 * buffer;  // gradients and their sums
  if (has_backward(kind)) {        // a backward and its all-reduce: rated by the backward's FLOPs, no peak
    w.flops = 2.0 * static_cast<double>(allreduce::backward_fmas(s.tokens)) * static_cast<double>(set.total);
    w.bound = Work::Bound::compute;
    w.peak_key = "";
  }
  w.counters = {{"ranks", static_cast<double>(ranks)},
                {"allreduce_calls", static_cast<double>(calls.size())},
                {"buffer_mb", buffer / double(1 << 20)}};
  return w;
}

std::string allreduce_unsupported(const Problem& p, Backend backend, Kind kind) {
  const allreduce::Setup s = allreduce::setup_for(p, kind);
  const adamw::ParamSet& set = s.set;
  const double eb = adamw::element_bytes(s.dtype);
  if (has_buckets(kind) && !(s.cap_bytes > 0)) return "bucket_mb must be above 0";
  const int ranks = comm::launched_ranks();
  if (backend == Backend::cpu) {
    if (std::string why = comm::world_unavailable_reason(); !why.empty()) return why;
    // Every rank on this host holds its gradients, their sums and the reference's floats.
    const double per_rank = 2 * eb * static_cast<double>(set.arena) + 4.0 * static_cast<double>(set.total);
    return adamw::memory_reason(Backend::cpu, per_rank * ranks);
  }
  if (std::string why = allreduce::nccl_unavailable_reason(); !why.empty()) return why;
  if (ranks > 1)
    if (std::string why = comm::world_unavailable_reason(); !why.empty())
      return "NCCL's bootstrap under mpirun needs MPI: " + why;
  const std::string host = adamw::memory_reason(Backend::cpu, 4.0 * static_cast<double>(set.total) * 2);
  return host.empty() ? adamw::memory_reason(Backend::cuda, 2 * eb * static_cast<double>(set.arena)) : host;
}

Variant variant(Backend backend, Kind kind, const char* id, const char* rationale) {
  Variant v;
  v.id = id;
  v.backend = backend;
  v.rationale = rationale;
  v.collective = true;
  if (kind == Kind::link) v.axes = {"link_mb"};
  else v.axes = {"params", "tensors", "dtype"};
  if (has_buckets(kind)) v.axes.push_back("bucket_mb");
  if (has_backward(kind)) v.axes.push_back("tokens");
  if (kind == Kind::link) v.provides_peak = backend == Backend::cuda ? "cuda.allreduce" : "cpu.allreduce";
  v.work = [backend, kind](const Problem& p) { return allreduce_work(p, backend, kind); };
  v.unsupported = [backend, kind](const Problem& p) { return allreduce_unsupported(p, backend, kind); };
  if (backend == Backend::cpu)
    v.make = [kind](const Problem& p, const RunContext& c) { return allreduce::make_cpu(p, c, kind); };
  else v.make = cuda_factory([kind](const Problem& p, const RunContext& c) { return allreduce::make_cuda(p, c, kind); });
  return v;
}

}  // namespace

void register_stage_allreduce(Registry& registry) {
  Stage s;
  s.name = "allreduce";
  s.question =
      "what the gradient all-reduce of data-parallel training costs per step, bucketed as DDP does or not, "
      "against the link's peak, and how much of it hides behind the backward";
  s.source =
      "docs/sources.md#000-sem-v55 (batch 4096, 29.9M params) and docs/sources.md#003-t4-transformer (batch 256), trained "
      "data-parallel; "
      "DDP's bucket_cap_mb=25";
  s.axes = {
      Axis{"params",
           AxisKind::positive_int,
           {str(defaults::adamw_params)},
           {str(defaults::quick_adamw_params)},
           "gradient elements (all tensors together)",
           {}},
      Axis{"tensors",
           AxisKind::positive_int,
           {str(defaults::adamw_tensors)},
           {str(defaults::quick_adamw_tensors)},
           "tensors the gradients are split into (the adamw stage's parameter set)",
           {}},
      Axis{"dtype", AxisKind::choice, {"fp32", "bf16"}, {"fp32"}, "gradients: fp32 or bf16", {"fp32", "bf16"}},
      Axis{"bucket_mb",
           AxisKind::number,
           {str(defaults::ddp_bucket_mb)},
           {str(defaults::ddp_bucket_mb)},
           "DDP's bucket_cap_mb: MiB of gradients per all-reduce (sweep it: --axis allreduce.bucket_mb=1,5,25,100)",
           {}},
      Axis{"tokens",
           AxisKind::positive_int,
           {str(defaults::allreduce_backward_tokens)},
           {str(defaults::quick_allreduce_backward_tokens)},
           "tokens per rank of the synthetic backward (4 FLOPs per parameter per token) the all-reduce overlaps",
           {}},
      Axis{"link_mb",
           AxisKind::positive_int,
           {str(defaults::allreduce_link_mb)},
           {str(defaults::quick_allreduce_link_mb)},
           "MiB of the flat fp32 all-reduce that measures the link's peak",
           {}},
  };
  s.variants = {
      variant(Backend::cpu, Kind::per_tensor, "per_tensor",
              "MPI_Allreduce per gradient tensor: a loop of dist.all_reduce(p.grad)"),
      variant(Backend::cpu, Kind::bucketed, "bucketed",
              "MPI_Allreduce per DDP bucket (reverse model order, bucket_mb each)"),
      variant(Backend::cpu, Kind::flat, "flat", "one MPI_Allreduce over every gradient in one buffer"),
      variant(Backend::cpu, Kind::link, "link", "a large flat MPI_Allreduce: the link's peak bus bandwidth"),
      variant(Backend::cpu, Kind::serial, "serial", "the synthetic backward, then the buckets' all-reduces"),
      variant(Backend::cpu, Kind::overlap, "overlap",
              "each bucket all-reduced by a communication thread as soon as the backward produced it (DDP on gloo)"),
      variant(Backend::cuda, Kind::per_tensor, "per_tensor",
              "ncclAllReduce per gradient tensor: a loop of dist.all_reduce(p.grad)"),
      variant(Backend::cuda, Kind::bucketed, "bucketed",
              "ncclAllReduce per DDP bucket (reverse model order, bucket_mb each)"),
      variant(Backend::cuda, Kind::flat, "flat", "one ncclAllReduce over every gradient in one buffer"),
      variant(Backend::cuda, Kind::link, "link", "a large flat ncclAllReduce: the link's peak bus bandwidth"),
      variant(Backend::cuda, Kind::serial, "serial",
              "the synthetic backward kernels, then the buckets' all-reduces on the same stream"),
      variant(Backend::cuda, Kind::overlap, "overlap",
              "each bucket's ncclAllReduce on a second stream, after an event the backward recorded (DDP on NCCL)"),
  };
  s.pairs = {
      Pair{"per_tensor", "bucketed", "allreduce: DDP buckets vs one call per tensor"},
      Pair{"per_tensor", "flat", "allreduce: one flat buffer vs one call per tensor"},
      Pair{"serial", "overlap", "allreduce: overlapped with the backward vs after it"},
  };
  registry.add(std::move(s));
}

}  // namespace tb

// Stage `alloc`: the allocator's share of a step. Sizes in runtime/defaults.h; GPU-only.
#include <utility>

#include "alloc.h"
#include "runtime/defaults.h"
#include "runtime/device_info.h"

namespace tb {

namespace {

// The allocator's work is not bytes moved: the bytes are the kernels' few, the counters say what a
// step asks of the allocator, and the row's time is per step.
Work step_work(const Problem& p, alloc::Strategy strategy) {
  const int64_t buffers = p.get_int("buffers");
  const alloc::StepPlan plan = alloc::step_plan(strategy, buffers);
  Work w{alloc::step_bytes(buffers),
         0,
         Work::Bound::memory,
         "",
         {{"buffers", static_cast<double>(buffers)},
          {"allocations", static_cast<double>(plan.allocations)},
          {"kernels", static_cast<double>(plan.kernels)},
          {"bytes_allocated", static_cast<double>(plan.allocations * p.get_int("buffer_bytes"))}}};
  if (plan.releases) w.counters.emplace_back("releases", static_cast<double>(plan.releases));
  return w;
}

std::string step_reason(const Problem& p) {
  const int64_t buffers = p.get_int("buffers"), bytes = p.get_int("buffer_bytes");
  const std::string shape = alloc::shape_reason(buffers, bytes);
  return shape.empty() ? device_memory_reason(static_cast<double>(buffers) * static_cast<double>(bytes)) : shape;
}

}  // namespace

void register_stage_alloc(Registry& registry) {
  using alloc::Strategy;
  Stage s;
  s.name = "alloc";
  s.question =
      "what allocating and freeing a step's activations costs with cudaMalloc, a stream-ordered pool or "
      "reuse, and what an empty_cache-style release stalls";
  s.source = "docs/sources.md#002-trainer2 (Trainer2: in-place accumulation, conditional empty_cache, '10-100 ms stall')";
  s.axes = {
      Axis{"buffers",
           AxisKind::positive_int,
           {std::to_string(defaults::alloc_buffers)},
           {},
           "activation buffers allocated and freed per step",
           {}},
      Axis{"buffer_bytes",
           AxisKind::positive_int,
           {std::to_string(defaults::alloc_buffer_bytes_small), std::to_string(defaults::alloc_buffer_bytes_large)},
           {},
           "bytes per buffer (a multiple of 4)",
           {}},
  };
  const std::vector<std::string> axes{"buffers", "buffer_bytes"};
  auto variant = [&](Strategy strategy, const char* rationale) {
    return Variant{alloc::to_string(strategy),
                   Backend::cuda,
                   rationale,
                   axes,
                   [strategy](const Problem& p) { return step_work(p, strategy); },
                   step_reason,
                   cuda_factory(
                       [strategy](const Problem& p, const RunContext& c) { return alloc::make_cuda(p, c, strategy); }),
                   ""};
  };
  s.variants = {
      variant(Strategy::malloc_free, "cudaMalloc/cudaFree per buffer per step: cudaFree synchronises the device"),
      variant(Strategy::pool, "cudaMallocAsync/cudaFreeAsync on a pool that keeps its memory: a caching allocator"),
      variant(Strategy::reuse, "buffers allocated once and reused: no allocator at all, the floor"),
      variant(Strategy::empty_cache, "the pool emptied after every step (synchronise + cudaMemPoolTrimTo): empty_cache"),
  };
  s.pairs = {
      Pair{"malloc_free", "pool", "alloc: pool vs cudaMalloc/cudaFree"},
      Pair{"malloc_free", "reuse", "alloc: reuse vs cudaMalloc/cudaFree"},
      Pair{"pool", "reuse", "alloc: reuse vs pool"},
      Pair{"empty_cache", "pool", "alloc: pool kept vs emptied every step"},
  };
  registry.add(std::move(s));
}

}  // namespace tb

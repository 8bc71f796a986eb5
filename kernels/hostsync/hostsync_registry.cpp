// Stage `hostsync`: what a host read of the loss costs per step, and how it amortises. Sizes in
// runtime/defaults.h; GPU-only (a CPU has no host/device boundary to sync across).
#include <utility>

#include "hostsync.h"
#include "runtime/defaults.h"
#include "runtime/device_info.h"

namespace tb {

namespace {

// Launch-bound by design: the bytes are what the kernels and reads really move, and their share of
// the device copy peak shows how far from bandwidth-bound the loop is. The time per step is the
// row's time divided by `steps`.
Work loop_work(const Problem& p, hostsync::Pattern pattern) {
  const int64_t steps = p.get_int("steps");
  const hostsync::ReadPlan plan = hostsync::read_plan(pattern, steps);
  return Work{hostsync::bytes_per_call(pattern, steps, p.get_int("elements")),
              0,
              Work::Bound::memory,
              "cuda.copy",
              {{"steps", static_cast<double>(steps)},
               {"kernels", static_cast<double>(hostsync::kernels_per_step * steps)},
               {"syncs", static_cast<double>(plan.syncs)},
               {"d2h_bytes", static_cast<double>(plan.bytes)}}};
}

}  // namespace

void register_stage_hostsync(Registry& registry) {
  using hostsync::Pattern;
  Stage s;
  s.name = "hostsync";
  s.question =
      "what a host read of the loss (loss.item()) costs per step, and how reading every N steps, "
      "batching the metrics or reading asynchronously amortises it";
  s.source =
      "docs/sources.md#003-t4-transformer (loss.item() every step -> every 500), docs/sources.md#002-trainer2 (three "
      "metrics, one transfer)";
  s.axes = {
      Axis{"steps",
           AxisKind::positive_int,
           hostsync::interval_sweep(),
           {},
           "steps per call, i.e. the read interval N of sync_every_n and the metrics patterns",
           {}},
      Axis{"elements",
           AxisKind::positive_int,
           {std::to_string(defaults::hostsync_elements)},
           {},
           "predictions per step the loss is taken over",
           {}},
  };
  const std::vector<std::string> axes{"steps", "elements"};
  auto variant = [&](Pattern pattern, const char* rationale) {
    return Variant{hostsync::to_string(pattern),
                   Backend::cuda,
                   rationale,
                   axes,
                   [pattern](const Problem& p) { return loop_work(p, pattern); },
                   [](const Problem& p) { return device_memory_reason(8.0 * static_cast<double>(p.get_int("elements"))); },
                   cuda_factory(
                       [pattern](const Problem& p, const RunContext& c) { return hostsync::make_cuda(p, c, pattern); }),
                   ""};
  };
  s.variants = {
      variant(Pattern::no_reads, "the same steps with no host reads at all: the floor of every pattern"),
      variant(Pattern::item_every_step,
              "loss.item() every step: a 4-byte copy and a wait per step (docs/sources.md#003-t4-transformer before)"),
      variant(Pattern::sync_every_n,
              "loss accumulated on the device, the running sum read once per N steps (docs/sources.md#003-t4-transformer "
              "after)"),
      variant(Pattern::metrics_separate,
              "three running metrics read with three .item() calls per N steps (docs/sources.md#002-trainer2 before)"),
      variant(Pattern::metrics_batched,
              "the same three metrics in one transfer and one wait (docs/sources.md#002-trainer2 after)"),
      variant(Pattern::async_pinned, "each step's loss copied to pinned memory behind an event and read once done: no wait"),
  };
  s.pairs = {
      Pair{"item_every_step", "sync_every_n", "hostsync: sync every N vs item every step"},
      Pair{"item_every_step", "async_pinned", "hostsync: async pinned vs item every step"},
      Pair{"metrics_separate", "metrics_batched", "hostsync: metrics in one transfer vs three"},
      // Each pattern against the loop with no reads: the ratio is what its reads cost per step.
      Pair{"item_every_step", "no_reads", "hostsync: no reads vs item every step"},
      Pair{"sync_every_n", "no_reads", "hostsync: no reads vs sync every N"},
      Pair{"metrics_separate", "no_reads", "hostsync: no reads vs metrics separate"},
      Pair{"metrics_batched", "no_reads", "hostsync: no reads vs metrics batched"},
      Pair{"async_pinned", "no_reads", "hostsync: no reads vs async pinned"},
  };
  registry.add(std::move(s));
}

}  // namespace tb

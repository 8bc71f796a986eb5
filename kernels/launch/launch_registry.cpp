// Stage `launch`: launch overhead and the CUDA graph break-even. Sizes in runtime/defaults.h;
// GPU-only.
#include <utility>

#include "launch.h"
#include "runtime/defaults.h"
#include "runtime/device_info.h"

namespace tb {

namespace {

// Launch-bound by design: the bytes are what the kernels really move, and their share of the device
// copy peak shows how far from bandwidth-bound launching keeps them. The row's time divided by
// `kernels` is the time per kernel.
Work empty_work(const Problem&) {
  return Work{launch::empty_kernel_bytes, 0, Work::Bound::memory, "cuda.copy", {{"kernels", 1}}};
}

Work window_work(const Problem& p, launch::Mode mode) {
  const double steps = static_cast<double>(p.get_int("steps"));
  Work w{launch::window_bytes(p.get_int("steps"), p.get_int("kernels_per_step"), p.get_int("elements")),
         0,
         Work::Bound::memory,
         "cuda.copy",
         {{"steps", steps}, {"kernels", steps * static_cast<double>(p.get_int("kernels_per_step"))}}};
  if (mode == launch::Mode::graph_with_capture) w.counters.emplace_back("captures", 1);
  if (mode == launch::Mode::graph_update) w.counters.emplace_back("node_updates_per_window", steps);
  return w;
}

std::string window_reason(const Problem& p) {
  const double kernels = static_cast<double>(p.get_int("steps")) * static_cast<double>(p.get_int("kernels_per_step"));
  if (kernels > 1e6) return "a window of more than a million kernels (steps x kernels_per_step)";
  return device_memory_reason(4.0 * launch::state_buffers * static_cast<double>(p.get_int("elements")));
}

}  // namespace

void register_stage_launch(Registry& registry) {
  using launch::Mode;
  Stage s;
  s.name = "launch";
  s.question =
      "what launching small kernels costs per kernel, and how many replays of a CUDA graph pay for "
      "capturing and instantiating it";
  s.source = "docs/sources.md#002-trainer2 (Trainer2: 64-step windows of ~12 kernels per step, CUDA graph capture/replay)";
  s.axes = {
      Axis{"steps", AxisKind::positive_int, {std::to_string(defaults::launch_window_steps)}, {}, "steps per window", {}},
      Axis{"kernels_per_step",
           AxisKind::positive_int,
           {std::to_string(defaults::launch_kernels_per_step)},
           {},
           "small kernels per step (the last one takes the learning rate)",
           {}},
      Axis{"elements",
           AxisKind::positive_int,
           {std::to_string(defaults::launch_elements)},
           {},
           "elements each kernel updates",
           {}},
  };
  const std::vector<std::string> axes{"steps", "kernels_per_step", "elements"};
  auto window = [&](const char* id, Mode mode, const char* rationale) {
    return Variant{id,
                   Backend::cuda,
                   rationale,
                   axes,
                   [mode](const Problem& p) { return window_work(p, mode); },
                   window_reason,
                   cuda_factory(
                       [mode](const Problem& p, const RunContext& c) { return launch::make_cuda_window(p, c, mode); }),
                   ""};
  };
  s.variants = {
      Variant{"empty_launch",
              Backend::cuda,
              "one empty kernel per call, never waited for: the enqueue rate",
              {},
              empty_work,
              nullptr,
              cuda_factory([](const Problem& p, const RunContext& c) { return launch::make_cuda_empty(p, c, false); }),
              ""},
      Variant{"empty_launch_sync",
              Backend::cuda,
              "one empty kernel and a stream synchronise: the launch round trip",
              {},
              empty_work,
              nullptr,
              cuda_factory([](const Problem& p, const RunContext& c) { return launch::make_cuda_empty(p, c, true); }),
              ""},
      window("eager", Mode::eager, "the window launched kernel by kernel, as eager PyTorch does"),
      window("graph", Mode::graph, "the window captured and instantiated once, then one graph launch per window"),
      window("graph_with_capture", Mode::graph_with_capture,
             "capture + instantiate + launch every window: a graph that is never reused"),
      window("graph_update", Mode::graph_update,
             "the graph replayed after updating, in place, the nodes whose learning rate changed"),
  };
  s.pairs = {
      Pair{"eager", "graph", "launch: graph replay vs eager"},
      Pair{"eager", "graph_with_capture", "launch: graph incl. capture + instantiate vs eager"},
      Pair{"eager", "graph_update", "launch: graph updated in place vs eager"},
      Pair{"empty_launch_sync", "empty_launch", "launch: enqueue only vs launch + wait"},
  };
  registry.add(std::move(s));
}

}  // namespace tb

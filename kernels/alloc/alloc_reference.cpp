// The oracle for `alloc` (the checksum in plain loops) and the stage's step plans.
#include "alloc.h"
#include "runtime/defaults.h"

namespace tb::alloc {

const char* to_string(Strategy strategy) {
  switch (strategy) {
    case Strategy::malloc_free:
      return "malloc_free";
    case Strategy::pool:
      return "pool";
    case Strategy::reuse:
      return "reuse";
    case Strategy::empty_cache:
      return "empty_cache";
  }
  return "?";
}

StepPlan step_plan(Strategy strategy, int64_t buffers) {
  StepPlan plan;
  plan.allocations = strategy == Strategy::reuse ? 0 : buffers;
  plan.kernels = buffers + 1;
  plan.releases = strategy == Strategy::empty_cache ? 1 : 0;
  return plan;
}

double step_bytes(int64_t buffers) { return static_cast<double>(buffers) * probes_per_buffer * (4.0 + 4.0 + 16.0); }

uint64_t reference_checksum(int64_t steps, int64_t buffers) {
  uint64_t sum = 0;
  for (int64_t step = 0; step < steps; ++step)
    for (int64_t b = 0; b < buffers; ++b)
      for (int p = 0; p < probes_per_buffer; ++p) sum += probe_value(step, b, p);
  return sum;
}

Verdict check_checksum(uint64_t got, uint64_t want, int64_t steps) {
  if (got == want) return Verdict{true, 0, ""};
  return Verdict{false, 1,
                 "checksum of the words read back after " + std::to_string(steps) + " steps is " + std::to_string(got) +
                     ", reference " + std::to_string(want) + " (a buffer was not written, or overlapped another live one)"};
}

std::string shape_reason(int64_t buffers, int64_t buffer_bytes) {
  if (buffers > defaults::alloc_max_buffers)
    return "at most " + std::to_string(defaults::alloc_max_buffers) + " buffers per step";
  if (buffer_bytes < min_buffer_bytes || buffer_bytes % 4 != 0)
    return "buffer_bytes must be a multiple of 4 and at least " + std::to_string(min_buffer_bytes);
  return "";
}

}  // namespace tb::alloc

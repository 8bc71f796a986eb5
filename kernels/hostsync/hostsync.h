// Stage `hostsync`: what reading a loss on the host costs a training loop (docs/sources.md#003-t4-transformer's
// `loss.item()` every step, docs/sources.md#002-trainer2's three metrics read one by one) and how it amortises. Every
// pattern runs the same steps (a prediction, its loss and two metrics, their accumulation on the device) and differs only in
// how and when the host reads; GPU-only, so this header and the reference are what a CPU-only machine tests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/random.h"
#include "runtime/registry.h"

namespace tb::hostsync {

inline constexpr uint64_t seed_prediction = 31, seed_target = 32;
// Per step: the loss (mean squared error), mean |error| and mean prediction^2, all positive, so
// their sums have no cancellation and an fp32 reduction is within tolerance::fp32 of the reference.
inline constexpr int metric_count = 3;
// forward (the predictions), loss (the three metrics), accumulate (into the device's running sums).
inline constexpr int kernels_per_step = 3;

enum class Pattern {
  no_reads,          // the same loop with no reads at all: the floor every pattern is compared with
  item_every_step,   // the step's loss, 4 bytes to the host and a wait, every step (docs/sources.md#003-t4-transformer)
  sync_every_n,      // the running sum, read once per call of N steps (docs/sources.md#003-t4-transformer's fix)
  metrics_separate,  // the three running sums, three transfers and three waits (docs/sources.md#002-trainer2 before)
  metrics_batched,   // the three running sums in one transfer and one wait (docs/sources.md#002-trainer2 after)
  async_pinned,      // the step's loss copied to pinned memory after an event, read when it is done
};
const char* to_string(Pattern pattern);

// Host-visible traffic of one call of `steps` steps.
struct ReadPlan {
  int64_t syncs = 0;      // host waits for the stream
  int64_t transfers = 0;  // device-to-host copies
  int64_t bytes = 0;      // bytes they move
};
ReadPlan read_plan(Pattern pattern, int64_t steps);
// Bytes one call moves: the step kernels' device traffic (forward writes the predictions, the loss
// reads them and the targets, accumulate updates three sums) and the reads to the host. A few KiB
// per step: the loop is launch-bound, and its share of the copy peak says by how much.
double bytes_per_call(Pattern pattern, int64_t steps, int64_t elements);

// The N sweep of sync_every_n, as axis values (defaults::hostsync_intervals).
std::vector<std::string> interval_sweep();

// Step `step`'s inputs: element i of its predictions, and the fixed targets.
TB_HOST_DEVICE inline float prediction(int64_t step, int64_t i, int64_t elements) {
  return uniform_at(seed_prediction,
                    static_cast<uint64_t>(step) * static_cast<uint64_t>(elements) + static_cast<uint64_t>(i));
}
TB_HOST_DEVICE inline float target(int64_t i) { return uniform_at(seed_target, static_cast<uint64_t>(i)); }

struct Sums {
  double v[metric_count] = {0, 0, 0};
};

// ---- reference: plain loops, in double ---------------------------------------------------------
Sums step_metrics(int64_t step, int64_t elements);
// The metrics of steps [0, steps) summed: what the device's running sums hold after them.
Sums metric_sums(int64_t steps, int64_t elements);
// Compares the first `count` sums with the reference (tolerance::fp32); `what` names them.
Verdict check_sums(const std::string& what, const Sums& got, const Sums& want, int count = metric_count);

// ---- async_pinned's bookkeeping (no CUDA: tested on any machine) -------------------------------
// A ring of pinned slots, each holding one step's copied loss until the host reads it. The host
// harvests finished slots oldest first without waiting and waits only when every slot is in flight.
class ReadRing {
 public:
  explicit ReadRing(int slots);
  int slots() const { return static_cast<int>(step_.size()); }
  int in_flight() const { return count_; }
  bool full() const { return count_ == slots(); }
  int oldest() const { return head_; }  // valid when in_flight() > 0
  // Claims the next slot for the copy of step `step`'s value; the ring must not be full.
  int push(int64_t step);
  // Reads the oldest slot (its copy must be complete), `now` being the step the host is at.
  void pop(int64_t now);
  // Pops, oldest first, every slot `done(slot)` says is complete, calling `read(slot)` before each
  // pop; stops at the first that is not. Returns how many were read.
  template <class Done, class Read>
  int harvest(int64_t now, Done&& done, Read&& read) {
    int n = 0;
    while (count_ > 0 && done(head_)) {
      read(head_);
      pop(now);
      ++n;
    }
    return n;
  }
  int64_t reads() const { return reads_; }
  double mean_lag_steps() const { return reads_ ? static_cast<double>(lag_total_) / static_cast<double>(reads_) : 0.0; }

 private:
  std::vector<int64_t> step_;
  int head_ = 0, count_ = 0;
  int64_t reads_ = 0, lag_total_ = 0;
};

// ---- CUDA variants (hostsync_cuda.cu) ------------------------------------------------------------
std::unique_ptr<Instance> make_cuda(const Problem& problem, const RunContext& context, Pattern pattern);

}  // namespace tb::hostsync

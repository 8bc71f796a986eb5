// The oracle for `hostsync` (plain loops in double) and the stage's host-side bookkeeping.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "hostsync.h"
#include "runtime/defaults.h"
#include "runtime/tolerance.h"

namespace tb::hostsync {

const char* to_string(Pattern pattern) {
  switch (pattern) {
    case Pattern::no_reads:
      return "no_reads";
    case Pattern::item_every_step:
      return "item_every_step";
    case Pattern::sync_every_n:
      return "sync_every_n";
    case Pattern::metrics_separate:
      return "metrics_separate";
    case Pattern::metrics_batched:
      return "metrics_batched";
    case Pattern::async_pinned:
      return "async_pinned";
  }
  return "?";
}

ReadPlan read_plan(Pattern pattern, int64_t steps) {
  switch (pattern) {
    case Pattern::no_reads:
      return {0, 0, 0};
    case Pattern::item_every_step:
      return {steps, steps, 4 * steps};  // a float per step
    case Pattern::sync_every_n:
      return {1, 1, 8};  // the running sum (double)
    case Pattern::metrics_separate:
      return {metric_count, metric_count, 8 * metric_count};
    case Pattern::metrics_batched:
      return {1, 1, 8 * metric_count};
    case Pattern::async_pinned:
      return {0, steps, 4 * steps};
  }
  return {};
}

double bytes_per_call(Pattern pattern, int64_t steps, int64_t elements) {
  const double forward = 4.0 * elements, loss = 8.0 * elements + 4 * metric_count,
               accumulate = 4 * metric_count + 16 * metric_count;
  return static_cast<double>(steps) * (forward + loss + accumulate) + static_cast<double>(read_plan(pattern, steps).bytes);
}

std::vector<std::string> interval_sweep() {
  std::vector<std::string> values;
  for (const int64_t n : defaults::hostsync_intervals) values.push_back(std::to_string(n));
  return values;
}

Sums step_metrics(int64_t step, int64_t elements) {
  double squared = 0, absolute = 0, prediction_squared = 0;
  for (int64_t i = 0; i < elements; ++i) {
    const double p = prediction(step, i, elements), e = p - static_cast<double>(target(i));
    squared += e * e;
    absolute += std::abs(e);
    prediction_squared += p * p;
  }
  const double n = static_cast<double>(elements);
  Sums s;
  s.v[0] = squared / n;
  s.v[1] = absolute / n;
  s.v[2] = prediction_squared / n;
  return s;
}

Sums metric_sums(int64_t steps, int64_t elements) {
  Sums total;
  for (int64_t step = 0; step < steps; ++step) {
    const Sums s = step_metrics(step, elements);
    for (int m = 0; m < metric_count; ++m) total.v[m] += s.v[m];
  }
  return total;
}

Verdict check_sums(const std::string& what, const Sums& got, const Sums& want, int count) {
  static const char* names[metric_count] = {"loss", "mean |error|", "mean prediction^2"};
  double worst = 0;
  for (int m = 0; m < count; ++m) {
    const double error = std::abs(got.v[m] - want.v[m]) / std::max(std::abs(want.v[m]), 1e-30);
    worst = std::max(worst, std::isfinite(got.v[m]) ? error : INFINITY);
    if (!tolerance::fp32.accepts(got.v[m], want.v[m])) {
      std::ostringstream msg;
      msg.precision(10);
      msg << what << ": " << names[m] << " sum " << got.v[m] << ", reference " << want.v[m];
      return Verdict{false, worst, msg.str()};
    }
  }
  return Verdict{true, worst, ""};
}

ReadRing::ReadRing(int slots) : step_(static_cast<std::size_t>(slots), 0) {
  if (slots < 1) throw std::invalid_argument("ReadRing needs at least one slot");
}

int ReadRing::push(int64_t step) {
  if (full()) throw std::logic_error("ReadRing::push on a full ring: wait for the oldest slot first");
  const int slot = (head_ + count_) % slots();
  step_[static_cast<std::size_t>(slot)] = step;
  ++count_;
  return slot;
}

void ReadRing::pop(int64_t now) {
  if (count_ == 0) throw std::logic_error("ReadRing::pop on an empty ring");
  lag_total_ += now - step_[static_cast<std::size_t>(head_)];
  ++reads_;
  head_ = (head_ + 1) % slots();
  --count_;
}

}  // namespace tb::hostsync

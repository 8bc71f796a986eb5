#include "timing.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace tb {

static int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void SteadyTimer::start() { start_ns_ = now_ns(); }
double SteadyTimer::stop() { return static_cast<double>(now_ns() - start_ns_) * 1e-9; }

double time_sample(SampleTimer& timer, const std::function<void()>& call, int64_t batch,
                   CacheFlusher* flusher) {
  if (flusher) flusher->flush();
  timer.start();
  for (int64_t i = 0; i < batch; ++i) call();
  return timer.stop();
}

int64_t batch_for(double call_s, double min_sample_s, int64_t max_batch) {
  if (!(call_s > 0)) return max_batch;
  const double calls = std::ceil(min_sample_s / call_s);
  return std::clamp<int64_t>(static_cast<int64_t>(std::min(calls, 1e18)), 1, max_batch);
}

}  // namespace tb

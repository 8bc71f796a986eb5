#include "timing.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace tb {

static int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void SteadyTimer::start() { start_ns_ = now_ns(); }
double SteadyTimer::stop() { return static_cast<double>(now_ns() - start_ns_) * 1e-9; }

double time_sample(SampleTimer& timer, const std::function<void()>& call, int64_t batch, CacheFlusher* flusher,
                   bool (*stop)(), int64_t* calls_made) {
  if (flusher) flusher->flush();
  int64_t i = 0;
  timer.start();
  if (!stop) {
    for (; i < batch; ++i) call();
  } else {
    const int64_t every = std::max<int64_t>(1, batch / stop_checks_per_batch);
    while (i < batch) {
      const int64_t end = std::min(batch, i + every);
      for (; i < end; ++i) call();
      if (i < batch && stop()) break;
    }
  }
  const double seconds = timer.stop();
  if (calls_made) *calls_made = i;
  return seconds;
}

int64_t batch_for(double call_s, double min_sample_s, int64_t max_batch) {
  if (!(call_s > 0)) return max_batch;
  const double calls = std::ceil(min_sample_s / call_s);
  return std::clamp<int64_t>(static_cast<int64_t>(std::min(calls, 1e18)), 1, max_batch);
}

}  // namespace tb

// Timers and the sampling loop. A sample times `batch` calls between one start and one stop, so
// launch-bound work is not dominated by the timer's own resolution. CPU samples come from a steady
// clock; CUDA samples from events on the benchmark's stream (cuda_session.cpp).
#pragma once

#include <cstdint>
#include <functional>

namespace tb {

class SampleTimer {
 public:
  virtual ~SampleTimer() = default;
  virtual void start() = 0;
  virtual double stop() = 0;  // seconds since start(), after the timed work has finished
};

class SteadyTimer final : public SampleTimer {
 public:
  void start() override;
  double stop() override;

 private:
  int64_t start_ns_ = 0;
};

// Evicts the cache the timed work would otherwise find warm ("cold" mode).
class CacheFlusher {
 public:
  virtual ~CacheFlusher() = default;
  virtual void flush() = 0;
  // Returns once the flush is done. A timer on the flush's own stream needs no wait (its start queues
  // behind the flush); one that is not (another process's: a PyTorch row) does.
  virtual void wait() {}
};

// Seconds for `batch` calls of `call`. The flush (cold mode) happens before start(), outside the
// timed region. With `stop` (a stop request: Ctrl-C), asked between calls, the sample ends early once
// it says true, and `calls_made` gets the calls the seconds are for. It is asked at most
// stop_checks_per_batch times a batch, so that the timed calls are not slowed measurably (a batch
// lasts about a sample's minimum, tens of microseconds: checked more often, it would not stop sooner).
inline constexpr int64_t stop_checks_per_batch = 8;
double time_sample(SampleTimer& timer, const std::function<void()>& call, int64_t batch, CacheFlusher* flusher = nullptr,
                   bool (*stop)() = nullptr, int64_t* calls_made = nullptr);

// Calls per sample so that one sample lasts at least `min_sample_s`.
int64_t batch_for(double call_s, double min_sample_s, int64_t max_batch);

}  // namespace tb

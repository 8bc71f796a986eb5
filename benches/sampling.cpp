#include "sampling.h"

#include <algorithm>
#include <cmath>

#include "runtime/comm.h"
#include "runtime/defaults.h"

namespace tb {

namespace {

// A flush that returns once it is done (CacheFlusher::wait), for a row another process times.
class FlushThenWait final : public CacheFlusher {
 public:
  explicit FlushThenWait(CacheFlusher& inner) : inner_(inner) {}
  void flush() override {
    inner_.flush();
    inner_.wait();
  }

 private:
  CacheFlusher& inner_;
};

// A stop request before the row's first sample: it has no time.
bool not_timed(Row& row, const std::string& when) {
  row.disposition = Disposition::unsupported;
  row.reason = "not timed: interrupted " + when;
  return false;
}

}  // namespace

// The timer every sample is read from: a collective's agreed one under mpirun (every rank's slowest),
// a test's fake clock, the clock of the process that makes the calls (a PyTorch row), else the
// backend's own. Cold mode flushes before each sample; a row timed by another process's clock waits
// for the flush to end: that process's calls would not queue behind it on this process's stream.
void RowSampler::choose_timer_and_flusher() {
  SampleTimer* own = instance_->own_timer();
  timer_ = agreed_ ? agreed_.get() : injected_ ? injected_.get() : own ? own : &session_->timer();
  if (!settings_.cold) return;
  if (!own) {
    flusher_ = &session_->flusher();
    return;
  }
  waiting_flusher_ = std::make_unique<FlushThenWait>(session_->flusher());
  flusher_ = waiting_flusher_.get();
}

bool RowSampler::prepare(Row& row, const std::function<void(const std::string&)>& say) {
  session_ = make_session(entry_.variant->backend, settings_.cuda_device);
  if (settings_.sample_timer) injected_ = settings_.sample_timer();
  if (entry_.variant->collective && comm::launched_ranks() > 1)
    agreed_ = std::make_unique<comm::AgreedTimer>(session_->timer());
  try {
    instance_ = entry_.variant->make(entry_.problem, session_->context());
  } catch (const CannotRun& why) {  // it looked, and cannot run this problem here
    row.disposition = Disposition::unsupported;
    row.reason = why.what();
    return false;
  }
  choose_timer_and_flusher();
  if (stopping()) return not_timed(row, "before its first call");
  const double first_s = time_sample(
      *timer_, [&] { instance_->run(); }, 1);
  if (stopping()) return not_timed(row, "before its check against the reference");
  say("first call done; checking it against the reference");
  const Verdict verdict = instance_->check();
  row.max_error = verdict.max_error;
  if (!verdict.passed) {
    row.disposition = Disposition::incorrect;
    row.reason = verdict.detail.empty() ? "output differs from the reference" : verdict.detail;
    return false;
  }
  row.disposition = Disposition::passed;
  // Warm-up: at least a few calls and a few milliseconds, so clocks, caches and lazy library
  // initialisation (cuBLAS heuristics, page faults) are behind us before the first sample.
  double call_s = first_s;
  double spent = first_s;
  for (int k = 0; k < defaults::warmup_calls || spent < defaults::warmup_s; ++k) {
    if (stopping()) return not_timed(row, "during its warm-up (its check passed)");
    call_s = time_sample(
        *timer_, [&] { instance_->run(); }, 1);
    spent += call_s;
    if (k > 1000) break;
  }
  // Cold mode flushes the cache before every call, so each sample is one call.
  batch_ = settings_.cold ? 1 : batch_for(call_s, session_->min_sample_s(), defaults::max_batch);
  row.batch = batch_;
  say("warmed up; sample 1/" + std::to_string(settings_.repetitions) + " next");
  return true;
}

// A stop request is heard before the sample and between the calls of its batches; the sample it cuts
// short keeps the calls it made (each is whole).
Taken RowSampler::take(int64_t iterations) {
  bool (*const stop)() = hears_stop() ? &stop_requested : nullptr;
  Taken taken;
  if (stopping()) {
    taken.stopped = true;
    return taken;
  }
  for (int64_t k = 0; k < iterations; ++k) {
    int64_t made = batch_;
    taken.seconds += time_sample(
        *timer_, [&] { instance_->run(); }, batch_, flusher_, stop, &made);
    taken.calls += made;
    if (stop && stop() && (made < batch_ || k + 1 < iterations)) {
      taken.stopped = true;
      break;
    }
  }
  return taken;
}

Taken RowSampler::next_sample() {
  if (iterations_ > 0) return take(iterations_);
  int64_t iterations = 1;
  for (;;) {
    Taken taken = take(iterations);
    // A stop request that came as an attempt ended makes that attempt's whole calls the sample it cut short.
    if (taken.stopped || taken.seconds >= settings_.min_time_s || iterations >= max_sample_iterations || stopping()) {
      iterations_ = iterations;
      if (taken.seconds < settings_.min_time_s && iterations < max_sample_iterations) taken.stopped = true;
      return taken;
    }
    const double grow = taken.seconds > 0 ? std::min(10.0, 1.4 * settings_.min_time_s / taken.seconds) : 10.0;
    iterations = std::max(iterations + 1, static_cast<int64_t>(std::ceil(static_cast<double>(iterations) * grow)));
  }
}

}  // namespace tb

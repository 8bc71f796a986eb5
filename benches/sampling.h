// One row's sampling: its instance, checked against the reference and warmed up before any sample is
// taken, and the loop that takes a sample (iterations x batch calls between one start and one stop of
// the row's timer). Every row is sampled through it, alone or in rounds with the rows of its pairs.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "harness.h"
#include "runtime/session.h"

namespace tb {

// What one sample took: the seconds of the calls it made, and whether a stop request ended it early
// (its calls are then fewer than iterations x batch).
struct Taken {
  double seconds = 0;
  int64_t calls = 0;
  bool stopped = false;
};

// A sample takes at most this many batches (Google Benchmark's limit on an iteration count).
inline constexpr int64_t max_sample_iterations = 1000000000;

class RowSampler {
 public:
  RowSampler(const Entry& entry, const Settings& settings) : entry_(entry), settings_(settings) {}

  // Instantiates the variant, runs it once, checks it against the reference, warms it up and picks the
  // batch, filling the row's disposition (passed, incorrect, unsupported with why), max_error and batch.
  // False: the row is not to be timed. `say`: how far it is, for a row that takes long.
  bool prepare(Row& row, const std::function<void(const std::string&)>& say);

  // The row's next sample. The first also finds how many batches a sample takes, as Google Benchmark
  // finds an iteration count: more until one lasts --min-time; that one is the first sample.
  Taken next_sample();
  // A sample of `iterations` batches (a disturbed sample taken again).
  Taken take(int64_t iterations);

  int64_t iterations() const { return iterations_; }
  // A collective's row under mpirun hears no stop request: its ranks would hear it at different calls.
  bool hears_stop() const { return !agreed_; }
  bool agreed_across_ranks() const { return agreed_ != nullptr; }
  Instance& instance() { return *instance_; }
  // The process whose calls this row times (a PyTorch row's script), 0: this one.
  int process_id() const { return instance_ ? instance_->process_id() : 0; }

 private:
  bool stopping() const { return hears_stop() && stop_requested(); }
  void choose_timer_and_flusher();

  const Entry& entry_;
  const Settings& settings_;
  std::unique_ptr<BackendSession> session_;
  std::unique_ptr<SampleTimer> agreed_;    // a collective's timer under mpirun (comm::AgreedTimer)
  std::unique_ptr<SampleTimer> injected_;  // Settings::sample_timer's, when a test gave one
  std::unique_ptr<Instance> instance_;
  std::unique_ptr<CacheFlusher> waiting_flusher_;
  SampleTimer* timer_ = nullptr;
  CacheFlusher* flusher_ = nullptr;  // cold mode's flush before each sample, or null
  int64_t batch_ = 1;
  int64_t iterations_ = 0;  // batches a sample takes; 0 until the first sample found it
};

}  // namespace tb

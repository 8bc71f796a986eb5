// The all-reduce stage on the CPU: MPI_Allreduce across the ranks mpirun started (comm.h), out of
// place (the gradients stay as the backward left them; the sums land in a second arena), so that every
// call reduces the same values. The overlap variant all-reduces from a thread of its own, as PyTorch's
// gloo backend does, while the calling thread runs the backward.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>

#include "allreduce.h"
#include "runtime/cpu_elementwise.h"
#include "runtime/error.h"
#include "runtime/host_buffer.h"

namespace tb::allreduce {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Seconds of one call, every rank starting together and the slowest rank's time kept.
template <class F>
double agreed_seconds(comm::Group& group, F&& call) {
  group.barrier();
  const double start = now_s();
  call();
  return comm::agree_max(now_s() - start);
}

// The synthetic backward of one tensor: `fmas` multiply-adds per element with coefficients (one,
// zero) read at run time, in blocks of independent lanes the compiler vectorises.
template <class G>
void backward_tensor(G* grad, int64_t n, int64_t fmas, float one, float zero) {
  constexpr int64_t lanes = 64;
#pragma omp parallel for schedule(static) if (n > cpu::parallel_threshold)
  for (int64_t block = 0; block < (n + lanes - 1) / lanes; ++block) {
    const int64_t begin = block * lanes, len = std::min(lanes, n - begin);
    float y[lanes] = {};
    for (int64_t j = 0; j < len; ++j) y[j] = adamw::load_float(grad + begin, j);
    for (int64_t k = 0; k < fmas; ++k)
#pragma omp simd
      for (int64_t j = 0; j < lanes; ++j) y[j] = y[j] * one + zero;
    for (int64_t j = 0; j < len; ++j) adamw::store_float(grad + begin, j, y[j]);
  }
}

// A thread that all-reduces the buckets handed to it, in order.
class CommThread {
 public:
  template <class F>
  explicit CommThread(F&& reduce_bucket) : reduce_(std::forward<F>(reduce_bucket)), thread_([this] { loop(); }) {}
  ~CommThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      quit_ = true;
    }
    ready_.notify_all();
    thread_.join();
  }
  void post(std::size_t bucket) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(bucket);
    }
    ready_.notify_all();
  }
  void wait_for(std::size_t buckets) {  // until this many have been reduced since the last wait
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return done_ >= buckets; });
    done_ = 0;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      ready_.wait(lock, [&] { return quit_ || next_ < queue_.size(); });
      if (quit_) return;
      const std::size_t bucket = queue_[next_++];
      lock.unlock();
      reduce_(bucket);
      lock.lock();
      ++done_;
      if (next_ == queue_.size()) {
        queue_.clear();
        next_ = 0;
      }
      done_cv_.notify_all();
    }
  }

  std::function<void(std::size_t)> reduce_;
  std::mutex mutex_;
  std::condition_variable ready_, done_cv_;
  std::vector<std::size_t> queue_;
  std::size_t next_ = 0, done_ = 0;
  bool quit_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

template <class G>
class CpuAllreduce final : public Instance {
 public:
  CpuAllreduce(ParamSet set, Dtype dtype, Kind kind, double cap_bytes, int64_t tokens)
      : group_(comm::world()),
        set_(std::move(set)),
        dtype_(dtype),
        kind_(kind),
        elem_(std::is_same_v<G, float> ? comm::Elem::f32 : comm::Elem::bf16),
        calls_(calls_for(kind, set_, adamw::element_bytes(dtype), cap_bytes)),
        fmas_(backward_fmas(tokens)),
        grad_(static_cast<std::size_t>(set_.arena)),
        reduced_(static_cast<std::size_t>(set_.arena)) {
    const auto chunks = adamw::make_chunks(set_, 8192);
    const uint64_t seed = adamw::seed_grad + static_cast<uint64_t>(group_.rank());
    if constexpr (std::is_same_v<G, float>) {
      adamw::fill_arena(set_, chunks, seed, grad_.data());
      adamw::zero_arena(set_, chunks, reduced_.data());
    } else {
      adamw::fill_arena_bf16(set_, chunks, seed, grad_.data());
      std::fill(reduced_.data(), reduced_.data() + set_.arena, uint16_t{0});
    }
    if (kind_ == Kind::overlap) {
      TB_REQUIRE(group_.threads_may_call(), "MPI was started without thread support (MPI_THREAD_SERIALIZED)");
      comm_ = std::make_unique<CommThread>([this](std::size_t b) { reduce(calls_[b]); });
    }
  }

  void run() override {
    switch (kind_) {
      case Kind::serial:
        backward(0, set_.count() - 1);
        [[fallthrough]];
      case Kind::per_tensor:
      case Kind::bucketed:
      case Kind::flat:
      case Kind::link:
        for (const Bucket& c : calls_) reduce(c);
        return;
      case Kind::overlap:
        for (std::size_t b = 0; b < calls_.size(); ++b) {
          backward(calls_[b].first_tensor, calls_[b].last_tensor);
          comm_->post(b);
        }
        comm_->wait_for(calls_.size());
        return;
    }
  }

  Verdict check() override {
    std::vector<float> got;
    if constexpr (std::is_same_v<G, float>) got = adamw::gather(set_, reduced_.data());
    else got = adamw::gather_bf16(set_, reduced_.data());
    Verdict v = check_sum(got, group_.size(), dtype_);
    if (v.passed && (kind_ == Kind::serial || kind_ == Kind::overlap)) measure_parts();
    return v;
  }

  std::vector<std::pair<std::string, double>> observed() const override {
    return parts_.together_s > 0 ? parts_.counters() : std::vector<std::pair<std::string, double>>{};
  }

 private:
  void reduce(const Bucket& c) {
    group_.allreduce(grad_.data() + c.begin, reduced_.data() + c.begin, c.length, elem_, comm::Reduce::sum);
  }

  // The backward of tensors last..first (the order it produces them).
  void backward(int64_t first, int64_t last) {
    for (int64_t t = last; t >= first; --t)
      backward_tensor(grad_.data() + set_.offsets[t], set_.sizes[t], fmas_, one_, zero_);
  }

  void measure_parts() {
    parts_ = measure_overlap_parts([&](int part) {
      return agreed_seconds(group_, [&] {
        if (part == 0) backward(0, set_.count() - 1);
        else if (part == 1)
          for (const Bucket& c : calls_) reduce(c);
        else run();
      });
    });
    parts_.overlapped = kind_ == Kind::overlap;
  }

  comm::Group& group_;
  ParamSet set_;
  Dtype dtype_;
  Kind kind_;
  comm::Elem elem_;
  std::vector<Bucket> calls_;
  int64_t fmas_;
  volatile float one_ = 1.0f, zero_ = 0.0f;  // volatile: unknown to the compiler, so every FLOP stays
  HostBuffer<G> grad_, reduced_;
  OverlapParts parts_;
  std::unique_ptr<CommThread> comm_;  // last: its thread stops before the buffers go
};

}  // namespace

std::unique_ptr<Instance> make_cpu(const Problem& p, const RunContext&, Kind kind) {
  Setup s = setup_for(p, kind);
  if (s.dtype == Dtype::fp32)
    return std::make_unique<CpuAllreduce<float>>(std::move(s.set), s.dtype, kind, s.cap_bytes, s.tokens);
  return std::make_unique<CpuAllreduce<uint16_t>>(std::move(s.set), s.dtype, kind, s.cap_bytes, s.tokens);
}

}  // namespace tb::allreduce

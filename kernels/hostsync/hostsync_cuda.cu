// CUDA hostsync: one loop of steps (forward, loss, accumulate: three small kernels) and six ways for
// the host to read what it computes. Every read that waits is what `loss.item()` does: a copy into
// pageable host memory and a stream synchronise.
#include <algorithm>
#include <chrono>
#include <vector>

#include "hostsync.h"
#include "runtime/cuda_raii.h"
#include "runtime/defaults.h"

namespace tb::hostsync {

namespace {

constexpr int block_size = 256;
constexpr int loss_block = 256;  // one block reduces the step: the batch is a few thousand values

// Events that only order and signal: no timestamps, the cheapest to record and query.
struct SignalEventTraits {
  static void create(cudaEvent_t* e) { CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming)); }
  static void destroy(cudaEvent_t e) { cudaEventDestroy(e); }
};
using SignalEvent = cuda::Handle<cudaEvent_t, SignalEventTraits>;

// True when the work before `event` has finished; never waits. "Not ready" is not an error: clear
// it so that a later cudaGetLastError does not report it.
bool event_done(cudaEvent_t event) {
  const cudaError_t status = cudaEventQuery(event);
  if (status == cudaSuccess) return true;
  if (status != cudaErrorNotReady) CUDA_CHECK(status);
  const cudaError_t last = cudaGetLastError();
  if (last != cudaSuccess && last != cudaErrorNotReady) CUDA_CHECK(last);
  return false;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The forward pass's stand-in: the step's predictions, regenerated from the step index.
__global__ void forward_kernel(float* __restrict__ predictions, int64_t step, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    predictions[i] = prediction(step, i, n);
}

__global__ void target_kernel(float* __restrict__ targets, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    targets[i] = target(i);
}

// The loss and two logged metrics of the step, reduced by one block (in double, so the result is
// the fp32 rounding of the exact mean at any batch size), written as fp32 like a loss tensor.
__global__ void loss_kernel(const float* __restrict__ predictions, const float* __restrict__ targets, int64_t n,
                            float* __restrict__ metrics) {
  __shared__ double partial[metric_count][loss_block];
  double squared = 0, absolute = 0, prediction_squared = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double p = predictions[i], e = p - static_cast<double>(targets[i]);
    squared += e * e;
    absolute += fabs(e);
    prediction_squared += p * p;
  }
  partial[0][threadIdx.x] = squared;
  partial[1][threadIdx.x] = absolute;
  partial[2][threadIdx.x] = prediction_squared;
  __syncthreads();
  for (int stride = loss_block / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride)
      for (int m = 0; m < metric_count; ++m) partial[m][threadIdx.x] += partial[m][threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x < metric_count)
    metrics[threadIdx.x] = static_cast<float>(partial[threadIdx.x][0] / static_cast<double>(n));
}

// total_loss += loss.detach(): the running sums stay on the device.
__global__ void accumulate_kernel(const float* __restrict__ metrics, double* __restrict__ sums) {
  if (threadIdx.x < metric_count) sums[threadIdx.x] += static_cast<double>(metrics[threadIdx.x]);
}

class Loop final : public Instance {
 public:
  Loop(const Problem& p, const RunContext& ctx, Pattern pattern)
      : pattern_(pattern),
        steps_(p.get_int("steps")),
        n_(p.get_int("elements")),
        stream_(cuda::as_stream(ctx.cuda_stream)),
        predictions_(static_cast<std::size_t>(n_)),
        targets_(static_cast<std::size_t>(n_)),
        metrics_(metric_count),
        sums_(metric_count),
        ring_(defaults::hostsync_async_slots) {
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx.cuda_device));
    grid_ = static_cast<int>(std::clamp<int64_t>((n_ + block_size - 1) / block_size, 1, int64_t{sms} * 4));
    target_kernel<<<grid_, block_size, 0, stream_>>>(targets_.data(), n_);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemsetAsync(sums_.data(), 0, sums_.bytes(), stream_));
    if (pattern_ == Pattern::async_pinned) {
      slots_ = cuda::PinnedBuffer<float>(static_cast<std::size_t>(ring_.slots()));
      events_.resize(static_cast<std::size_t>(ring_.slots()));
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  // Copies into the pinned slots may still be in flight.
  ~Loop() override { cudaStreamSynchronize(stream_); }

  void run() override {
    for (int64_t s = 0; s < steps_; ++s) {
      enqueue_step(step_);
      if (pattern_ == Pattern::item_every_step) {
        read(&item_, metrics_.data(), sizeof item_);  // loss.item()
        host_sums_.v[0] += item_;
      } else if (pattern_ == Pattern::async_pinned) {
        read_async(step_);
      }
      ++step_;
    }
    switch (pattern_) {
      case Pattern::sync_every_n:
        read(&running_.v[0], sums_.data(), sizeof(double));
        host_sums_.v[0] = running_.v[0];
        break;
      case Pattern::metrics_separate:  // three .item() calls
        for (int m = 0; m < metric_count; ++m) read(&running_.v[m], sums_.data() + m, sizeof(double));
        host_sums_ = running_;
        break;
      case Pattern::metrics_batched:  // one transfer of all three
        read(running_.v, sums_.data(), metric_count * sizeof(double));
        host_sums_ = running_;
        break;
      default:
        break;
    }
  }

  Verdict check() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaGetLastError());
    if (pattern_ == Pattern::async_pinned) {
      ring_.harvest(
          step_, [](int) { return true; }, [this](int slot) { host_sums_.v[0] += slots_[slot]; });
    }
    Sums device;
    CUDA_CHECK(cudaMemcpy(device.v, sums_.data(), sums_.bytes(), cudaMemcpyDeviceToHost));
    const Sums want = metric_sums(step_, n_);
    Verdict v = check_sums("device running sums after " + std::to_string(step_) + " steps", device, want);
    if (!v.passed || pattern_ == Pattern::no_reads) return v;
    const bool all_three = pattern_ == Pattern::metrics_separate || pattern_ == Pattern::metrics_batched;
    const char* what = pattern_ == Pattern::item_every_step || pattern_ == Pattern::async_pinned
                           ? "host sum of the losses it read"
                           : "host's last read of the running sums";
    Verdict host = check_sums(what, host_sums_, want, all_three ? metric_count : 1);
    host.max_error = std::max(host.max_error, v.max_error);
    return host;
  }

  std::vector<std::pair<std::string, double>> observed() const override {
    if (pattern_ == Pattern::async_pinned && step_ > 0)
      return {{"stalls_per_step", static_cast<double>(stalls_) / static_cast<double>(step_)},
              {"read_lag_steps", ring_.mean_lag_steps()}};
    if (syncs_ > 0) return {{"wait_us_per_sync", 1e6 * wait_s_ / static_cast<double>(syncs_)}};
    return {};
  }

 private:
  void enqueue_step(int64_t step) {
    forward_kernel<<<grid_, block_size, 0, stream_>>>(predictions_.data(), step, n_);
    loss_kernel<<<1, loss_block, 0, stream_>>>(predictions_.data(), targets_.data(), n_, metrics_.data());
    accumulate_kernel<<<1, 32, 0, stream_>>>(metrics_.data(), sums_.data());
  }

  // A blocking read: copy to pageable host memory, then wait for the stream.
  void read(void* host, const void* device, std::size_t bytes) {
    const auto t0 = Clock::now();
    CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    wait_s_ += seconds_since(t0);
    ++syncs_;
  }

  // Step `step`'s loss goes to a pinned slot behind an event; whatever earlier steps have finished
  // is read without waiting. Only a ring with every slot in flight makes the host wait.
  void read_async(int64_t step) {
    auto consume = [this](int slot) { host_sums_.v[0] += slots_[slot]; };
    ring_.harvest(
        step, [this](int slot) { return event_done(events_[static_cast<std::size_t>(slot)]); }, consume);
    if (ring_.full()) {
      CUDA_CHECK(cudaEventSynchronize(events_[static_cast<std::size_t>(ring_.oldest())]));
      consume(ring_.oldest());
      ring_.pop(step);
      ++stalls_;
    }
    const int slot = ring_.push(step);
    CUDA_CHECK(cudaMemcpyAsync(slots_.data() + slot, metrics_.data(), sizeof(float), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaEventRecord(events_[static_cast<std::size_t>(slot)], stream_));
  }

  Pattern pattern_;
  int64_t steps_, n_;
  cudaStream_t stream_;
  int grid_ = 1;
  cuda::DeviceBuffer<float> predictions_, targets_, metrics_;
  cuda::DeviceBuffer<double> sums_;
  int64_t step_ = 0;  // steps run so far, over all calls
  float item_ = 0;
  Sums running_, host_sums_;
  double wait_s_ = 0;
  int64_t syncs_ = 0;
  ReadRing ring_;
  cuda::PinnedBuffer<float> slots_;
  std::vector<SignalEvent> events_;
  int64_t stalls_ = 0;
};

}  // namespace

std::unique_ptr<Instance> make_cuda(const Problem& problem, const RunContext& context, Pattern pattern) {
  return std::make_unique<Loop>(problem, context, pattern);
}

}  // namespace tb::hostsync

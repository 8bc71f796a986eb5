// The CUDA backend's session: a non-blocking stream per benchmark, CUDA events as the timer, and an
// L2 flush for cold mode. Host code that calls the CUDA runtime; built only with the CUDA backend.
#include <algorithm>

#include "cuda_raii.h"
#include "defaults.h"
#include "device_info.h"
#include "session.h"

namespace tb {

namespace {

class EventTimer final : public SampleTimer {
 public:
  explicit EventTimer(cudaStream_t stream) : stream_(stream) {}
  void start() override { CUDA_CHECK(cudaEventRecord(begin_, stream_)); }
  double stop() override {
    CUDA_CHECK(cudaEventRecord(end_, stream_));
    CUDA_CHECK(cudaEventSynchronize(end_));
    CUDA_CHECK(cudaGetLastError());  // a launch that failed inside the timed window
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, begin_, end_));
    return static_cast<double>(ms) * 1e-3;
  }

 private:
  cudaStream_t stream_;
  cuda::Event begin_, end_;
};

// Overwrites twice the L2 on the benchmark's stream, so the next sample reads from HBM.
class L2Flusher final : public CacheFlusher {
 public:
  L2Flusher(cudaStream_t stream, std::size_t bytes) : stream_(stream), buffer_(bytes) {}
  void flush() override { CUDA_CHECK(cudaMemsetAsync(buffer_.data(), ++value_, buffer_.bytes(), stream_)); }
  void wait() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_;
  cuda::DeviceBuffer<unsigned char> buffer_;
  int value_ = 0;
};

class CudaSession final : public BackendSession {
 public:
  explicit CudaSession(int device) : device_(selected(device)) {
    context_.cuda_device = device;
    context_.cuda_stream = stream_.get();
    timer_ = std::make_unique<EventTimer>(stream_.get());
    int l2 = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
    flusher_ = std::make_unique<L2Flusher>(stream_.get(), std::max<std::size_t>(2u * l2, 1u << 20));
  }
  const RunContext& context() const override { return context_; }
  SampleTimer& timer() override { return *timer_; }
  CacheFlusher& flusher() override { return *flusher_; }
  double min_sample_s() const override { return defaults::cuda_min_sample_s; }

 private:
  static int selected(int device) {
    select_cuda_device(device);
    return device;
  }

  // Declared before every CUDA resource: members are made in this order, and a stream, event or
  // buffer belongs to the device that is current when it is created.
  int device_;
  cuda::Stream stream_;
  RunContext context_;
  std::unique_ptr<EventTimer> timer_;
  std::unique_ptr<L2Flusher> flusher_;
};

}  // namespace

std::unique_ptr<BackendSession> make_cuda_session(int cuda_device) { return std::make_unique<CudaSession>(cuda_device); }

}  // namespace tb

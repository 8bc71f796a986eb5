#include "session.h"

#include <vector>

#include "defaults.h"
#include "device_info.h"
#include "error.h"
#include "host_buffer.h"

namespace tb {

namespace {

// Writes and reads a buffer twice the last-level cache, so the next sample starts from DRAM.
class HostCacheFlusher final : public CacheFlusher {
 public:
  explicit HostCacheFlusher(std::size_t bytes) : buffer_(bytes / sizeof(double)) {}
  void flush() override {
    double* p = buffer_.data();
    const auto n = static_cast<long>(buffer_.size());
    double sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
    for (long i = 0; i < n; ++i) {
      p[i] = static_cast<double>(i) * 0.5;
      sum += p[i];
    }
    sink_ = sum;
  }

 private:
  HostBuffer<double> buffer_;
  volatile double sink_ = 0;
};

class CpuSession final : public BackendSession {
 public:
  CpuSession() : flusher_(static_cast<std::size_t>(2 * host_info().l3_bytes)) {}
  const RunContext& context() const override { return context_; }
  SampleTimer& timer() override { return timer_; }
  CacheFlusher& flusher() override { return flusher_; }
  double min_sample_s() const override { return defaults::cpu_min_sample_s; }

 private:
  RunContext context_;
  SteadyTimer timer_;
  HostCacheFlusher flusher_;
};

}  // namespace

std::unique_ptr<BackendSession> make_session(Backend backend, int cuda_device) {
  if (backend == Backend::cpu) return std::make_unique<CpuSession>();
#ifdef TRAINBENCH_HAVE_CUDA
  if (!cuda_status().available())
    throw CallError(__FILE__, __LINE__, "make_session(cuda)", cuda_status().unavailable_reason);
  return make_cuda_session(cuda_device);
#else
  (void)cuda_device;
  throw CallError(__FILE__, __LINE__, "make_session(cuda)", "built without CUDA");
#endif
}

}  // namespace tb

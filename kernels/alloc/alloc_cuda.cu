// CUDA alloc: one step of activations per call, allocated and freed four ways. The kernels are the
// same in all four (a writer per buffer, one reader of all), so the rows differ by the allocator.
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "alloc.h"
#include "runtime/cuda_raii.h"
#include "runtime/defaults.h"

namespace tb::alloc {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The buffers one reader takes by value.
struct BufferList {
  uint32_t* ptr[defaults::alloc_max_buffers];
};

// The layer that produces an activation; it writes only the words the step reads back.
__global__ void produce_kernel(uint32_t* buffer, int64_t words, int64_t step, int64_t index) {
  const int p = static_cast<int>(threadIdx.x);
  if (p < probes_per_buffer) buffer[probe_word(words, p)] = probe_value(step, index, p);
}

// The layer that consumes them all: every probe into the checksum.
__global__ void consume_kernel(BufferList list, int count, int64_t words, unsigned long long* checksum) {
  const int t = static_cast<int>(threadIdx.x);
  if (t < count * probes_per_buffer) {
    const int b = t / probes_per_buffer, p = t % probes_per_buffer;
    atomicAdd(checksum, static_cast<unsigned long long>(list.ptr[b][probe_word(words, p)]));
  }
}

class Steps final : public Instance {
 public:
  Steps(const Problem& p, const RunContext& ctx, Strategy strategy)
      : strategy_(strategy),
        buffers_(p.get_int("buffers")),
        bytes_(p.get_int("buffer_bytes")),
        words_(bytes_ / 4),
        stream_(cuda::as_stream(ctx.cuda_stream)),
        checksum_(1),
        list_{} {
    CUDA_CHECK(cudaMemsetAsync(checksum_.data(), 0, checksum_.bytes(), stream_));
    if (strategy_ == Strategy::reuse) {
      for (int64_t b = 0; b < buffers_; ++b) {
        owned_.emplace_back(static_cast<std::size_t>(words_));
        list_.ptr[b] = owned_.back().data();
      }
    }
    if (strategy_ == Strategy::pool || strategy_ == Strategy::empty_cache) {
      int supported = 0;
      CUDA_CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, ctx.cuda_device));
      TB_REQUIRE(supported, "this device has no stream-ordered memory pools");
      pool_ = std::make_unique<cuda::MemPool>(ctx.cuda_device);
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  ~Steps() override {
    // Buffers a failed step left allocated.
    cudaStreamSynchronize(stream_);
    if (strategy_ == Strategy::reuse) return;
    for (int64_t b = 0; b < buffers_; ++b)
      if (list_.ptr[b]) strategy_ == Strategy::malloc_free ? cudaFree(list_.ptr[b]) : cudaFreeAsync(list_.ptr[b], stream_);
    cudaStreamSynchronize(stream_);
  }

  void run() override {
    const bool allocates = strategy_ != Strategy::reuse;
    if (allocates) {
      const auto t0 = Clock::now();
      for (int64_t b = 0; b < buffers_; ++b) {
        void* ptr = nullptr;
        if (strategy_ == Strategy::malloc_free) CUDA_CHECK(cudaMalloc(&ptr, static_cast<std::size_t>(bytes_)));
        else CUDA_CHECK(cudaMallocFromPoolAsync(&ptr, static_cast<std::size_t>(bytes_), pool_->get(), stream_));
        list_.ptr[b] = static_cast<uint32_t*>(ptr);
      }
      alloc_s_ += seconds_since(t0);
    }
    for (int64_t b = 0; b < buffers_; ++b) produce_kernel<<<1, 32, 0, stream_>>>(list_.ptr[b], words_, step_, b);
    consume_kernel<<<1, 32 * ((buffers_ * probes_per_buffer + 31) / 32), 0, stream_>>>(list_, static_cast<int>(buffers_),
                                                                                       words_, checksum_.data());
    if (allocates) {
      const auto t0 = Clock::now();
      for (int64_t b = 0; b < buffers_; ++b) {
        if (strategy_ == Strategy::malloc_free) CUDA_CHECK(cudaFree(list_.ptr[b]));
        else CUDA_CHECK(cudaFreeAsync(list_.ptr[b], stream_));
        list_.ptr[b] = nullptr;
      }
      free_s_ += seconds_since(t0);
    }
    if (strategy_ == Strategy::empty_cache) {
      // torch.cuda.empty_cache(): wait for everything queued, then hand the cached memory back.
      const auto t0 = Clock::now();
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      const auto t1 = Clock::now();
      CUDA_CHECK(cudaMemPoolTrimTo(pool_->get(), 0));
      release_s_ += seconds_since(t1);
      stall_s_ += std::chrono::duration<double>(t1 - t0).count();
    }
    ++step_;
  }

  Verdict check() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaGetLastError());
    unsigned long long got = 0;
    CUDA_CHECK(cudaMemcpy(&got, checksum_.data(), sizeof got, cudaMemcpyDeviceToHost));
    return check_checksum(got, reference_checksum(step_, buffers_), step_);
  }

  std::vector<std::pair<std::string, double>> observed() const override {
    if (step_ == 0 || strategy_ == Strategy::reuse) return {};
    const double steps = static_cast<double>(step_), allocations = steps * static_cast<double>(buffers_);
    std::vector<std::pair<std::string, double>> out{{"alloc_us_per_buffer", 1e6 * alloc_s_ / allocations},
                                                    {"free_us_per_buffer", 1e6 * free_s_ / allocations}};
    if (strategy_ == Strategy::empty_cache) {
      out.emplace_back("sync_stall_us", 1e6 * stall_s_ / steps);
      out.emplace_back("release_us", 1e6 * release_s_ / steps);
    }
    return out;
  }

 private:
  Strategy strategy_;
  int64_t buffers_, bytes_, words_;
  cudaStream_t stream_;
  cuda::DeviceBuffer<unsigned long long> checksum_;
  BufferList list_;
  std::vector<cuda::DeviceBuffer<uint32_t>> owned_;  // reuse
  std::unique_ptr<cuda::MemPool> pool_;              // pool, empty_cache
  int64_t step_ = 0;
  double alloc_s_ = 0, free_s_ = 0, stall_s_ = 0, release_s_ = 0;
};

}  // namespace

std::unique_ptr<Instance> make_cuda(const Problem& problem, const RunContext& context, Strategy strategy) {
  TB_REQUIRE(shape_reason(problem.get_int("buffers"), problem.get_int("buffer_bytes")).empty(),
             shape_reason(problem.get_int("buffers"), problem.get_int("buffer_bytes")));
  return std::make_unique<Steps>(problem, context, strategy);
}

}  // namespace tb::alloc

// RAII for every CUDA resource: device and pinned buffers, streams, events, cuBLAS and cuSPARSE
// handles. Move-only; destructors release without throwing (a failing free cannot be recovered).
#pragma once

#include <cstddef>
#include <utility>

#include "cuda_check.h"

namespace tb::cuda {

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t count) : count_(count) {
    if (count) CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), count * sizeof(T)));
  }
  ~DeviceBuffer() { if (ptr_) cudaFree(ptr_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(count_, o.count_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* data() const { return ptr_; }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }

 private:
  T* ptr_ = nullptr;
  std::size_t count_ = 0;
};

// Page-locked host memory: the only host memory a copy engine reads at full speed asynchronously.
template <class T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t count) : count_(count) {
    if (count) CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&ptr_), count * sizeof(T)));
  }
  ~PinnedBuffer() { if (ptr_) cudaFreeHost(ptr_); }
  PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(count_, o.count_);
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  T* data() const { return ptr_; }
  T& operator[](std::size_t i) const { return ptr_[i]; }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }

 private:
  T* ptr_ = nullptr;
  std::size_t count_ = 0;
};

// Owns a handle `H` created by `Create` and released by `Destroy`.
template <class H, class Traits>
class Handle {
 public:
  Handle() { Traits::create(&h_); }
  ~Handle() { if (h_) Traits::destroy(h_); }
  Handle(Handle&& o) noexcept : h_(std::exchange(o.h_, H{})) {}
  Handle& operator=(Handle&& o) noexcept {
    std::swap(h_, o.h_);
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  H get() const { return h_; }
  operator H() const { return h_; }

 private:
  H h_{};
};

struct StreamTraits {
  // Non-blocking: the benchmark's stream does not serialise with the legacy default stream.
  static void create(cudaStream_t* s) { CUDA_CHECK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking)); }
  static void destroy(cudaStream_t s) { cudaStreamDestroy(s); }
};
struct EventTraits {
  static void create(cudaEvent_t* e) { CUDA_CHECK(cudaEventCreate(e)); }
  static void destroy(cudaEvent_t e) { cudaEventDestroy(e); }
};
struct CublasTraits {
  static void create(cublasHandle_t* h) { CUBLAS_CHECK(cublasCreate(h)); }
  static void destroy(cublasHandle_t h) { cublasDestroy(h); }
};
struct CusparseTraits {
  static void create(cusparseHandle_t* h) { CUSPARSE_CHECK(cusparseCreate(h)); }
  static void destroy(cusparseHandle_t h) { cusparseDestroy(h); }
};

using Stream = Handle<cudaStream_t, StreamTraits>;
using Event = Handle<cudaEvent_t, EventTraits>;
using CublasHandle = Handle<cublasHandle_t, CublasTraits>;
using CusparseHandle = Handle<cusparseHandle_t, CusparseTraits>;

inline cudaStream_t as_stream(void* opaque) { return static_cast<cudaStream_t>(opaque); }

}  // namespace tb::cuda

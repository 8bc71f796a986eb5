// RAII for every CUDA resource: device and pinned buffers, memory pools, streams, events, cuBLAS and
// cuSPARSE handles, graphs and a capture in progress. Move-only; destructors release without
// throwing (a failing free cannot be recovered).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
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
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
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
  ~PinnedBuffer() {
    if (ptr_) cudaFreeHost(ptr_);
  }
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

// A stream-ordered memory pool of its own (cudaMallocFromPoolAsync), so that its release threshold
// and trims touch nothing else. It keeps what it mapped across synchronisations, as PyTorch's caching
// allocator does: the device's default pool (threshold 0) hands memory back to the driver at every
// synchronise and maps it afresh at the next allocation, a cost a PyTorch program does not pay.
class MemPool {
 public:
  MemPool() = default;
  explicit MemPool(int device) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
    uint64_t keep = UINT64_MAX;
    const cudaError_t err = cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep);
    if (err != cudaSuccess) cudaMemPoolDestroy(std::exchange(pool_, nullptr));
    CUDA_CHECK(err);
  }
  ~MemPool() {
    if (pool_) cudaMemPoolDestroy(pool_);
  }
  MemPool(MemPool&& o) noexcept : pool_(std::exchange(o.pool_, nullptr)) {}
  MemPool& operator=(MemPool&& o) noexcept {
    std::swap(pool_, o.pool_);
    return *this;
  }
  MemPool(const MemPool&) = delete;
  MemPool& operator=(const MemPool&) = delete;
  cudaMemPool_t get() const { return pool_; }
  // Bytes the pool holds mapped from the driver now, in use or kept for reuse (this process's own
  // figure: the device's free memory also moves with every other process on the GPU).
  uint64_t reserved_bytes() const {
    uint64_t bytes = 0;
    if (pool_) CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &bytes));
    return bytes;
  }

 private:
  cudaMemPool_t pool_ = nullptr;
};

// Owns a handle `H` created by `Create` and released by `Destroy`.
template <class H, class Traits>
class Handle {
 public:
  Handle() { Traits::create(&h_); }
  ~Handle() {
    if (h_) Traits::destroy(h_);
  }
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

// A captured graph and its executable form.
class Graph {
 public:
  Graph() = default;
  explicit Graph(cudaGraph_t graph) : graph_(graph) {}
  ~Graph() {
    if (graph_) cudaGraphDestroy(graph_);
  }
  Graph(Graph&& o) noexcept : graph_(std::exchange(o.graph_, nullptr)) {}
  Graph& operator=(Graph&& o) noexcept {
    std::swap(graph_, o.graph_);
    return *this;
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  cudaGraph_t get() const { return graph_; }

 private:
  cudaGraph_t graph_ = nullptr;
};

class GraphExec {
 public:
  GraphExec() = default;
  explicit GraphExec(const Graph& graph) { CUDA_CHECK(cudaGraphInstantiate(&exec_, graph.get(), 0)); }
  // An executable graph still in flight is freed when it completes (cudaGraphExecDestroy).
  ~GraphExec() {
    if (exec_) cudaGraphExecDestroy(exec_);
  }
  GraphExec(GraphExec&& o) noexcept : exec_(std::exchange(o.exec_, nullptr)) {}
  GraphExec& operator=(GraphExec&& o) noexcept {
    std::swap(exec_, o.exec_);
    return *this;
  }
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  cudaGraphExec_t get() const { return exec_; }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

// A stream capture in progress. Left without end() (an exception from the work being captured), it
// ends the capture and drops the partial graph: a stream left capturing fails every later call.
class CaptureScope {
 public:
  // Thread-local mode: other threads' CUDA calls are not affected by this capture.
  explicit CaptureScope(cudaStream_t stream) : stream_(stream) {
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  }
  ~CaptureScope() {
    if (!open_) return;
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(stream_, &partial);
    if (partial) cudaGraphDestroy(partial);
    // The error in flight is the exception's; left as the thread's last error it would fail the
    // next launch check.
    (void)cudaGetLastError();
  }
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;
  // Fails when the capture was invalidated by a call that did not report it (the stream is no
  // longer capturing either way).
  Graph end() {
    open_ = false;
    cudaGraph_t graph = nullptr;
    const cudaError_t err = cudaStreamEndCapture(stream_, &graph);
    Graph owned(graph);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      throw ::tb::CallError(__FILE__, __LINE__, "cudaStreamEndCapture(stream_, &graph)",
                            std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")");
    }
    return owned;
  }

 private:
  cudaStream_t stream_;
  bool open_ = true;
};

inline cudaStream_t as_stream(void* opaque) { return static_cast<cudaStream_t>(opaque); }

}  // namespace tb::cuda

// CUDA ceilings: device copy and triad (what a memory-bound kernel can reach), host<->device copies
// pinned and pageable (what a data loader can reach), cuBLAS GEMM in fp32, tf32 and bf16 (what a
// compute-bound kernel can reach).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "peak.h"
#include "runtime/cuda_fill.cuh"
#include "runtime/cuda_raii.h"
#include "runtime/host_buffer.h"
#include "runtime/random.h"

namespace tb::peak {

namespace {

constexpr int block_size = 256;

// Enough resident blocks to keep every SM's memory pipeline full, and no more (grid-stride loops).
int stream_grid(int64_t work_items, int device) { return cuda::grid_for(work_items, block_size, device); }

// 16-byte accesses (double2) for the bulk: fewer memory instructions per byte than scalar loads.
__global__ void copy_kernel(const double* __restrict__ src, double* __restrict__ dst, int64_t n) {
  const int64_t pairs = n / 2;
  const auto* s2 = reinterpret_cast<const double2*>(src);
  auto* d2 = reinterpret_cast<double2*>(dst);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < pairs; i += int64_t{gridDim.x} * blockDim.x)
    d2[i] = s2[i];
  if (blockIdx.x == 0 && threadIdx.x == 0 && (n & 1)) dst[n - 1] = src[n - 1];
}

__global__ void triad_kernel(double* __restrict__ a, const double* __restrict__ b, const double* __restrict__ c,
                             double s, int64_t n) {
  const int64_t pairs = n / 2;
  auto* a2 = reinterpret_cast<double2*>(a);
  const auto* b2 = reinterpret_cast<const double2*>(b);
  const auto* c2 = reinterpret_cast<const double2*>(c);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < pairs; i += int64_t{gridDim.x} * blockDim.x) {
    const double2 bv = b2[i], cv = c2[i];
    a2[i] = make_double2(bv.x + s * cv.x, bv.y + s * cv.y);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0 && (n & 1)) a[n - 1] = b[n - 1] + s * c[n - 1];
}

std::vector<double> download(const double* device_ptr, int64_t n, cudaStream_t stream) {
  std::vector<double> host(static_cast<std::size_t>(n));
  CUDA_CHECK(cudaMemcpyAsync(host.data(), device_ptr, n * sizeof(double), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

class DeviceStream : public Instance {
 public:
  DeviceStream(int64_t n, const RunContext& ctx)
      : n_(n), stream_(cuda::as_stream(ctx.cuda_stream)), grid_(stream_grid(std::max<int64_t>(n / 2, 1), ctx.cuda_device)),
        a_(n), b_(n), c_(n) {
    CUDA_CHECK(cudaMemsetAsync(a_.data(), 0, a_.bytes(), stream_));
    cuda::fill_uniform(b_.data(), n, seed_b, stream_, ctx.cuda_device);
    cuda::fill_uniform(c_.data(), n, seed_c, stream_, ctx.cuda_device);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 protected:
  int64_t n_;
  cudaStream_t stream_;
  int grid_;
  cuda::DeviceBuffer<double> a_, b_, c_;
};

class Copy final : public DeviceStream {
 public:
  using DeviceStream::DeviceStream;
  void run() override { copy_kernel<<<grid_, block_size, 0, stream_>>>(b_.data(), a_.data(), n_); }
  Verdict check() override {
    CUDA_CHECK(cudaGetLastError());
    const auto a = download(a_.data(), n_, stream_), b = download(b_.data(), n_, stream_);
    return check_copy(a.data(), b.data(), n_);
  }
};

class Triad final : public DeviceStream {
 public:
  using DeviceStream::DeviceStream;
  void run() override { triad_kernel<<<grid_, block_size, 0, stream_>>>(a_.data(), b_.data(), c_.data(), triad_scalar, n_); }
  Verdict check() override {
    CUDA_CHECK(cudaGetLastError());
    const auto a = download(a_.data(), n_, stream_), b = download(b_.data(), n_, stream_),
               c = download(c_.data(), n_, stream_);
    return check_triad(a.data(), b.data(), c.data(), n_);
  }
};

// One cudaMemcpyAsync. Pageable host memory goes through the driver's staging buffer, which is the
// cost a loader without pin_memory pays.
class Transfer final : public Instance {
 public:
  Transfer(int64_t bytes, const RunContext& ctx, bool to_device, bool pinned)
      : words_(static_cast<std::size_t>(bytes / 4)), to_device_(to_device), pinned_(pinned),
        stream_(cuda::as_stream(ctx.cuda_stream)), device_(words_) {
    if (pinned) pinned_host_ = cuda::PinnedBuffer<uint32_t>(words_);
    else pageable_host_ = HostBuffer<uint32_t>(words_);
    uint32_t* host = host_ptr();
    for (std::size_t i = 0; i < words_; ++i) host[i] = static_cast<uint32_t>(splitmix64(i));
    if (!to_device) {  // the device holds the pattern; the host buffer starts cleared
      // On the benchmark's stream (the legacy stream's copy is not ordered with it), and landed
      // before the host buffer is cleared: from pinned memory the copy is truly asynchronous.
      CUDA_CHECK(cudaMemcpyAsync(device_.data(), host, device_.bytes(), cudaMemcpyHostToDevice, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      std::memset(host, 0, words_ * 4);
    }
  }
  void run() override {
    if (to_device_)
      CUDA_CHECK(cudaMemcpyAsync(device_.data(), host_ptr(), device_.bytes(), cudaMemcpyHostToDevice, stream_));
    else
      CUDA_CHECK(cudaMemcpyAsync(host_ptr(), device_.data(), device_.bytes(), cudaMemcpyDeviceToHost, stream_));
  }
  Verdict check() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<uint32_t> seen(words_);
    if (to_device_) CUDA_CHECK(cudaMemcpy(seen.data(), device_.data(), device_.bytes(), cudaMemcpyDeviceToHost));
    else std::memcpy(seen.data(), host_ptr(), words_ * 4);
    for (std::size_t i = 0; i < words_; ++i) {
      const auto want = static_cast<uint32_t>(splitmix64(i));
      if (seen[i] != want)
        return Verdict{false, 1.0, "word " + std::to_string(i) + " = " + std::to_string(seen[i]) + ", expected " +
                                       std::to_string(want)};
    }
    return Verdict{true, 0.0, ""};
  }

 private:
  uint32_t* host_ptr() { return pinned_ ? pinned_host_.data() : pageable_host_.data(); }
  std::size_t words_;
  bool to_device_, pinned_;
  cudaStream_t stream_;
  cuda::DeviceBuffer<uint32_t> device_;
  cuda::PinnedBuffer<uint32_t> pinned_host_;
  HostBuffer<uint32_t> pageable_host_;
};

// cuBLAS GEMM, C = A * B, n x n column-major. fp32 with the default math mode (no tensor cores),
// tf32 through CUBLAS_COMPUTE_32F_FAST_TF32, bf16 inputs and output with fp32 accumulation.
class Gemm final : public Instance {
 public:
  Gemm(int64_t n, const RunContext& ctx, GemmType type)
      : n_(n), type_(type), stream_(cuda::as_stream(ctx.cuda_stream)) {
    const auto elems = static_cast<std::size_t>(n * n);
    if (type == GemmType::bf16) {
      a16_ = cuda::DeviceBuffer<__nv_bfloat16>(elems);
      b16_ = cuda::DeviceBuffer<__nv_bfloat16>(elems);
      c16_ = cuda::DeviceBuffer<__nv_bfloat16>(elems);
      cuda::fill_uniform(a16_.data(), n * n, seed_a, stream_, ctx.cuda_device);
      cuda::fill_uniform(b16_.data(), n * n, seed_b, stream_, ctx.cuda_device);
    } else {
      a32_ = cuda::DeviceBuffer<float>(elems);
      b32_ = cuda::DeviceBuffer<float>(elems);
      c32_ = cuda::DeviceBuffer<float>(elems);
      cuda::fill_uniform(a32_.data(), n * n, seed_a, stream_, ctx.cuda_device);
      cuda::fill_uniform(b32_.data(), n * n, seed_b, stream_, ctx.cuda_device);
    }
    CUBLAS_CHECK(cublasSetStream(handle_, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void run() override {
    const int n = static_cast<int>(n_);
    const float alpha = 1.0f, beta = 0.0f;
    if (type_ == GemmType::bf16) {
      CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a16_.data(), CUDA_R_16BF, n,
                                b16_.data(), CUDA_R_16BF, n, &beta, c16_.data(), CUDA_R_16BF, n,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
      const auto compute = type_ == GemmType::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a32_.data(), CUDA_R_32F, n,
                                b32_.data(), CUDA_R_32F, n, &beta, c32_.data(), CUDA_R_32F, n, compute,
                                CUBLAS_GEMM_DEFAULT));
    }
  }
  Verdict check() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    const auto where = gemm_check_positions(n_);
    std::vector<double> got;
    for (const auto& [i, j] : where) {
      const std::size_t at = static_cast<std::size_t>(i + j * n_);
      if (type_ == GemmType::bf16) {
        uint16_t bits = 0;
        CUDA_CHECK(cudaMemcpy(&bits, c16_.data() + at, sizeof bits, cudaMemcpyDeviceToHost));
        got.push_back(bf16_bits_to_float(bits));
      } else {
        float value = 0;
        CUDA_CHECK(cudaMemcpy(&value, c32_.data() + at, sizeof value, cudaMemcpyDeviceToHost));
        got.push_back(value);
      }
    }
    return check_gemm_entries(n_, type_, where, got);
  }

 private:
  int64_t n_;
  GemmType type_;
  cudaStream_t stream_;
  cuda::CublasHandle handle_;
  cuda::DeviceBuffer<float> a32_, b32_, c32_;
  cuda::DeviceBuffer<__nv_bfloat16> a16_, b16_, c16_;
};

}  // namespace

std::unique_ptr<Instance> make_cuda_copy(const Problem& p, const RunContext& ctx) {
  return std::make_unique<Copy>(p.get_int("n"), ctx);
}
std::unique_ptr<Instance> make_cuda_triad(const Problem& p, const RunContext& ctx) {
  return std::make_unique<Triad>(p.get_int("n"), ctx);
}
std::unique_ptr<Instance> make_cuda_transfer(const Problem& p, const RunContext& ctx, bool to_device, bool pinned) {
  return std::make_unique<Transfer>(p.get_int("transfer_bytes"), ctx, to_device, pinned);
}
std::unique_ptr<Instance> make_cuda_gemm(const Problem& p, const RunContext& ctx, GemmType type) {
  return std::make_unique<Gemm>(p.get_int("gemm_n"), ctx, type);
}

}  // namespace tb::peak

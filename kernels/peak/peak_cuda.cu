// CUDA ceilings: device copy and triad (what a memory-bound kernel can reach), host<->device copies
// pinned and pageable (what a data loader can reach), cuBLAS GEMM in fp32, tf32 and bf16 (what a
// compute-bound kernel can reach). A ceiling is the best this machine shows, so each row searches
// before it is timed: the copy and triad over their kernels' sizes (and cudaMemcpyAsync for the
// copy), the GEMMs over cuBLASLt's heuristic candidates (and cublasGemmEx's default), each candidate
// timed on the row's own data; the row then times the fastest and names it in its counters.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "peak.h"
#include "runtime/cuda_fill.cuh"
#include "runtime/cuda_lt.h"
#include "runtime/cuda_raii.h"
#include "runtime/host_buffer.h"
#include "runtime/random.h"

namespace tb::peak {

namespace {

constexpr int block_size = 256;
constexpr int search_calls = 3;                          // timed calls per candidate (the fastest counts)
constexpr std::size_t gemm_workspace_bytes = 32u << 20;  // what cuBLAS recommends on Hopper, PyTorch's too

// Enough resident blocks to keep every SM's memory pipeline full, and no more (grid-stride loops).
int stream_grid(int64_t work_items, int device) { return cuda::grid_for(work_items, block_size, device); }
// A full machine of resident 256-thread blocks: 8 per SM (2048 threads).
int resident_grid(int device) {
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms * 8;
}

// 16-byte accesses (double2), Unroll of them in flight per thread before the first store: more
// bytes outstanding per thread than one load at a time. Pairs past the last full round go one by one.
template <int Unroll>
__global__ void copy_kernel(const double* __restrict__ src, double* __restrict__ dst, int64_t n) {
  const int64_t pairs = n / 2, stride = int64_t{gridDim.x} * blockDim.x;
  const auto* s2 = reinterpret_cast<const double2*>(src);
  auto* d2 = reinterpret_cast<double2*>(dst);
  int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  for (; i + (Unroll - 1) * stride < pairs; i += Unroll * stride) {
    double2 v[Unroll];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) v[u] = s2[i + u * stride];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) d2[i + u * stride] = v[u];
  }
  for (; i < pairs; i += stride) d2[i] = s2[i];
  if (blockIdx.x == 0 && threadIdx.x == 0 && (n & 1)) dst[n - 1] = src[n - 1];
}

template <int Unroll>
__global__ void triad_kernel(double* __restrict__ a, const double* __restrict__ b, const double* __restrict__ c, double s,
                             int64_t n) {
  const int64_t pairs = n / 2, stride = int64_t{gridDim.x} * blockDim.x;
  auto* a2 = reinterpret_cast<double2*>(a);
  const auto* b2 = reinterpret_cast<const double2*>(b);
  const auto* c2 = reinterpret_cast<const double2*>(c);
  int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  for (; i + (Unroll - 1) * stride < pairs; i += Unroll * stride) {
    double2 bv[Unroll], cv[Unroll];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
      bv[u] = b2[i + u * stride];
      cv[u] = c2[i + u * stride];
    }
#pragma unroll
    for (int u = 0; u < Unroll; ++u) a2[i + u * stride] = make_double2(bv[u].x + s * cv[u].x, bv[u].y + s * cv[u].y);
  }
  for (; i < pairs; i += stride) a2[i] = make_double2(b2[i].x + s * c2[i].x, b2[i].y + s * c2[i].y);
  if (blockIdx.x == 0 && threadIdx.x == 0 && (n & 1)) a[n - 1] = b[n - 1] + s * c[n - 1];
}

// One way to do a row's work, by name.
struct Candidate {
  std::string name;
  std::function<void()> run;
};

// The fastest of `candidates` on `stream` (each warmed up once, then the fastest of search_calls
// timed calls; a warm-up of the first keeps the clocks from favouring the later ones): its index.
// The row's counters name it; every candidate computes the same result, which check() verifies.
std::size_t fastest(const std::vector<Candidate>& candidates, cudaStream_t stream) {
  cuda::Event start, stop;
  for (int i = 0; i < 10; ++i) candidates.front().run();
  std::size_t best = 0;
  float best_ms = 0;
  for (std::size_t c = 0; c < candidates.size(); ++c) {
    candidates[c].run();
    float least = 0;
    for (int k = 0; k < search_calls; ++k) {
      CUDA_CHECK(cudaEventRecord(start, stream));
      candidates[c].run();
      CUDA_CHECK(cudaEventRecord(stop, stream));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      least = k == 0 ? ms : std::min(least, ms);
    }
    if (c == 0 || least < best_ms) best = c, best_ms = least;
  }
  return best;
}

std::vector<double> download(const double* device_ptr, int64_t n, cudaStream_t stream) {
  std::vector<double> host(static_cast<std::size_t>(n));
  CUDA_CHECK(cudaMemcpyAsync(host.data(), device_ptr, n * sizeof(double), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

// The STREAM rows: the candidates are the kernel at two sizes of grid (the default's, and a full
// machine of resident blocks) by one or four 16-byte accesses in flight per thread, plus, for the
// copy, cudaMemcpyAsync (the driver's copy, what PyTorch's device copy reaches).
class DeviceStream : public Instance {
 public:
  DeviceStream(int64_t n, const RunContext& ctx)
      : n_(n), stream_(cuda::as_stream(ctx.cuda_stream)), device_(ctx.cuda_device), a_(n), b_(n), c_(n) {
    CUDA_CHECK(cudaMemsetAsync(a_.data(), 0, a_.bytes(), stream_));
    cuda::fill_uniform(b_.data(), n, seed_b, stream_, ctx.cuda_device);
    cuda::fill_uniform(c_.data(), n, seed_c, stream_, ctx.cuda_device);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void run() override { candidates_[chosen_].run(); }
  std::vector<std::pair<std::string, double>> observed() const override {
    return {{"candidates_searched", static_cast<double>(candidates_.size())},
            {"chosen_candidate", static_cast<double>(chosen_)}};
  }
  std::string configuration() const override { return candidates_[chosen_].name; }

 protected:
  // Adds the kernel `k` at both grids, Unroll in its name.
  template <class Kernel, class... Args>
  void add_kernel(const char* what, int unroll, Kernel k, Args... args) {
    const int grids[] = {stream_grid(std::max<int64_t>(n_ / 2, 1), device_), resident_grid(device_)};
    for (const int grid : grids)
      candidates_.push_back(
          Candidate{std::string(what) + " x" + std::to_string(unroll) + " grid " + std::to_string(grid), [=, s = stream_] {
                      k<<<grid, block_size, 0, s>>>(args...);
                      CUDA_CHECK(cudaGetLastError());
                    }});
  }
  void choose() { chosen_ = fastest(candidates_, stream_); }

  int64_t n_;
  cudaStream_t stream_;
  int device_;
  cuda::DeviceBuffer<double> a_, b_, c_;
  std::vector<Candidate> candidates_;
  std::size_t chosen_ = 0;
};

class Copy final : public DeviceStream {
 public:
  Copy(int64_t n, const RunContext& ctx) : DeviceStream(n, ctx) {
    add_kernel("copy kernel", 1, copy_kernel<1>, b_.data(), a_.data(), n_);
    add_kernel("copy kernel", 4, copy_kernel<4>, b_.data(), a_.data(), n_);
    candidates_.push_back(
        Candidate{"cudaMemcpyAsync", [this] {
                    CUDA_CHECK(cudaMemcpyAsync(a_.data(), b_.data(), b_.bytes(), cudaMemcpyDeviceToDevice, stream_));
                  }});
    choose();
  }
  Verdict check() override {
    CUDA_CHECK(cudaGetLastError());
    const auto a = download(a_.data(), n_, stream_), b = download(b_.data(), n_, stream_);
    return check_copy(a.data(), b.data(), n_);
  }
};

class Triad final : public DeviceStream {
 public:
  Triad(int64_t n, const RunContext& ctx) : DeviceStream(n, ctx) {
    add_kernel("triad kernel", 1, triad_kernel<1>, a_.data(), b_.data(), c_.data(), triad_scalar, n_);
    add_kernel("triad kernel", 4, triad_kernel<4>, a_.data(), b_.data(), c_.data(), triad_scalar, n_);
    choose();
  }
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
      : words_(static_cast<std::size_t>(bytes / 4)),
        to_device_(to_device),
        pinned_(pinned),
        stream_(cuda::as_stream(ctx.cuda_stream)),
        device_(words_) {
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
    else CUDA_CHECK(cudaMemcpyAsync(host_ptr(), device_.data(), device_.bytes(), cudaMemcpyDeviceToHost, stream_));
  }
  Verdict check() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<uint32_t> seen(words_);
    if (to_device_) CUDA_CHECK(cudaMemcpy(seen.data(), device_.data(), device_.bytes(), cudaMemcpyDeviceToHost));
    else std::memcpy(seen.data(), host_ptr(), words_ * 4);
    for (std::size_t i = 0; i < words_; ++i) {
      const auto want = static_cast<uint32_t>(splitmix64(i));
      if (seen[i] != want)
        return Verdict{false, 1.0,
                       "word " + std::to_string(i) + " = " + std::to_string(seen[i]) + ", expected " + std::to_string(want)};
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

// cuBLAS GEMM, C = A * B, n x n column-major: fp32 with the default math mode (no tensor cores),
// tf32 through CUBLAS_COMPUTE_32F_FAST_TF32, bf16 inputs and output with fp32 accumulation. The
// candidates: cublasGemmEx's default choice, and cuBLASLt's heuristic top `lt_candidates` algorithms
// with a 32 MiB workspace (the heuristic's first is not always the fastest on the machine at hand).
constexpr int lt_candidates = 8;

using cuda::MatmulDesc;
using cuda::MatmulPreference;
using cuda::MatrixLayout;

class Gemm final : public Instance {
 public:
  Gemm(int64_t n, const RunContext& ctx, GemmType type)
      : n_(n), type_(type), stream_(cuda::as_stream(ctx.cuda_stream)), workspace_(gemm_workspace_bytes) {
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
    CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_.data(), workspace_.bytes()));
    CUDA_CHECK(cudaStreamSynchronize(stream_));

    candidates_.push_back(Candidate{"cublasGemmEx default", [this] { gemm_ex(); }});
    add_lt_candidates();
    chosen_ = fastest(candidates_, stream_);
  }
  void run() override { candidates_[chosen_].run(); }
  std::string configuration() const override { return candidates_[chosen_].name; }
  std::vector<std::pair<std::string, double>> observed() const override {
    return {{"candidates_searched", static_cast<double>(candidates_.size())},
            {"chosen_candidate", static_cast<double>(chosen_)}};
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
  cublasComputeType_t compute() const { return type_ == GemmType::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F; }
  cudaDataType element() const { return type_ == GemmType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }
  const void* a() const { return type_ == GemmType::bf16 ? static_cast<const void*>(a16_.data()) : a32_.data(); }
  const void* b() const { return type_ == GemmType::bf16 ? static_cast<const void*>(b16_.data()) : b32_.data(); }
  void* c() const { return type_ == GemmType::bf16 ? static_cast<void*>(c16_.data()) : c32_.data(); }

  void gemm_ex() {
    const int n = static_cast<int>(n_);
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a(), element(), n, b(), element(), n,
                              &beta, c(), element(), n, compute(), CUBLAS_GEMM_DEFAULT));
  }

  // The heuristic's candidates for this problem and workspace, each a way to run the row.
  void add_lt_candidates() {
    cublasLtMatmulDesc_t desc = nullptr;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, compute(), CUDA_R_32F));
    desc_ = MatmulDesc(desc);
    cublasLtMatrixLayout_t layout = nullptr;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, element(), static_cast<uint64_t>(n_), static_cast<uint64_t>(n_), n_));
    layout_ = MatrixLayout(layout);  // A, B and C: n x n, column-major, leading dimension n
    cublasLtMatmulPreference_t preference = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    const MatmulPreference owned(preference);
    const std::size_t workspace = workspace_.bytes();
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                      sizeof workspace));
    heuristics_.resize(lt_candidates);
    int returned = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt_, desc, layout, layout, layout, layout, preference, lt_candidates,
                                                heuristics_.data(), &returned));
    heuristics_.resize(static_cast<std::size_t>(returned));
    for (std::size_t h = 0; h < heuristics_.size(); ++h) {
      if (heuristics_[h].state != CUBLAS_STATUS_SUCCESS) continue;
      int id = -1, tile = -1, stages = -1, split_k = -1;
      std::size_t written = 0;
      const cublasLtMatmulAlgo_t& algo = heuristics_[h].algo;
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &written);
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &written);
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &written);
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split_k, sizeof split_k, &written);
      candidates_.push_back(Candidate{"cuBLASLt heuristic #" + std::to_string(h + 1) + " (algo " + std::to_string(id) +
                                          ", tile " + std::to_string(tile) + ", stages " + std::to_string(stages) +
                                          ", split-k " + std::to_string(split_k) + ")",
                                      [this, h] { lt_matmul(heuristics_[h].algo); }});
    }
  }
  void lt_matmul(const cublasLtMatmulAlgo_t& algo) {
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(lt_, desc_.get(), &alpha, a(), layout_.get(), b(), layout_.get(), &beta, c(), layout_.get(),
                                c(), layout_.get(), &algo, workspace_.data(), workspace_.bytes(), stream_));
  }

  int64_t n_;
  GemmType type_;
  cudaStream_t stream_;
  cuda::CublasHandle handle_;
  cuda::LtHandle lt_;
  cuda::DeviceBuffer<unsigned char> workspace_;
  cuda::DeviceBuffer<float> a32_, b32_, c32_;
  cuda::DeviceBuffer<__nv_bfloat16> a16_, b16_, c16_;
  MatmulDesc desc_;
  MatrixLayout layout_;
  std::vector<cublasLtMatmulHeuristicResult_t> heuristics_;
  std::vector<Candidate> candidates_;
  std::size_t chosen_ = 0;
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

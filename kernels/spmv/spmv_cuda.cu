// CUDA `spmv`: cuSPARSE's CSR SpMV and SpMM through the generic API (the library baseline), the own
// CSR kernel (a group of lanes per row, sized to the row length), the matrix-free stencil (16 B per
// row), and an own CSR SpMM over row-major right-hand sides.
#include <algorithm>
#include <vector>

#include "runtime/cuda_raii.h"
#include "runtime/defaults.h"
#include "runtime/host_buffer.h"
#include "spmv/csr_device.cuh"
#include "spmv/spmv.h"

namespace tb::spmv {

namespace {

constexpr int block_size = 256;

unsigned blocks_for(int64_t threads) {
  return static_cast<unsigned>(std::max<int64_t>(1, (threads + block_size - 1) / block_size));
}

// One row per group of G lanes; groups never straddle a warp (G divides 32).
template <int G>
__global__ void csr_spmv_kernel(device::CsrView a, const double* __restrict__ x, double* __restrict__ y) {
  const int64_t thread = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t row = thread / G;
  const int lane = static_cast<int>(thread % G);
  const double sum = device::csr_row<G>(a, x, row, lane);
  if (lane == 0 && row < a.n) y[row] = sum;
}

// One row per thread; the neighbours are index arithmetic, so only x and y move.
__global__ void stencil_kernel(laplacian::Stencil s, const double* __restrict__ x, double* __restrict__ y) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < s.n) y[i] = laplacian::stencil_row(s, x, i);
}

// One (row, column) entry of Y per thread, columns fastest: a warp reads contiguous pieces of X's
// rows and shares each row's nonzeros through the cache.
__global__ void csr_spmm_kernel(device::CsrView a, const double* __restrict__ x, double* __restrict__ y, int64_t m) {
  const int64_t total = a.n * m;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < total; t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = t / m, c = t - row * m;
    double sum = 0;
    for (int32_t p = __ldg(a.row_ptr + row); p < __ldg(a.row_ptr + row + 1); ++p)
      sum += __ldg(a.val + p) * x[static_cast<int64_t>(__ldg(a.col + p)) * m + c];
    y[t] = sum;
  }
}

// A cuSPARSE generic-API descriptor, destroyed with its owner.
template <class H, auto destroy>
struct Descriptor {
  H h = nullptr;
  Descriptor() = default;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() {
    if (h) destroy(h);
  }
};
using SpMatDescr = Descriptor<cusparseSpMatDescr_t, cusparseDestroySpMat>;
using DnVecDescr = Descriptor<cusparseDnVecDescr_t, cusparseDestroyDnVec>;
using DnMatDescr = Descriptor<cusparseDnMatDescr_t, cusparseDestroyDnMat>;

// Inputs, output, and (when the variant uses one) the CSR matrix on the device; the check downloads
// y and compares it with the graph's own definition.
class DeviceSpmv : public Instance {
 public:
  DeviceSpmv(const Shape& s, const RunContext& ctx, bool with_csr)
      : shape_(s),
        stream_(cuda::as_stream(ctx.cuda_stream)),
        graph_(s.graph, s.rows),
        entries_(static_cast<std::size_t>(s.rows * s.rhs)),
        x_(entries_),
        y_(entries_) {
    HostBuffer<double> x(entries_);
    fill_input(x.data(), s.rows * s.rhs);
    CUDA_CHECK(cudaMemcpy(x_.data(), x.data(), x.bytes(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(y_.data(), 0, y_.bytes()));
    if (with_csr) a_ = device::upload(laplacian::build_shifted_laplacian(graph_, defaults::laplacian_alpha));
    CUDA_CHECK(cudaDeviceSynchronize());  // the copies ran on the legacy stream, which ours does not wait for
  }
  Verdict check() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaGetLastError());
    std::vector<double> x(entries_), y(entries_);
    CUDA_CHECK(cudaMemcpy(x.data(), x_.data(), x_.bytes(), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(y.data(), y_.data(), y_.bytes(), cudaMemcpyDeviceToHost));
    if (shape_.rhs == 1) return check_spmv(graph_, defaults::laplacian_alpha, x.data(), y.data());
    return check_spmm(graph_, defaults::laplacian_alpha, x.data(), y.data(), shape_.rhs);
  }

 protected:
  Shape shape_;
  cudaStream_t stream_;
  laplacian::Graph graph_;
  std::size_t entries_;
  cuda::DeviceBuffer<double> x_, y_;
  device::DeviceCsr a_;
};

class CusparseCsr final : public DeviceSpmv {
 public:
  CusparseCsr(const Shape& s, const RunContext& ctx) : DeviceSpmv(s, ctx, true) {
    CUSPARSE_CHECK(cusparseSetStream(handle_, stream_));
    CUSPARSE_CHECK(cusparseCreateCsr(&mat_.h, a_.n, a_.n, a_.nnz, a_.row_ptr.data(), a_.col.data(), a_.val.data(),
                                     CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_64F));
    CUSPARSE_CHECK(cusparseCreateDnVec(&x_descr_.h, a_.n, x_.data(), CUDA_R_64F));
    CUSPARSE_CHECK(cusparseCreateDnVec(&y_descr_.h, a_.n, y_.data(), CUDA_R_64F));
    std::size_t bytes = 0;
    CUSPARSE_CHECK(cusparseSpMV_bufferSize(handle_, CUSPARSE_OPERATION_NON_TRANSPOSE, &one_, mat_.h, x_descr_.h, &zero_,
                                           y_descr_.h, CUDA_R_64F, CUSPARSE_SPMV_ALG_DEFAULT, &bytes));
    workspace_ = cuda::DeviceBuffer<unsigned char>(std::max<std::size_t>(bytes, 1));
    CUSPARSE_CHECK(cusparseSpMV_preprocess(handle_, CUSPARSE_OPERATION_NON_TRANSPOSE, &one_, mat_.h, x_descr_.h, &zero_,
                                           y_descr_.h, CUDA_R_64F, CUSPARSE_SPMV_ALG_DEFAULT, workspace_.data()));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void run() override {
    CUSPARSE_CHECK(cusparseSpMV(handle_, CUSPARSE_OPERATION_NON_TRANSPOSE, &one_, mat_.h, x_descr_.h, &zero_, y_descr_.h,
                                CUDA_R_64F, CUSPARSE_SPMV_ALG_DEFAULT, workspace_.data()));
  }

 private:
  const double one_ = 1.0, zero_ = 0.0;
  cuda::CusparseHandle handle_;
  SpMatDescr mat_;
  DnVecDescr x_descr_, y_descr_;
  cuda::DeviceBuffer<unsigned char> workspace_;
};

class OwnCsr final : public DeviceSpmv {
 public:
  OwnCsr(const Shape& s, const RunContext& ctx) : DeviceSpmv(s, ctx, true) {}
  void run() override {
    const device::CsrView a = a_.view();
    const double* x = x_.data();
    double* y = y_.data();
    cudaStream_t stream = stream_;
    device::with_lanes(a_.lanes_per_row, [&](auto lanes) {
      constexpr int G = decltype(lanes)::value;
      csr_spmv_kernel<G><<<blocks_for(a.n * G), block_size, 0, stream>>>(a, x, y);
    });
  }
};

class Stencil final : public DeviceSpmv {
 public:
  Stencil(const Shape& s, const RunContext& ctx)
      : DeviceSpmv(s, ctx, false), stencil_(graph_.stencil(defaults::laplacian_alpha)) {}
  void run() override { stencil_kernel<<<blocks_for(stencil_.n), block_size, 0, stream_>>>(stencil_, x_.data(), y_.data()); }

 private:
  laplacian::Stencil stencil_;
};

class CusparseSpmm final : public DeviceSpmv {
 public:
  CusparseSpmm(const Shape& s, const RunContext& ctx) : DeviceSpmv(s, ctx, true) {
    CUSPARSE_CHECK(cusparseSetStream(handle_, stream_));
    CUSPARSE_CHECK(cusparseCreateCsr(&mat_.h, a_.n, a_.n, a_.nnz, a_.row_ptr.data(), a_.col.data(), a_.val.data(),
                                     CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_64F));
    CUSPARSE_CHECK(cusparseCreateDnMat(&x_descr_.h, a_.n, s.rhs, s.rhs, x_.data(), CUDA_R_64F, CUSPARSE_ORDER_ROW));
    CUSPARSE_CHECK(cusparseCreateDnMat(&y_descr_.h, a_.n, s.rhs, s.rhs, y_.data(), CUDA_R_64F, CUSPARSE_ORDER_ROW));
    std::size_t bytes = 0;
    CUSPARSE_CHECK(cusparseSpMM_bufferSize(handle_, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE,
                                           &one_, mat_.h, x_descr_.h, &zero_, y_descr_.h, CUDA_R_64F,
                                           CUSPARSE_SPMM_ALG_DEFAULT, &bytes));
    workspace_ = cuda::DeviceBuffer<unsigned char>(std::max<std::size_t>(bytes, 1));
    CUSPARSE_CHECK(cusparseSpMM_preprocess(handle_, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE,
                                           &one_, mat_.h, x_descr_.h, &zero_, y_descr_.h, CUDA_R_64F,
                                           CUSPARSE_SPMM_ALG_DEFAULT, workspace_.data()));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void run() override {
    CUSPARSE_CHECK(cusparseSpMM(handle_, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &one_, mat_.h,
                                x_descr_.h, &zero_, y_descr_.h, CUDA_R_64F, CUSPARSE_SPMM_ALG_DEFAULT, workspace_.data()));
  }

 private:
  const double one_ = 1.0, zero_ = 0.0;
  cuda::CusparseHandle handle_;
  SpMatDescr mat_;
  DnMatDescr x_descr_, y_descr_;
  cuda::DeviceBuffer<unsigned char> workspace_;
};

class OwnSpmm final : public DeviceSpmv {
 public:
  OwnSpmm(const Shape& s, const RunContext& ctx) : DeviceSpmv(s, ctx, true) {
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx.cuda_device));
    blocks_ = std::min<unsigned>(blocks_for(s.rows * s.rhs), static_cast<unsigned>(sms) * 32u);
  }
  void run() override { csr_spmm_kernel<<<blocks_, block_size, 0, stream_>>>(a_.view(), x_.data(), y_.data(), shape_.rhs); }

 private:
  unsigned blocks_ = 1;
};

}  // namespace

std::unique_ptr<Instance> make_cuda_cusparse_csr(const Problem& p, const RunContext& ctx) {
  return std::make_unique<CusparseCsr>(shape_of(p), ctx);
}
std::unique_ptr<Instance> make_cuda_csr(const Problem& p, const RunContext& ctx) {
  return std::make_unique<OwnCsr>(shape_of(p), ctx);
}
std::unique_ptr<Instance> make_cuda_stencil(const Problem& p, const RunContext& ctx) {
  return std::make_unique<Stencil>(shape_of(p), ctx);
}
std::unique_ptr<Instance> make_cuda_cusparse_spmm(const Problem& p, const RunContext& ctx) {
  return std::make_unique<CusparseSpmm>(shape_of(p), ctx);
}
std::unique_ptr<Instance> make_cuda_spmm_csr(const Problem& p, const RunContext& ctx) {
  return std::make_unique<OwnSpmm>(shape_of(p), ctx);
}

}  // namespace tb::spmv

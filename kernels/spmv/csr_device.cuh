// The CSR matrix on the device and the own CSR row kernel body, shared by the `spmv` and `cg` CUDA
// variants (CUDA translation units only).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "runtime/cuda_raii.h"
#include "spmv/laplacian.h"

namespace tb::spmv::device {

// Plain pointers for kernels.
struct CsrView {
  int64_t n = 0;
  const int32_t* row_ptr = nullptr;
  const int32_t* col = nullptr;
  const double* val = nullptr;
};

struct DeviceCsr {
  int64_t n = 0, nnz = 0;
  cuda::DeviceBuffer<int32_t> row_ptr, col;
  cuda::DeviceBuffer<double> val;
  // Lanes that share one row: the largest power of two not above the mean row length (1..32), so a
  // row's nonzeros are read by neighbouring lanes in one or two coalesced rounds.
  int lanes_per_row = 1;
  CsrView view() const { return CsrView{n, row_ptr.data(), col.data(), val.data()}; }
};

inline DeviceCsr upload(const laplacian::Csr& a) {
  DeviceCsr d;
  d.n = a.n;
  d.nnz = a.nnz;
  d.row_ptr = cuda::DeviceBuffer<int32_t>(a.row_ptr.size());
  d.col = cuda::DeviceBuffer<int32_t>(a.col.size());
  d.val = cuda::DeviceBuffer<double>(a.val.size());
  CUDA_CHECK(cudaMemcpy(d.row_ptr.data(), a.row_ptr.data(), a.row_ptr.bytes(), cudaMemcpyHostToDevice));
  if (a.nnz) {
    CUDA_CHECK(cudaMemcpy(d.col.data(), a.col.data(), a.col.bytes(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d.val.data(), a.val.data(), a.val.bytes(), cudaMemcpyHostToDevice));
  }
  CUDA_CHECK(cudaDeviceSynchronize());  // a pageable copy may still be in flight on the legacy stream
  const double mean = a.n ? static_cast<double>(a.nnz) / static_cast<double>(a.n) : 1.0;
  while (d.lanes_per_row < 32 && 2.0 * d.lanes_per_row <= mean) d.lanes_per_row *= 2;
  return d;
}

// Row `row` of A x, computed by the G lanes of a group (lane `lane` of it takes nonzeros lane,
// lane + G, ...) and returned to every lane of the group. Every lane of the warp must call it (the
// shuffles are warp-wide); lanes past the last row contribute zero. x is read with plain loads:
// the persistent CG kernel rewrites it between grid barriers, where the read-only cache could be stale.
template <int G>
__device__ inline double csr_row(const CsrView& a, const double* x, int64_t row, int lane) {
  double sum = 0;
  if (row < a.n) {
    const int32_t begin = __ldg(a.row_ptr + row), end = __ldg(a.row_ptr + row + 1);
    for (int32_t p = begin + lane; p < end; p += G) sum += __ldg(a.val + p) * x[__ldg(a.col + p)];
  }
#pragma unroll
  for (int offset = G / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  return sum;
}

// Calls f(std::integral_constant<int, G>{}) for the runtime lanes-per-row value G.
template <class F>
void with_lanes(int lanes_per_row, F&& f) {
  switch (lanes_per_row) {
    case 1:
      f(std::integral_constant<int, 1>{});
      break;
    case 2:
      f(std::integral_constant<int, 2>{});
      break;
    case 4:
      f(std::integral_constant<int, 4>{});
      break;
    case 8:
      f(std::integral_constant<int, 8>{});
      break;
    case 16:
      f(std::integral_constant<int, 16>{});
      break;
    default:
      f(std::integral_constant<int, 32>{});
      break;
  }
}

}  // namespace tb::spmv::device

#include "cuda_testing.h"

#include <cuda_runtime.h>

#include "collate/collate.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_raii.h"

namespace tb::testing {

namespace {

__device__ inline uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void stall_kernel(uint64_t ns) {
  const uint64_t until = global_ns() + ns;
  while (global_ns() < until) __nanosleep(1000);
}

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

void stall_legacy_stream(double seconds) {
  stall_kernel<<<1, 1, 0, cudaStreamLegacy>>>(static_cast<uint64_t>(seconds * 1e9));
  CUDA_CHECK(cudaGetLastError());
}

bool legacy_stream_idle() {
  const cudaError_t e = cudaStreamQuery(cudaStreamLegacy);
  if (e == cudaErrorNotReady) return false;
  CUDA_CHECK(e);
  return true;
}

void wait_legacy_stream() { CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy)); }

int stream_device(void* stream) {
  int device = -1;
  CUDA_CHECK(cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &device));
  return device;
}

bool stream_capturing(void* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status));
  return status != cudaStreamCaptureStatusNone;
}

std::vector<int32_t> gather_token_rows_on_device(const std::vector<int32_t>& rows, int64_t T,
                                                 const std::vector<int32_t>& picked) {
  const auto B = static_cast<int64_t>(picked.size());
  std::vector<int32_t> out(static_cast<std::size_t>(2 * B * T));
  cuda::DeviceBuffer<int32_t> rows_on_device(rows.size()), picked_on_device(picked.size()), out_on_device(out.size());
  cuda::Stream stream;
  CUDA_CHECK(cudaMemcpyAsync(rows_on_device.data(), rows.data(), rows_on_device.bytes(), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(
      cudaMemcpyAsync(picked_on_device.data(), picked.data(), picked_on_device.bytes(), cudaMemcpyHostToDevice, stream));
  collate::cuda_gather_token_rows(rows_on_device.data(), T, picked_on_device.data(), B, out_on_device.data(), stream);
  CUDA_CHECK(cudaMemcpyAsync(out.data(), out_on_device.data(), out_on_device.bytes(), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

}  // namespace tb::testing

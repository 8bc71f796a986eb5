#include "cuda_testing.h"

#include <cuda_runtime.h>

#include "runtime/cuda_check.h"

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

}  // namespace tb::testing

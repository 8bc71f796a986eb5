// Device discovery for the CUDA build. A missing GPU or driver is a reason, not an error: the
// binary carries on with the CPU backend.
#include <dlfcn.h>

#include <cstdio>
#include <string>

#include "cuda_check.h"
#include "device_info.h"

namespace tb {

std::string cublas_status_name(cublasStatus_t status) {
  const char* name = cublasGetStatusName(status);
  return name ? name : "cuBLAS status " + std::to_string(static_cast<int>(status));
}

static std::string library_version(int major, int minor, int patch) {
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

static std::string format_uuid(const cudaUUID_t& uuid) {
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  char out[64];
  std::snprintf(out, sizeof out, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return out;
}

// Whether the NVIDIA driver's library is on this machine: what tells "no driver at all" from "a driver
// too old" when the runtime says cudaErrorInsufficientDriver for both.
static bool driver_library_loads() {
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!handle) return false;
  dlclose(handle);
  return true;
}

static CudaStatus probe() {
  CudaStatus status;
  status.built = true;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    status.unavailable_reason = err != cudaSuccess
                                    ? describe_cuda_init_failure(cudaGetErrorName(err), cudaGetErrorString(err),
                                                                 driver_library_loads())
                                    : "no CUDA device found";
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return status;
  }
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  int cb[3] = {0, 0, 0}, cs[3] = {0, 0, 0};
  cublasGetProperty(MAJOR_VERSION, &cb[0]);
  cublasGetProperty(MINOR_VERSION, &cb[1]);
  cublasGetProperty(PATCH_LEVEL, &cb[2]);
  cusparseGetProperty(MAJOR_VERSION, &cs[0]);
  cusparseGetProperty(MINOR_VERSION, &cs[1]);
  cusparseGetProperty(PATCH_LEVEL, &cs[2]);
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    GpuInfo g;
    g.index = i;
    g.name = prop.name;
    g.uuid = format_uuid(prop.uuid);
    g.compute_capability = std::to_string(prop.major) + "." + std::to_string(prop.minor);
    g.sms = prop.multiProcessorCount;
    g.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    g.l2_bytes = prop.l2CacheSize;
    g.memory_bus_bits = prop.memoryBusWidth;
    int khz = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, i) == cudaSuccess) g.sm_clock_mhz = khz / 1000;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, i) == cudaSuccess) g.memory_clock_mhz = khz / 1000;
    g.driver_version = driver;
    g.runtime_version = runtime;
    g.cublas_version = library_version(cb[0], cb[1], cb[2]);
    g.cusparse_version = library_version(cs[0], cs[1], cs[2]);
    status.devices.push_back(g);
  }
  if (status.devices.empty()) status.unavailable_reason = "no CUDA device could be queried";
  return status;
}

const CudaStatus& cuda_status() {
  static const CudaStatus status = probe();
  return status;
}

void select_cuda_device(int index) {
  const auto& status = cuda_status();
  if (!status.available()) throw UsageError("--device " + std::to_string(index) + ": " + status.unavailable_reason);
  if (index < 0 || index >= static_cast<int>(status.devices.size()))
    throw UsageError("--device " + std::to_string(index) + ": there are " + std::to_string(status.devices.size()) +
                     " CUDA device(s), numbered from 0");
  CUDA_CHECK(cudaSetDevice(index));
}

}  // namespace tb

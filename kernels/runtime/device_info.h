// What machine a result came from: the host and, when built with CUDA, its devices. Every result
// carries all of it, and the tracking scripts key histories on it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tb {

struct HostInfo {
  std::string cpu_model;
  int cores = 0;        // CPUs this process may run on
  int threads = 0;      // online logical CPUs
  int omp_threads = 0;  // OpenMP's default team size
  std::string compiler;
  std::string blas;
  int64_t l3_bytes = 0;  // last-level cache one core shares: cold-mode flushing, cache-resident rows
};

struct GpuInfo {
  int index = 0;
  std::string name;
  std::string uuid;
  std::string compute_capability;  // "9.0"
  int sms = 0;
  int64_t memory_bytes = 0;
  int64_t l2_bytes = 0;
  int sm_clock_mhz = 0;
  int memory_clock_mhz = 0;
  int memory_bus_bits = 0;
  int driver_version = 0;  // e.g. 13000
  int runtime_version = 0;
  std::string cublas_version;
  std::string cusparse_version;
};

struct CudaStatus {
  bool built = false;              // compiled with the CUDA backend
  std::vector<GpuInfo> devices;    // empty when none can be used
  std::string unavailable_reason;  // why there is no usable device; empty when there is one
  bool available() const { return !devices.empty(); }
};

HostInfo host_info();

// OpenBLAS picks its kernels from the CPU model at load time, and falls back to a generic SSE3 core
// ("Prescott") on CPUs it does not recognise, such as many virtual machines, even when they have
// AVX-512: its GEMM is then several times slower than the machine. When that happened and the user
// has not set OPENBLAS_CORETYPE, this re-executes the program once with the core type that matches
// the CPU's instruction set (SkylakeX for AVX-512, Haswell for AVX2+FMA). It says nothing itself:
// the notice is kept for take_blas_kernel_notice, so that --help and usage errors stay quiet.
// Returns only when no restart is needed (or it failed).
void use_matching_blas_kernels(char** argv, const char* program);
// The notice of the restart above ("benchsuite: OpenBLAS chose its Prescott kernels ...; restarted
// with OPENBLAS_CORETYPE=SkylakeX ..."), once, for a run that measures to print; "" when there was none.
std::string take_blas_kernel_notice();
// Why an allocation of `bytes` should not be tried here ("needs 40960 MiB of host memory, 23000 MiB
// free"), or "" when it fits: a run that would swap or be killed is reported instead.
std::string host_memory_reason(double bytes);
// The same against the first CUDA device's memory; "" when there is no device (the harness reports
// a missing device itself).
std::string device_memory_reason(double bytes);
// Why a device of compute capability `capability` ("7.5") cannot run code that needs `major.minor`
// (`what` names the feature), or "" when it can.
std::string capability_reason(const std::string& capability, int major, int minor, const std::string& what);
// The same for the first CUDA device; "" when there is no device.
std::string device_capability_reason(int major, int minor, const std::string& what);
// Why CUDA cannot be used, from the error the runtime's first call returned (its name and text) and
// whether the driver's library (libcuda.so.1) could be loaded: without the library the runtime says
// cudaErrorInsufficientDriver, which reads as "update your driver" when there is no driver at all.
std::string describe_cuda_init_failure(const std::string& error_name, const std::string& error_text,
                                       bool driver_library_loads);
// Probed once: a binary built with CUDA on a machine without a GPU or driver gets a reason here.
const CudaStatus& cuda_status();
// Makes device `index` current for this thread; throws UsageError when it does not exist.
void select_cuda_device(int index);

}  // namespace tb

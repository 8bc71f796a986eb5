#include "device_info.h"

#include <cblas.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace tb {

static std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        auto name = line.substr(colon + 1);
        name.erase(0, name.find_first_not_of(" \t"));
        return name;
      }
    }
  }
  return "unknown CPU";
}

static std::string compiler_name() {
#if defined(__clang__)
  return std::string("Clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("GNU ") + __VERSION__;
#else
  return "unknown compiler";
#endif
}

static std::string blas_name() {
  std::string config = openblas_get_config();
  // "OpenBLAS 0.3.21 NO_AFFINITY Haswell MAX_THREADS=64": keep the name, version and core type.
  return config;
}

HostInfo host_info() {
  HostInfo h;
  h.cpu_model = cpu_model_name();
  cpu_set_t set;
  CPU_ZERO(&set);
  h.threads = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  h.cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : h.threads;
  h.omp_threads = omp_get_max_threads();
  h.compiler = compiler_name();
  h.blas = blas_name();
  long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l3 <= 0) l3 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  h.l3_bytes = l3 > 0 ? l3 : 32l << 20;
  return h;
}

std::string host_memory_reason(double bytes) {
  const double free_bytes = static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (bytes > 0.9 * free_bytes)
    return "needs " + std::to_string(static_cast<int64_t>(bytes / (1 << 20))) + " MiB of host memory, " +
           std::to_string(static_cast<int64_t>(free_bytes / (1 << 20))) + " MiB free";
  return "";
}

std::string device_memory_reason(double bytes) {
  const auto& status = cuda_status();
  if (!status.available()) return "";
  const double total = static_cast<double>(status.devices.front().memory_bytes);
  if (bytes > 0.9 * total)
    return "needs " + std::to_string(static_cast<int64_t>(bytes / (1 << 20))) + " MiB of device memory, the device has " +
           std::to_string(static_cast<int64_t>(total / (1 << 20))) + " MiB";
  return "";
}

}  // namespace tb

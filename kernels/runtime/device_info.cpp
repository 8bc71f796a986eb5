#include "device_info.h"

#include <cblas.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
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

static bool openblas_core_is_one_of(const std::string& core, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (core == n) return true;
  return false;
}

void use_matching_blas_kernels(char** argv, const char* program) {
  if (std::getenv("OPENBLAS_CORETYPE")) return;  // the user's choice stands
  const std::string core = openblas_get_corename();
  const char* better = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) {
    if (!openblas_core_is_one_of(core, {"SkylakeX", "Cooperlake", "CooperLake", "SapphireRapids"})) better = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    if (!openblas_core_is_one_of(core, {"Haswell", "Zen", "SkylakeX", "Cooperlake", "CooperLake", "SapphireRapids"}))
      better = "Haswell";
  }
  if (!better) return;
  std::fprintf(stderr,
               "%s: OpenBLAS chose its %s kernels on a CPU with %s; restarting with OPENBLAS_CORETYPE=%s "
               "(set OPENBLAS_CORETYPE yourself to choose)\n",
               program, core.c_str(), std::string(better) == "SkylakeX" ? "AVX-512" : "AVX2 and FMA", better);
  setenv("OPENBLAS_CORETYPE", better, 1);
  execv("/proc/self/exe", argv);
  std::fprintf(stderr, "%s: could not restart (%s); going on with OpenBLAS's %s kernels\n", program,
               std::strerror(errno), core.c_str());
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

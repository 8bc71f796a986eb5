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

// The last-level cache one core shares, from sysfs (what the kernel read from the CPU's cache
// topology): glibc's sysconf can report a whole package's or a hypervisor's figure instead (seen: 320
// MiB on a VM whose cores share a 32 MiB L3). 0 when sysfs does not say.
static int64_t sysfs_last_level_cache_bytes() {
  int64_t best_level = 0, best_bytes = 0;
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_in(dir + "level"), size_in(dir + "size");
    int64_t level = 0;
    std::string size;
    if (!(level_in >> level) || !(size_in >> size) || size.empty()) continue;
    int64_t bytes = std::atoll(size.c_str());
    if (size.back() == 'K') bytes <<= 10;
    else if (size.back() == 'M') bytes <<= 20;
    if (level > best_level || (level == best_level && bytes > best_bytes)) best_level = level, best_bytes = bytes;
  }
  return best_bytes;
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
  int64_t llc = sysfs_last_level_cache_bytes();
  if (llc <= 0) llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (llc <= 0) llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
  h.l3_bytes = llc > 0 ? llc : int64_t{32} << 20;
  return h;
}

static bool openblas_core_is_one_of(const std::string& core, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (core == n) return true;
  return false;
}

// The notice travels to the restarted process in this variable: it is said there, once, when the
// run measures (take_blas_kernel_notice), not on --help or a usage error.
static const char* const kBlasNoticeVariable = "TRAINBENCH_BLAS_KERNEL_NOTICE";
static std::string blas_notice_here;  // when the restart failed: said by this process

void use_matching_blas_kernels(char** argv, const char* program) {
  if (std::getenv("OPENBLAS_CORETYPE")) return;  // the user's choice stands (or the restart made it)
  const std::string core = openblas_get_corename();
  const char* better = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) {
    if (!openblas_core_is_one_of(core, {"SkylakeX", "Cooperlake", "CooperLake", "SapphireRapids"})) better = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    if (!openblas_core_is_one_of(core, {"Haswell", "Zen", "SkylakeX", "Cooperlake", "CooperLake", "SapphireRapids"}))
      better = "Haswell";
  }
  if (!better) return;
  const std::string notice = std::string(program) + ": OpenBLAS chose its " + core + " kernels on a CPU with " +
                             (std::string(better) == "SkylakeX" ? "AVX-512" : "AVX2 and FMA") +
                             "; restarted with OPENBLAS_CORETYPE=" + better + " (set OPENBLAS_CORETYPE yourself to choose)";
  setenv(kBlasNoticeVariable, notice.c_str(), 1);
  setenv("OPENBLAS_CORETYPE", better, 1);
  execv("/proc/self/exe", argv);
  unsetenv(kBlasNoticeVariable);
  unsetenv("OPENBLAS_CORETYPE");
  blas_notice_here = std::string(program) + ": could not restart with OPENBLAS_CORETYPE=" + better + " (" +
                     std::strerror(errno) + "); going on with OpenBLAS's " + core + " kernels";
}

std::string take_blas_kernel_notice() {
  std::string notice = blas_notice_here;
  blas_notice_here.clear();
  if (const char* text = std::getenv(kBlasNoticeVariable); text && *text) {
    notice = text;
    unsetenv(kBlasNoticeVariable);  // once: the run's children (trials, PyTorch peers) do not repeat it
  }
  return notice;
}

std::string describe_cuda_init_failure(const std::string& error_name, const std::string& error_text,
                                       bool driver_library_loads) {
  if (!driver_library_loads && (error_name == "cudaErrorInsufficientDriver" || error_name == "cudaErrorNoDevice"))
    return "no NVIDIA driver or GPU found (the driver's libcuda.so.1 is not on this machine)";
  if (error_name == "cudaErrorNoDevice")
    return "no NVIDIA GPU found (the driver is installed but reports no device; check nvidia-smi and "
           "CUDA_VISIBLE_DEVICES)";
  if (error_name == "cudaErrorInsufficientDriver")
    return "the NVIDIA driver is older than this build's CUDA runtime needs (cudaErrorInsufficientDriver): update "
           "the driver, or build with an older CUDA toolkit";
  return "no usable CUDA device: " + error_name + " (" + error_text + ")";
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

std::string capability_reason(const std::string& capability, int major, int minor, const std::string& what) {
  int have_major = 0, have_minor = 0;
  if (std::sscanf(capability.c_str(), "%d.%d", &have_major, &have_minor) != 2) return "";
  if (have_major > major || (have_major == major && have_minor >= minor)) return "";
  return what + " needs compute capability " + std::to_string(major) + "." + std::to_string(minor) +
         " or newer; the device is " + capability;
}

std::string device_capability_reason(int major, int minor, const std::string& what) {
  const auto& status = cuda_status();
  if (!status.available()) return "";
  return capability_reason(status.devices.front().compute_capability, major, minor, what);
}

}  // namespace tb

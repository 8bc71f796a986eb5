// What the `spmv` and `cg` registries share: memory checks for `unsupported` and the factory that
// leaves a CUDA variant listed (but not built) in a CPU-only build. The same helpers as
// peak_registry.cpp's, which keeps its own private.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <string>
#include <utility>

#include "runtime/device_info.h"
#include "runtime/registry.h"

namespace tb::spmv {

inline std::string mib(double bytes) { return std::to_string(static_cast<int64_t>(bytes / (1 << 20))) + " MiB"; }

// A host allocation larger than what is free would swap or be killed: say so instead of running.
inline std::string host_memory_reason(double bytes) {
  const double free_bytes = static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (bytes > 0.9 * free_bytes) return "needs " + mib(bytes) + " of host memory, " + mib(free_bytes) + " free";
  return "";
}

inline std::string device_memory_reason(double bytes) {
  const auto& status = cuda_status();
  if (!status.available()) return "";  // the harness reports the missing device itself
  const double total = static_cast<double>(status.devices.front().memory_bytes);
  if (bytes > 0.9 * total) return "needs " + mib(bytes) + " of device memory, the device has " + mib(total);
  return "";
}

template <class F>
InstanceFactory cuda_factory([[maybe_unused]] F&& make) {
#ifdef TRAINBENCH_HAVE_CUDA
  return InstanceFactory(std::forward<F>(make));
#else
  return nullptr;
#endif
}

}  // namespace tb::spmv

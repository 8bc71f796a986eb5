#include "runtime/gpu_monitor.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <map>

namespace tb {

namespace {

// The few NVML declarations used, as nvml.h has them (its ABI is stable; the header is not needed).
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr int kNvmlClockSm = 1;            // NVML_CLOCK_SM
constexpr int kNvmlPerfPolicyThermal = 1;  // NVML_PERF_POLICY_THERMAL
struct nvmlViolationTime_t {
  unsigned long long referenceTime;  // CPU timestamp, us
  unsigned long long violationTime;  // ns
};

double steady_ns() {
  return static_cast<double>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

}  // namespace

struct GpuMonitor::Api {
  void* library = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*by_uuid)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*clock)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*reasons)(nvmlDevice_t, unsigned long long*) = nullptr;
  nvmlReturn_t (*violation)(nvmlDevice_t, int, nvmlViolationTime_t*) = nullptr;
  std::map<std::string, nvmlDevice_t> devices;
};

template <typename F>
static bool resolve(void* library, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(library, name));
  return fn != nullptr;
}

GpuMonitor::GpuMonitor() {
  void* library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    why_ = "libnvidia-ml.so.1 not found (it comes with the NVIDIA driver)";
    return;
  }
  auto api = std::make_unique<Api>();
  api->library = library;
  // The clock event reasons were "throttle reasons" before NVML 12.2; both names are exported by newer drivers.
  const bool found = resolve(library, api->init, "nvmlInit_v2") && resolve(library, api->shutdown, "nvmlShutdown") &&
                     resolve(library, api->by_uuid, "nvmlDeviceGetHandleByUUID") &&
                     resolve(library, api->clock, "nvmlDeviceGetClockInfo") &&
                     (resolve(library, api->reasons, "nvmlDeviceGetCurrentClocksEventReasons") ||
                      resolve(library, api->reasons, "nvmlDeviceGetCurrentClocksThrottleReasons")) &&
                     resolve(library, api->violation, "nvmlDeviceGetViolationStatus");
  if (!found || api->init() != kNvmlSuccess) {
    why_ = found ? "nvmlInit failed" : "libnvidia-ml.so.1 lacks a function trainbench reads";
    dlclose(library);
    return;
  }
  api_ = std::move(api);
  available_ = true;
}

GpuMonitor::~GpuMonitor() {
  if (!api_) return;
  api_->shutdown();
  dlclose(api_->library);
}

GpuMonitor& GpuMonitor::instance() {
  static GpuMonitor monitor;
  return monitor;
}

GpuThrottleState GpuMonitor::read(const std::string& uuid) {
  GpuThrottleState s;
  s.wall_ns = steady_ns();
  if (!available_) return s;
  auto it = api_->devices.find(uuid);
  if (it == api_->devices.end()) {
    nvmlDevice_t device = nullptr;
    if (api_->by_uuid(uuid.c_str(), &device) != kNvmlSuccess) device = nullptr;
    it = api_->devices.emplace(uuid, device).first;
  }
  if (!it->second) return s;
  unsigned clock = 0;
  unsigned long long reasons = 0;
  nvmlViolationTime_t thermal{};
  if (api_->clock(it->second, kNvmlClockSm, &clock) != kNvmlSuccess || api_->reasons(it->second, &reasons) != kNvmlSuccess ||
      api_->violation(it->second, kNvmlPerfPolicyThermal, &thermal) != kNvmlSuccess)
    return s;
  s.valid = true;
  s.sm_clock_mhz = clock;
  s.reasons = reasons;
  s.thermal_ns = thermal.violationTime;
  return s;
}

// nvmlClocksEventReason* bits (GpuIdle, 0x1, left out: it says nothing about a sample).
constexpr std::pair<uint64_t, const char*> kReasonNames[] = {{0x2, "applications_clocks_setting"},
                                                             {0x4, "sw_power_cap"},
                                                             {0x8, "hw_slowdown"},
                                                             {0x10, "sync_boost"},
                                                             {0x20, "sw_thermal_slowdown"},
                                                             {0x40, "hw_thermal_slowdown"},
                                                             {0x80, "hw_power_brake_slowdown"},
                                                             {0x100, "display_clock_setting"}};

std::vector<std::string> clock_reason_names(uint64_t reasons) {
  std::vector<std::string> out;
  for (const auto& [bit, name] : kReasonNames)
    if (reasons & bit) out.emplace_back(name);
  return out;
}

uint64_t clock_reasons_from_names(const std::vector<std::string>& names) {
  uint64_t out = 0;
  for (const auto& n : names)
    for (const auto& [bit, name] : kReasonNames)
      if (n == name) out |= bit;
  return out;
}

double throttled_share(const GpuThrottleState& before, const GpuThrottleState& after) {
  if (!before.valid || !after.valid || after.wall_ns <= before.wall_ns) return -1;
  if ((before.reasons | after.reasons) & kDisturbingClockReasons) return 1;
  const double throttled = after.thermal_ns >= before.thermal_ns ? static_cast<double>(after.thermal_ns - before.thermal_ns)
                                                                 : 0;
  return std::min(1.0, throttled / (after.wall_ns - before.wall_ns));
}

}  // namespace tb

// What the GPU did to a measurement: its SM clock and why it was held back (NVML's clock event
// reasons), and the time thermal limits kept it below its application clocks (a running counter, as
// /proc/stat is for the CPUs: two reads bracket a sample). A sample the GPU spent throttled by heat
// measures the cooling, not the variant; nvbench discards such samples the same way.
//
// libnvidia-ml comes with the driver, not the toolkit: it is opened at run time (dlopen), so the build
// needs no NVML and a machine without it reports "unknown" instead of failing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tb {

struct GpuThrottleState {
  bool valid = false;         // NVML answered for this device
  uint64_t thermal_ns = 0;    // cumulative time below application clocks for thermal reasons
  uint64_t reasons = 0;       // nvmlClocksEventReason* bits active now
  unsigned sm_clock_mhz = 0;  // current SM clock
  double wall_ns = 0;         // steady clock when read
};

// The clock event reasons that mean the environment, not the kernel, set the speed: thermal slowdowns,
// the hardware slowdown (power brake, external signal) and the power brake. The software power cap is
// not among them: a heavy kernel at the board's power limit runs like that every time.
inline constexpr uint64_t kDisturbingClockReasons = 0x8 | 0x20 | 0x40 | 0x80;

// Names of the reason bits set in `reasons` ("sw_thermal_slowdown", ...), idle and none left out.
std::vector<std::string> clock_reason_names(uint64_t reasons);
// The bits of those names (a result file read back); unknown names are ignored.
uint64_t clock_reasons_from_names(const std::vector<std::string>& names);

class GpuMonitor {
 public:
  // The process-wide monitor (NVML initialised once, on first use).
  static GpuMonitor& instance();
  bool available() const { return available_; }
  const std::string& unavailable_reason() const { return why_; }
  // The state of the device with this UUID ("GPU-xxxxxxxx-..."), invalid when NVML cannot tell.
  GpuThrottleState read(const std::string& uuid);

  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;
  ~GpuMonitor();

 private:
  GpuMonitor();
  struct Api;
  std::unique_ptr<Api> api_;
  bool available_ = false;
  std::string why_;
};

// Of the time between two reads, the share the GPU spent thermally throttled (0..1), raised to 1 when
// a disturbing clock reason is active at either end; -1 when unknown.
double throttled_share(const GpuThrottleState& before, const GpuThrottleState& after);

}  // namespace tb

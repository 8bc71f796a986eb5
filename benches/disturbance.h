// A row measured while the machine was busy with something else (a CPU row while other processes held
// the cores; a CUDA row while the GPU was thermally throttled, as nvbench checks): its samples are taken
// again, each one watched, up to defaults::disturbed_retakes times; one that stays disturbed marks the
// row, whose pairs are then withheld.
#pragma once

#include <string>
#include <vector>

#include "harness.h"
#include "runtime/cpu_load.h"
#include "runtime/gpu_monitor.h"
#include "sampling.h"

namespace tb {

class DisturbanceWatch {
 public:
  DisturbanceWatch(const Entry& entry, const Settings& settings);

  // The row's first sample is next. `processes`: those whose calls the rows measured with it make (a
  // PyTorch row's script): their CPU time is the measurement too, not a load, whichever row's window it is.
  void start(const std::vector<int>& processes);
  // The row's samples are in: the share of its window that was disturbed, and, above the limit, its
  // samples taken again (not when --max-time cut it short or a stop was asked for: they stand, marked).
  void finish(Row& row, RowSampler& sampler, const std::vector<int>& processes) const;

 private:
  // What the rest of the machine had done by some moment.
  struct Mark {
    CpuTicks cpu;          // CPU rows: all CPUs' and this process's ticks (/proc/stat)
    GpuThrottleState gpu;  // CUDA rows: the GPU's throttling counters and clock (NVML)
  };
  Mark mark(const std::vector<int>& processes, bool agreed) const;
  // The share of the window between two marks that was disturbed (-1: not known), every rank's worst for
  // a collective row.
  double disturbed_part(const Mark& a, const Mark& b) const;
  void retake(Row& row, RowSampler& sampler, const std::vector<int>& processes, double& worst_kept) const;

  bool gpu_;
  bool collective_;
  double limit_;
  std::string gpu_uuid_;  // CUDA rows: the device NVML is asked about
  Mark measuring_from_;   // when the row's first sample began
};

}  // namespace tb

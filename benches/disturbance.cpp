#include "disturbance.h"

#include <algorithm>

#include "runtime/comm.h"
#include "runtime/defaults.h"
#include "runtime/device_info.h"

namespace tb {

namespace {

void note_clock(Row& row, const GpuThrottleState& s) {
  if (!s.valid) return;
  const int mhz = static_cast<int>(s.sm_clock_mhz);
  row.sm_clock_min_mhz = row.sm_clock_min_mhz ? std::min(row.sm_clock_min_mhz, mhz) : mhz;
  row.sm_clock_max_mhz = std::max(row.sm_clock_max_mhz, mhz);
  row.clock_reasons |= s.reasons & ~uint64_t{0x1};  // GpuIdle: between samples, says nothing
}

}  // namespace

DisturbanceWatch::DisturbanceWatch(const Entry& entry, const Settings& settings)
    : gpu_(entry.variant->backend == Backend::cuda),
      collective_(entry.variant->collective),
      limit_(gpu_ ? settings.throttled_share : settings.disturbed_share) {
  if (gpu_)
    for (const auto& g : cuda_status().devices)
      if (g.index == settings.cuda_device) gpu_uuid_ = g.uuid;
}

DisturbanceWatch::Mark DisturbanceWatch::mark(const std::vector<int>& processes, bool agreed) const {
  Mark m;
  if (gpu_) {
    m.gpu = GpuMonitor::instance().read(gpu_uuid_);
    return m;
  }
  m.cpu = read_cpu_ticks();
  // A collective row's "self" is every rank on this host: they are the measurement, not others.
  if (agreed) m.cpu.self = static_cast<uint64_t>(comm::world().local_sum(static_cast<double>(m.cpu.self)));
  for (const int pid : processes) m.cpu.self += process_cpu_ticks(pid);
  return m;
}

double DisturbanceWatch::disturbed_part(const Mark& a, const Mark& b) const {
  const double share = gpu_ ? throttled_share(a.gpu, b.gpu) : others_share(a.cpu, b.cpu);
  return collective_ ? comm::agree_max(share) : share;
}

void DisturbanceWatch::start(const std::vector<int>& processes) {
  measuring_from_ = mark(processes, collective_ && comm::launched_ranks() > 1);
}

void DisturbanceWatch::finish(Row& row, RowSampler& sampler, const std::vector<int>& processes) const {
  if (!row.timed()) return;
  double& seen = gpu_ ? row.throttled_share : row.others_share;
  const Mark end = mark(processes, sampler.agreed_across_ranks());
  if (gpu_) {
    note_clock(row, measuring_from_.gpu);
    note_clock(row, end.gpu);
  }
  seen = disturbed_part(measuring_from_, end);
  if (seen <= limit_) return;  // clean, or unknown (-1)
  // No time to take them again: --max-time is spent, or a stop was asked for (not in a collective's
  // row under mpirun, which hears none). The samples stand, and the row says it was disturbed.
  if ((sampler.hears_stop() && stop_requested()) || !row.cut_short.empty()) {
    row.disturbed = true;
    return;
  }
  double worst_kept = 0;
  retake(row, sampler, processes, worst_kept);
  seen = worst_kept;
}

void DisturbanceWatch::retake(Row& row, RowSampler& sampler, const std::vector<int>& processes, double& worst_kept) const {
  const double seen = gpu_ ? row.throttled_share : row.others_share;
  const int64_t iterations = std::max<int64_t>(sampler.iterations(), 1);
  for (double& sample : row.samples_ns) {
    for (int attempt = 0; attempt < defaults::disturbed_retakes; ++attempt) {
      const Mark before = mark(processes, sampler.agreed_across_ranks());
      const Taken taken = sampler.take(iterations);
      if (taken.stopped) {  // a stop request: this sample and those not yet taken again stand, marked
        row.disturbed = true;
        worst_kept = std::max(worst_kept, seen);
        return;
      }
      const Mark after = mark(processes, sampler.agreed_across_ranks());
      if (gpu_) note_clock(row, after.gpu);
      const double share = disturbed_part(before, after);
      sample = taken.seconds / static_cast<double>(taken.calls) * 1e9;
      ++row.retaken;
      if (share <= limit_) {
        worst_kept = std::max(worst_kept, std::max(share, 0.0));
        break;
      }
      if (attempt + 1 == defaults::disturbed_retakes) {
        row.disturbed = true;
        worst_kept = std::max(worst_kept, share);
      }
    }
  }
}

}  // namespace tb

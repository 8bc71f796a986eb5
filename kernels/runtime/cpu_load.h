// What the rest of the machine did to a CPU measurement: the share of all CPUs' time that other
// processes (and the hypervisor, as steal) used while it ran, from /proc/stat and /proc/self/stat.
// A sample taken while others held the cores measures the contention, not the variant.
#pragma once

#include <cstdint>

namespace tb {

struct CpuTicks {
  uint64_t total = 0;  // all CPUs, every state, in clock ticks
  uint64_t busy = 0;   // all CPUs, not idle or waiting for I/O (user, nice, system, irq, softirq, steal)
  uint64_t self = 0;   // this process's user and system time, all its threads
  bool valid = false;  // /proc was readable
};

CpuTicks read_cpu_ticks();
// One process's user and system time, all its threads, in clock ticks (/proc/<pid>/stat); 0 when
// unreadable (a process that has ended).
uint64_t process_cpu_ticks(int pid);

// The share of all CPUs' time between `before` and `after` that was busy but not this process
// (0..1), or -1 when unknown: /proc unreadable, or too few ticks passed to tell (under `min_ticks`).
double others_share(const CpuTicks& before, const CpuTicks& after, uint64_t min_ticks = 8);

}  // namespace tb

"""Whether a sample measured the case or the machine's other load: other processes' share of the CPUs
(/proc/stat), a GPU's throttle reasons (NVML), and the retakes of disturbed samples, as benchsuite's
harness watches its own (benches/harness.cpp check_disturbance, kernels/runtime/cpu_load.cpp)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from .torch_generators import constant

# A sample taken while something else held the machine measures that, not the case: taken again, watched on
# its own, up to watch.retakes times; a row that cannot get clean samples is "disturbed" and gets no ratio.
# The limits are benchsuite's, from the listing's constants (watch.disturbed_share of all CPUs,
# watch.throttled_share of a GPU window, the NVML reasons watch.disturbing_clock_reasons).
MIN_WINDOW_TICKS = 8           # /proc/stat counts in 10 ms ticks: a shorter window tells nothing (cpu_load.h)


@dataclass(frozen=True)
class CpuTicks:
    """All CPUs' busy and total time and this process's own (all its threads), in clock ticks."""

    busy: int = 0
    total: int = 0
    own: int = 0
    valid: bool = False


def read_cpu_ticks(stat_path: str = "/proc/stat", self_stat_path: str = "/proc/self/stat") -> CpuTicks:
    """/proc/stat's aggregate "cpu" line and /proc/self/stat's utime + stime; invalid where unreadable."""
    try:
        with open(stat_path, encoding="ascii", errors="replace") as f:
            cpu = f.readline().split()
        with open(self_stat_path, encoding="ascii", errors="replace") as f:
            # the command (field 2) may hold spaces and parentheses: fields 3.. follow the last ')'
            own = f.read().rpartition(")")[2].split()
        if not cpu or cpu[0] != "cpu":
            return CpuTicks()
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in cpu[1:9])
        utime, stime = int(own[14 - 3]), int(own[15 - 3])
    except (OSError, ValueError, IndexError):
        return CpuTicks()
    busy = user + nice + system + irq + softirq + steal   # guest time is counted in user already
    return CpuTicks(busy, busy + idle + iowait, utime + stime, True)


def others_share(before: CpuTicks, after: CpuTicks, min_ticks: int = MIN_WINDOW_TICKS) -> float:
    """Of all CPUs' time between two reads, the share other processes (and the hypervisor's steal) used,
    0..1; -1 when unknown (a read failed, or the window is shorter than min_ticks)."""
    if not before.valid or not after.valid or after.total < before.total + min_ticks:
        return -1.0
    others = (after.busy - before.busy) - (after.own - before.own)   # ticks are sampled: noise either way
    return 0.0 if others <= 0 else min(1.0, others / (after.total - before.total))


def throttled_share(before: Optional[int], after: Optional[int]) -> float:
    """1 when a disturbing clock event reason was active at either read (NVML's reason bits), else 0;
    -1 when unknown. benchsuite also reads NVML's thermal violation time between the reads; the torch rows
    go by the reasons alone."""
    if before is None or after is None:
        return -1.0
    return 1.0 if (before | after) & int(constant("watch.disturbing_clock_reasons")) else 0.0


@dataclass(frozen=True)
class Watch:
    """How a row's samples are watched: a reading taken before and after, the disturbed share of the
    window between two readings (-1: unknown) and the share above which a sample is taken again."""

    read: Callable[[], object]
    share: Callable[[object, object], float]
    limit: float


@dataclass
class Watched:
    """What watching a row's samples saw."""

    share: float = -1.0        # the worst kept sample's share, or the whole window's when none was retaken
    disturbed: bool = False    # a sample stayed over the limit through all its attempts
    retaken: int = 0           # samples taken again


def take_watched(take_sample: Callable[[], float], repetitions: int, watch: Optional[Watch],
                 retakes: Optional[int] = None) -> Tuple[List[float], Watched]:
    """`repetitions` samples, watched as one window; when that window is disturbed each sample is taken
    again, each attempt watched on its own, and the first one within the limit is kept (the last attempt
    when none is). An unknown share counts as clean, as benchsuite's does."""
    retakes = int(constant("watch.retakes")) if retakes is None else retakes
    start = watch.read() if watch else None
    samples = [take_sample() for _ in range(repetitions)]
    if watch is None:
        return samples, Watched()
    window = watch.share(start, watch.read())
    if window <= watch.limit:
        return samples, Watched(window)
    seen = Watched(0.0)
    for i in range(len(samples)):
        for attempt in range(retakes):
            before = watch.read()
            samples[i] = take_sample()
            share = watch.share(before, watch.read())
            seen.retaken += 1
            if share <= watch.limit:
                seen.share = max(seen.share, share)
                break
            if attempt + 1 == retakes:
                seen.disturbed = True
                seen.share = max(seen.share, share)
    return samples, seen

"""What the machine was doing while a row measured, read raw at the ends of its samples: all CPUs' busy and
total time with this process's own (/proc/stat, /proc/self/stat), or a GPU's NVML clock event reasons.
benchsuite judges the readings as it judges its own rows' and takes a disturbed row again
(benches/torch_rows.cpp measure_torch_rows); nothing here decides."""

from __future__ import annotations

import functools
import re
from typing import Callable, List, Optional


def read_cpu_ticks(stat_path: str = "/proc/stat", self_stat_path: str = "/proc/self/stat") -> Optional[List[int]]:
    """[busy, total, own] in clock ticks: /proc/stat's aggregate "cpu" line and this process's utime + stime
    (all its threads); None where unreadable."""
    try:
        with open(stat_path, encoding="ascii", errors="replace") as f:
            cpu = f.readline().split()
        with open(self_stat_path, encoding="ascii", errors="replace") as f:
            # the command (field 2) may hold spaces and parentheses: fields 3.. follow the last ')'
            own = f.read().rpartition(")")[2].split()
        if not cpu or cpu[0] != "cpu":
            return None
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in cpu[1:9])
        utime, stime = int(own[14 - 3]), int(own[15 - 3])
    except (OSError, ValueError, IndexError):
        return None
    busy = user + nice + system + irq + softirq + steal   # guest time is counted in user already
    return [busy, busy + idle + iowait, utime + stime]


def _device_uuid(torch, index: int) -> str:
    """The GPU's UUID as NVML names it ("GPU-..."); "" when torch does not say."""
    uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
    if re.fullmatch(r"[0-9a-fA-F-]{32,36}", uuid):   # torch prints it without NVML's "GPU-"
        return "GPU-" + uuid
    return uuid if re.fullmatch(r"GPU-[0-9a-fA-F-]{32,36}", uuid) else ""


@functools.lru_cache(maxsize=None)
def gpu_clock_reasons(torch) -> Optional[Callable[[], Optional[int]]]:
    """A reader of the current GPU's NVML clock event reasons (None when a read fails), where pynvml is
    installed; None without it (it is optional: the GPU rows then go unwatched)."""
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(_device_uuid(torch, torch.cuda.current_device()))
        current = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    except Exception:   # noqa: BLE001 - NVML is optional
        return None

    def read() -> Optional[int]:
        try:
            return int(current(handle))
        except Exception:   # noqa: BLE001 - an unanswered read is an unknown share
            return None
    return read

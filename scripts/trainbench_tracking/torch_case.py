"""What every stage's PyTorch case stands on: the device the cases run on, the check against a reference
(Tolerance, compare, Verdict), the Case interface, and the timing of one case (CUDA events, as benchsuite's;
on the CPU a steady clock) with its samples watched for other load. Imported only to measure: it needs torch.

A case's check() makes its first call(s) itself and compares them with a reference computed another way,
in fp64 where there is arithmetic: a case that fails it is `incorrect` and never timed.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from .errors import UsageError
from .torch_generators import constant
from .torch_watch import Watch, Watched, others_share, read_cpu_ticks, take_watched, throttled_share

DEVICE = torch.device("cuda")   # use_device() sets it before any case is made
WARMUP_S = 0.02                # warm-up before the first sample
WARMUP_CALLS = 2
CUDA_MIN_SAMPLE_S = 100e-6     # a sample is never shorter (CUDA events resolve ~0.5 us)
MAX_BATCH = 1 << 16


@dataclass(frozen=True)
class Tolerance:
    """|got - ref| <= atol + rtol * |ref| (kernels/runtime/tolerance.h)."""

    atol: float
    rtol: float




def tolerance(name: str) -> Tolerance:
    """A tolerance of the listing's constants ("tolerance.fp32": kernels/runtime/tolerance.h's fp32)."""
    t = constant(name)
    return Tolerance(float(t["atol"]), float(t["rtol"]))
@dataclass
class Verdict:
    """A check against the reference: ok, the worst error seen, and where it failed."""

    ok: bool
    max_error: float
    detail: str = ""


@dataclass
class Outcome:
    """What measuring one bench gave."""

    disposition: str                 # passed | incorrect | unsupported | failed
    reason: str = ""
    max_error: Optional[float] = None
    samples_ns: List[float] = field(default_factory=list)
    batch: int = 1
    counters: Dict[str, float] = field(default_factory=dict)   # measured, beside the work model's
    per_unit: Dict[str, float] = field(default_factory=dict)   # Case.per_unit
    note: str = ""
    disturbed: bool = False          # a sample stayed disturbed through its retakes (take_watched)
    retaken: int = 0                 # samples taken again
    others_share: float = -1.0       # CPU rows: other processes' share of the CPUs (-1: unknown, unwatched)
    throttled_share: float = -1.0    # GPU rows: the share of time throttled (-1: unknown, unwatched)


class Unsupported(Exception):
    """The peer cannot run this problem here; the message says why."""


def require_cuda() -> None:
    if not torch.cuda.is_available():
        built = "built without CUDA" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise UsageError(f"PyTorch {torch.__version__} ({built}) sees no CUDA device: "
                         "torch.cuda.is_available() is False (--device cpu runs the CPU peers)")


def use_device(kind: str) -> None:
    """cuda (checked to be there) or cpu: where every case puts its tensors and how it is timed."""
    global DEVICE
    if kind == "cuda":
        require_cuda()
    DEVICE = torch.device(kind)


def on_gpu() -> bool:
    return DEVICE.type == "cuda"


def synchronize() -> None:
    """Waits for the device's queued work (nothing to wait for on the CPU)."""
    if on_gpu():
        torch.cuda.synchronize()


def release_cached_memory() -> None:
    if on_gpu():
        torch.cuda.empty_cache()


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def generator(seed: int) -> torch.Generator:
    g = torch.Generator(device=DEVICE)
    g.manual_seed(seed)
    return g


def uniform(shape, seed: int, dtype=torch.float32) -> torch.Tensor:
    """Uniform in [-1, 1) on the device, drawn in fp32 (fp64 for fp64) and rounded to `dtype`."""
    draw = torch.float64 if dtype == torch.float64 else torch.float32
    return (torch.rand(shape, generator=generator(seed), device=DEVICE, dtype=draw) * 2 - 1).to(dtype)


def compare(got: torch.Tensor, ref: torch.Tensor, tol: Tolerance, what: str, scale=None) -> Verdict:
    """Elementwise |got - ref| <= atol + rtol * (scale, else |ref|), in fp64; NaN fails."""
    got = got.detach().reshape(-1).double()
    ref = ref.reshape(-1).double().to(got.device)
    if got.numel() != ref.numel():
        return Verdict(False, math.inf, f"{what} has {got.numel()} values, the reference {ref.numel()}")
    if got.numel() == 0:
        return Verdict(True, 0.0)
    diff = (got - ref).abs()
    bound = tol.atol + tol.rtol * (ref.abs() if scale is None else scale.reshape(-1).double())
    bad = ~(diff <= bound)
    worst = torch.nan_to_num(diff, nan=math.inf).max().item()
    if not bool(bad.any()):
        return Verdict(True, worst)
    i = int(bad.nonzero()[0, 0])
    return Verdict(False, worst, f"{what}[{i}] = {got[i].item():.9g}, reference {ref[i].item():.9g} "
                                 f"(|error| {diff[i].item():.3g} > {bound[i].item():.3g}); "
                                 f"{int(bad.sum())} of {got.numel()} values off")


def merge(verdicts: List[Verdict]) -> Verdict:
    worst = max((v.max_error for v in verdicts), default=0.0)
    failed = next((v for v in verdicts if not v.ok), None)
    return Verdict(failed is None, worst, failed.detail if failed else "")


class Env:
    """What the rows of one stage share (a sparse matrix, a dataset), dropped when the stage changes."""

    def __init__(self):
        self.stage = None
        self.cache: Dict[tuple, object] = {}

    def enter(self, stage: str) -> None:
        if stage != self.stage:
            self.cache.clear()
            gc.collect()
            release_cached_memory()
            self.stage = stage

    def get(self, key: tuple, build: Callable[[], object]):
        if key not in self.cache:
            self.cache[key] = build()
        return self.cache[key]


class Case:
    """One peer on one problem: set up in __init__, check() (which makes the first calls), call()."""

    note = ""

    def scope(self):
        """Entered around the check and the timing (a backend choice, for one)."""
        return contextlib.nullcontext()

    def call(self):
        raise NotImplementedError

    def check(self) -> Verdict:
        raise NotImplementedError

    def counters(self) -> Dict[str, float]:
        """What the checked calls did, measured (cg: iterations per solve), beside the work model's."""
        return {}

    def per_unit(self) -> Dict[str, float]:
        """Units one call does whose time each the harness reports: {"us_per_step": steps per call}."""
        return {}


# ---- timing -----------------------------------------------------------------------------------------------
def _time_calls(case: Case, n: int) -> float:
    """ns per call of n back-to-back calls, between two CUDA events on the current stream (on the CPU,
    the steady clock around them)."""
    if not on_gpu():
        begin = time.perf_counter_ns()
        for _ in range(n):
            case.call()
        return (time.perf_counter_ns() - begin) / n
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        case.call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e6 / n


@functools.lru_cache(maxsize=None)
def _gpu_clock_reasons() -> Optional[Callable[[], Optional[int]]]:
    """A reader of the current GPU's NVML clock event reasons (None when a read fails), where pynvml is
    installed; None without it (it is optional: the GPU rows then go unwatched). NVML stays initialised
    for the run."""
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(_device_uuid(torch.cuda.current_device()))
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


def _watch() -> Optional[Watch]:
    """On the CPU, other processes' share of the CPUs; on a GPU, its throttle reasons where NVML answers."""
    if not on_gpu():
        return Watch(read_cpu_ticks, others_share, float(constant("watch.disturbed_share")))
    reasons = _gpu_clock_reasons()
    return Watch(reasons, throttled_share, float(constant("watch.throttled_share"))) if reasons else None


def measure(case: Case, repetitions: int, min_sample_s: float) -> Tuple[List[float], int, Watched]:
    """Warm-up, then `repetitions` samples of `batch` calls each, a sample lasting at least min_sample_s,
    watched for other load (take_watched: disturbed samples are taken again)."""
    with case.scope():
        for _ in range(WARMUP_CALLS):
            case.call()
        per_call = max(_time_calls(case, 1), 1.0)
        per_call = max(_time_calls(case, min(max(math.ceil(WARMUP_S * 1e9 / per_call), 1), MAX_BATCH)), 1.0)
        batch = min(max(math.ceil(min_sample_s * 1e9 / per_call), 1), MAX_BATCH)
        samples, watched = take_watched(lambda: _time_calls(case, batch), repetitions, _watch())
        return samples, batch, watched


SHARED_ENV = Env()


def run_bench(case_class, bench, repetitions: int, min_sample_s: float) -> Outcome:
    """Set up, check, then time one row; whatever a peer throws makes its row failed, never ends the run."""
    SHARED_ENV.enter(bench.stage)
    case = None
    try:
        try:
            case = case_class(bench, SHARED_ENV)
            with case.scope():
                verdict = case.check()
        except Unsupported as e:
            return Outcome("unsupported", str(e))
        if not verdict.ok:
            return Outcome("incorrect", verdict.detail, verdict.max_error, note=case.note)
        samples, batch, watched = measure(case, repetitions, min_sample_s)
        return Outcome("passed", "", verdict.max_error, samples, batch, case.counters(), case.per_unit(), case.note,
                       disturbed=watched.disturbed, retaken=watched.retaken,
                       others_share=-1.0 if on_gpu() else watched.share,
                       throttled_share=watched.share if on_gpu() else -1.0)
    except torch.cuda.OutOfMemoryError as e:
        return Outcome("failed", f"out of memory: {first_line(e)}")
    except Exception as e:   # noqa: BLE001 - the row says what it was
        return Outcome("failed", f"{type(e).__name__}: {first_line(e)}")
    finally:
        del case
        gc.collect()
        release_cached_memory()


# ---- context -----------------------------------------------------------------------------------------------
def _device_uuid(index: int) -> str:
    """The GPU's UUID as NVML names it ("GPU-..."); "" when torch does not say."""
    uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
    if re.fullmatch(r"[0-9a-fA-F-]{32,36}", uuid):   # torch prints it without NVML's "GPU-"
        return "GPU-" + uuid
    return uuid if re.fullmatch(r"GPU-[0-9a-fA-F-]{32,36}", uuid) else ""


def torch_context() -> dict:
    """context.torch: PyTorch's versions and the settings that change its numbers (benchsuite's context
    describes the machine and its GPU)."""
    info = {"version": torch.__version__, "cuda": torch.version.cuda or "", "numpy": np.__version__,
            "git_version": getattr(torch.version, "git_version", ""), "threads": torch.get_num_threads(),
            "float32_matmul_precision": torch.get_float32_matmul_precision()}
    if on_gpu():
        info.update({"cudnn": torch.backends.cudnn.version(), "gpu_name": torch.cuda.get_device_name(),
                     "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
                     "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32)})
    return info

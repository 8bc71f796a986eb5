"""What every stage's PyTorch case stands on: the device the cases run on, the check against a reference
(Tolerance, compare, Verdict), the Case interface, a case opened and checked, and n calls of it timed (CUDA
events, as benchsuite's; on the CPU a steady clock). benchsuite decides how many calls a sample takes, when
to take it (in rounds with the rows it is compared with) and whether the machine disturbed it. Imported only
to measure: it needs torch.

A case's check() makes its first call(s) itself and compares them with a reference computed another way,
in fp64 where there is arithmetic: a case that fails it is `incorrect` and never timed.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections import namedtuple
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from ..errors import UsageError
from .inputs import constant

DEVICE = torch.device("cuda")   # use_device() sets it before any case is made


Tolerance = namedtuple("Tolerance", "atol rtol")   # |got - ref| <= atol + rtol * |ref| (runtime/tolerance.h)


def tolerance(name: str) -> Tolerance:
    """A tolerance of the listing's constants ("tolerance.fp32": kernels/runtime/tolerance.h's fp32)."""
    return Tolerance(float(constant(name)["atol"]), float(constant(name)["rtol"]))


@dataclass
class Verdict:
    """A check against the reference: ok, the worst error seen, and where it failed."""

    ok: bool
    max_error: float
    detail: str = ""


class Unsupported(Exception):
    """The peer cannot run this problem here; the message says why."""


def use_device(kind: str) -> None:
    """cuda (checked to be there) or cpu: where every case puts its tensors and how it is timed."""
    global DEVICE
    if kind == "cuda" and not torch.cuda.is_available():
        built = "built without CUDA" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise UsageError(f"PyTorch {torch.__version__} ({built}) sees no CUDA device: "
                         "torch.cuda.is_available() is False (--device cpu runs the CPU peers)")
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
    return torch.Generator(device=DEVICE).manual_seed(seed)


def uniform_set(sizes, seed: int) -> List[torch.Tensor]:
    """fp32 tensors of `sizes`, uniform in [-1, 1), drawn in turn from one generator (a parameter set's)."""
    g = generator(seed)
    return [torch.rand(n, generator=g, device=DEVICE) * 2 - 1 for n in sizes]


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


# ---- opening and timing -------------------------------------------------------------------------------------
SHARED_ENV = Env()


def describe_failure(e: BaseException) -> str:
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return f"out of memory: {first_line(e)}"
    return f"{type(e).__name__}: {first_line(e)}"


def open_case(case_class, bench) -> Tuple[Optional[Case], dict]:
    """Sets up one row's case and checks it: the case to time (None unless it passed) and what the check said
    ({"disposition": passed | incorrect | unsupported | failed, "reason", "max_error", "note"}). Whatever a
    peer throws makes its row failed, never ends the script."""
    SHARED_ENV.enter(bench.stage)
    case = None
    try:
        case = case_class(bench, SHARED_ENV)
        with case.scope():
            verdict = case.check()
    except Unsupported as e:
        return None, {"disposition": "unsupported", "reason": str(e)}
    except Exception as e:   # noqa: BLE001 - the row says what it was
        return None, {"disposition": "failed", "reason": describe_failure(e)}
    finite = verdict.max_error is not None and math.isfinite(verdict.max_error)
    said = {"disposition": "passed" if verdict.ok else "incorrect", "reason": verdict.detail,
            "max_error": verdict.max_error if finite else None, "note": case.note}
    return (case if verdict.ok else None), said


def close_case(case: Case) -> None:
    """Drops a case and what the device cached for it."""
    del case
    gc.collect()
    release_cached_memory()


def time_calls(case: Case, n: int) -> float:
    """Seconds for n back-to-back calls, between two CUDA events on the current stream (on the CPU, the steady
    clock around them), in the case's scope."""
    with case.scope():
        if not on_gpu():
            begin = time.perf_counter_ns()
            for _ in range(n):
                case.call()
            return (time.perf_counter_ns() - begin) * 1e-9
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(n):
            case.call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3


# ---- context -----------------------------------------------------------------------------------------------
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

"""One autotune trial of the PyTorch twin of the step (torch_step.py): the child `autotune --executor torch`
starts as `scripts/torch-step --trial REQUEST`, the twin of tuner/trial.cpp's run_trial_here.

The request is the one the C++ child gets, with the workload already resolved by autotune and the candidate
applied ("resolved", dump_step's document), and the C++ step's double-precision reference of the first
sequence ("reference": its dataset sample, per-token losses and tolerance). The measuring rules are the C++
child's: the first step is checked (its first sequence's per-token losses against the reference) before
anything is timed, a wrong one is `incorrect`; then the warm-up steps (the request's warmup_steps: with
cuda_graphs, through the capturing step), the last one timed alone, size samples of whole
steps (each at least 20 ms), measured until the median's interval is within the target, the policy's
max_seconds pass, the trial is clearly behind the best so far (stop_below), or the budget's end
(wall_seconds) would come before the next sample. The result is one JSON line of TrialResult on stdout, the
same fields the C++ child writes; peak memory is PyTorch's: torch.cuda.max_memory_allocated on a GPU, the
process's peak resident size on the CPU (what the twin's process takes, the interpreter and PyTorch
included). Out of memory (torch.cuda.OutOfMemoryError, or the CPU allocator refused under the address-space
limit set from the request's memory_limit_bytes) is an `oom` result, not a crash.

`scripts/torch-step --probe` prints what autotune records of the interpreter: PyTorch's and Python's
versions, whether CUDA is usable, and how long importing torch took (a trial's start-up)."""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from .errors import UsageError


# ---- the stopping rule's statistics ---------------------------------------------------------------------
# A trial stops once its interval is tight (policy target_rel_ci), judged while it measures: the interval
# kernels/runtime/stats.cpp summarize() gives.
@dataclass
class Summary:
    median: float
    ci_low: float
    ci_high: float
    ci_level: float
    noisy: bool


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def _binomial_half_cdf(n: int, k: int) -> float:
    return sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n


def summarize(samples: Sequence[float], noise_target: float, level: float = 0.95) -> Summary:
    """Median and the order-statistic interval [x_(k), x_(n+1-k)] with the largest k whose coverage is at
    least `level`; with too few samples, [min, max] and its (lower) coverage."""
    if not samples:
        raise ValueError("summary of no samples")
    x = sorted(samples)
    n = len(x)
    k = next((c for c in range(n // 2, 0, -1) if 1.0 - 2.0 * _binomial_half_cdf(n, c - 1) >= level), 0)
    if k == 0:
        low, high, cover = x[0], x[-1], (1.0 - 2.0 * 0.5 ** n if n > 1 else 0.0)
    else:
        low, high, cover = x[k - 1], x[n - k], 1.0 - 2.0 * _binomial_half_cdf(n, k - 1)
    med = _median(x)
    noisy = med > 0 and (high - low) / (2.0 * med) > noise_target
    return Summary(med, low, high, cover, bool(noisy))


SAMPLE_SECONDS = 0.02      # a sample lasts at least this long (the C++ trial's)
MAX_BATCH = 1 << 12        # steps in one sample, at most
TRIAL_CLASSES = ("ok", "oom", "error", "timeout", "incorrect")
# What an allocation refused looks like from PyTorch's allocators, and from the loader mapping a module
OOM_SIGNS = ("out of memory", "can't allocate memory", "cannot allocate memory", "failed to map segment")


def batch_for(call_s: float, min_sample_s: float = SAMPLE_SECONDS, max_batch: int = MAX_BATCH) -> int:
    """runtime/timing.cpp's batch_for: calls per sample so that one sample lasts at least min_sample_s."""
    if not call_s > 0:
        return max_batch
    return int(min(max(math.ceil(min_sample_s / call_s), 1), max_batch))


def looks_like_oom(error: BaseException) -> bool:
    import torch
    if isinstance(error, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    text = str(error)
    return any(sign in text for sign in OOM_SIGNS)


def peak_host_bytes() -> int:
    """The process's peak resident set (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _vm_size_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def limit_host_memory(limit_bytes: int) -> None:
    """Lets the process map at most limit_bytes more than it has now (the interpreter and PyTorch, loaded):
    an allocation past it fails in the allocator, which the trial reports as out of memory, where the
    kernel's out-of-memory killer would otherwise take the process (or another one) down."""
    if limit_bytes <= 0:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    want = _vm_size_bytes() + int(limit_bytes)
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    resource.setrlimit(resource.RLIMIT_AS, (want, hard))


def warm_lazy_imports(optimizer_variant: str) -> None:
    """What PyTorch sets up on first use, set up before the address-space limit: one step of the variant's
    AdamW on a one-element tensor (it imports torch._dynamo, and through it the compiler's CPU probes), and a
    matrix product and a reduction large enough to start the OpenMP threads (whose stacks, mapped under the
    limit, fail libgomp's thread creation, which aborts the process)."""
    import torch
    from .torch_step import OPTIMIZER_VARIANTS
    p = torch.zeros(1, requires_grad=True)
    p.grad = torch.zeros(1)
    torch.optim.AdamW([p], **OPTIMIZER_VARIANTS.get(optimizer_variant, {})).step()
    a = torch.ones(256, 256)
    (a @ a).sum().item()
    torch.ones(1 << 20).exp_().sum().item()


def check_first(reference: dict, sample: int, got: List[float]) -> Optional[str]:
    """check_first_losses: every token's loss within atol + rtol |ref| of the double reference; None when it
    passes, else what failed."""
    if sample != int(reference["sample"]):
        return (f"the first micro-batch starts with dataset sample {sample}, the C++ step's with "
                f"{reference['sample']}: the twin's data order differs")
    want = reference["losses"]
    if len(got) != len(want):
        return f"{len(got)} token losses, the reference has {len(want)}"
    rtol, atol = float(reference["rtol"]), float(reference["atol"])
    for t, (g, w) in enumerate(zip(got, want)):
        if not (math.isfinite(g) and abs(g - w) <= atol + rtol * abs(w)):
            return f"loss of token {t} of sample {sample} = {g:.8g}, double reference {w:.8g}"
    return None


class Clock:
    """Seconds for a run of whole steps: on a GPU the queue is drained before and after (what the C++
    trial's CUDA timer measures between its events), on the CPU a plain clock."""

    def __init__(self, on_gpu: bool):
        import torch
        self.sync = torch.cuda.synchronize if on_gpu else (lambda: None)

    def time(self, call: Callable[[], None], batch: int) -> float:
        self.sync()
        start = time.perf_counter()
        for _ in range(batch):
            call()
        self.sync()
        return time.perf_counter() - start


def measure(run_step: Callable[[], None], batch: int, clock: "Clock", policy: dict, started: float, global_batch: int,
            result: dict, peak_bytes: Callable[[], int]) -> dict:
    """The C++ child's measuring rules, for any step (the twin's or a user's entry): samples of `batch` steps,
    measured until the median's interval is within the target, the policy's max_seconds pass, the trial is
    clearly behind the best so far (stop_below), or the budget's end (wall_seconds) would come before the
    next sample; fills `result` (samples/s of `global_batch`, its interval, steps, peak memory, seconds)."""
    step_seconds: List[float] = []
    steps = 0
    measuring = time.perf_counter()
    result["setup_seconds"] = measuring - started
    wall = float(policy.get("wall_seconds", 0.0))
    stop_below = float(policy.get("stop_below", 0.0))
    while True:
        step_seconds.append(clock.time(run_step, batch) / batch)
        steps += batch
        # No sample that would end after the budget: the slowest so far is the forecast.
        sample_s = max(step_seconds) * batch
        if wall > 0 and time.perf_counter() - started + 1.5 * sample_s > wall:
            result["message"] = "stopped at the budget's end"
            break
        if len(step_seconds) < 3 or steps < int(policy["min_steps"]):
            continue
        s = summarize(step_seconds, float(policy["target_rel_ci"]))
        if not s.noisy or time.perf_counter() - measuring >= float(policy["max_seconds"]):
            break
        if stop_below > 0 and global_batch / s.ci_low < stop_below:
            result["message"] = "stopped early: clearly behind the best so far"
            break
    s = summarize(step_seconds, float(policy["target_rel_ci"]))
    result.update({"samples_per_s": global_batch / s.median, "ci_low": global_batch / s.ci_high,
                   "ci_high": global_batch / s.ci_low, "steps": steps, "peak_bytes": peak_bytes(),
                   "seconds": time.perf_counter() - started})
    return result


def run_trial(request: dict) -> dict:
    """The trial `request` describes, as a TrialResult dict; failures are results, not exceptions."""
    started = time.perf_counter()
    result: Dict[str, object] = {"class": "ok", "samples_per_s": 0.0, "ci_low": 0.0, "ci_high": 0.0,
                                 "peak_bytes": 0, "steps": 0, "seconds": 0.0, "setup_seconds": 0.0, "message": ""}

    def fail(cls: str, why: str) -> dict:
        result.update({"class": cls, "message": why, "seconds": time.perf_counter() - started})
        return result

    try:
        import torch
        from .torch_step import TrainingStep
        policy = request["policy"]
        on_gpu = request["backend"] == "cuda"
        if on_gpu:
            if not torch.cuda.is_available():
                return fail("error", "PyTorch sees no usable GPU (torch.cuda.is_available() is False)")
            device = torch.device("cuda", int(request.get("device", 0)))
            torch.cuda.set_device(device)
            torch.cuda.reset_peak_memory_stats(device)
        else:
            device = torch.device("cpu")
        resolved = request["resolved"]
        workload = resolved["workload"]
        if not on_gpu:
            # What PyTorch imports lazily is imported before the limit: an import refused under it fails in
            # the import machinery (SystemError), not as an allocation
            warm_lazy_imports(workload["optimizer"]["variant"])
            limit_host_memory(int(request.get("memory_limit_bytes", 0)))
        global_batch = int(workload["batch"]["global"])
        step = TrainingStep(resolved, dtype=torch.float32, attention=request.get("attention"), device=device)
        clock = Clock(on_gpu)

        # The first step: its first sequence is checked against the C++ double-precision reference.
        first = step.step(record_first=True)
        why = check_first(request["reference"], first.micro_batches[0][0], first.first_losses.tolist())
        if why:
            return fail("incorrect", why)
        # The warm-up steps (with cuda_graphs, through the capturing step), the last one timed alone
        for _ in range(max(int(request.get("warmup_steps", 1)), 1)):
            last_warmup = clock.time(step.step, 1)
        batch = batch_for(last_warmup)
        return measure(lambda: step.step(), batch, clock, policy, started, global_batch, result,
                       lambda: int(torch.cuda.max_memory_allocated(device)) if on_gpu else peak_host_bytes())
    except UsageError as e:
        return fail("error", str(e))
    except BaseException as e:  # noqa: B902 - any failure of the twin is this trial's result
        if isinstance(e, KeyboardInterrupt):
            raise
        if looks_like_oom(e):
            what = str(e).splitlines()[0] if str(e) else "an allocation was refused"
            limit = int(request.get("memory_limit_bytes", 0)) if request.get("backend") != "cuda" else 0
            within = f", held to {limit / 2**20:.0f} MiB more than the interpreter and PyTorch" if limit else ""
            return fail("oom", f"out of memory ({type(e).__name__}: {what}{within})")
        frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
        where = f" at {os.path.basename(frame.filename)}:{frame.lineno}" if frame else ""
        return fail("error", f"{type(e).__name__}: {e}{where}")


def probe() -> dict:
    """The interpreter's versions, and the start-up every trial pays before its first step: importing torch and
    the twin, and the optimizer's first construction (which imports torch._dynamo: 1.6 s of 3 on the 2-core CI
    machine)."""
    started = time.perf_counter()
    import torch
    from .torch_step import TrainingStep  # noqa: F401 - imported for its cost
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])
    import_seconds = time.perf_counter() - started
    cuda = torch.cuda.is_available()
    return {"torch": torch.__version__, "python": sys.version.split()[0], "cuda": cuda,
            "cuda_devices": torch.cuda.device_count() if cuda else 0, "import_seconds": import_seconds}


USAGE = ("usage: torch-step --trial REQUEST_JSON | --probe | --entry-probe REQUEST_JSON | --entry-trial REQUEST_JSON\n"
         "       | --entry-largest-batch REQUEST_JSON\n"
         "  the PyTorch twin of trainbench's training step, or the user's own model (torch_entry.py), as autotune\n"
         "  --executor torch runs them")


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if args == ["--probe"]:
        print(json.dumps(probe()))
        return 0
    if len(args) != 2 or args[0] != "--trial":
        print(USAGE, file=sys.stderr)
        return 2
    try:
        request = json.loads(args[1])
    except json.JSONDecodeError as e:
        print(f"torch-step: the request is not JSON: {e}", file=sys.stderr)
        return 2
    result = run_trial(request)
    sys.stdout.flush()
    print(json.dumps(result), flush=True)
    return 0

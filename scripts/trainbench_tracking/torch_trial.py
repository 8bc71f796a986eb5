"""What autotune's PyTorch worker (torch_worker.py) needs around a step: the twin's first-step check against the
C++ step's double-precision reference (check_first), out of memory told from other failures (looks_like_oom), the
host-memory limit a CPU worker runs under (limit_host_memory: an allocation past it fails in the allocator, an
`oom` candidate, where the kernel's out-of-memory killer would take the process), PyTorch's lazy imports made
before that limit, and `scripts/torch-step --probe` (PyTorch's and Python's versions, whether CUDA is usable,
and how long importing torch takes: the worker's start-up).

How long a candidate is measured, its interval and when it stops are autotune's (tuner/worker.cpp, with
runtime/stats.cpp): the worker only runs the steps it is asked for."""

from __future__ import annotations

import json
import math
import resource
import sys
import time
from typing import List, Optional


# What an allocation refused looks like from PyTorch's allocators, and from the loader mapping a module
OOM_SIGNS = ("out of memory", "can't allocate memory", "cannot allocate memory", "failed to map segment")


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


USAGE = ("usage: torch-step --serve START_JSON | --probe\n"
         "  the PyTorch side of autotune --executor torch: the tune's worker (--serve; the twin of trainbench's step or\n"
         "  the user's own model) and what the interpreter has (--probe)")


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if args == ["--probe"]:
        print(json.dumps(probe()))
        return 0
    print(USAGE, file=sys.stderr)
    return 2

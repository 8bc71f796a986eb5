"""Memory around the PyTorch worker's steps (worker.py, and the entry's largest-batch search in entry.py): out of
memory told from other failures (looks_like_oom), the process's peak resident set, the host-memory limit a CPU
worker runs under (limit_host_memory: an allocation past it fails in the allocator, an `oom` candidate, where the
kernel's out-of-memory killer would take the process), and PyTorch's lazy imports made before that limit."""

from __future__ import annotations

import resource


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
    from .step import OPTIMIZER_VARIANTS
    p = torch.zeros(1, requires_grad=True)
    p.grad = torch.zeros(1)
    torch.optim.AdamW([p], **OPTIMIZER_VARIANTS.get(optimizer_variant, {})).step()
    a = torch.ones(256, 256)
    (a @ a).sum().item()
    torch.ones(1 << 20).exp_().sum().item()

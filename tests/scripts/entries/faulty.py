"""Stand-in entries that fail on purpose, for the PyTorch worker's isolation: each fault costs its candidate only,
the worker is started again, and the tune goes on (tests/scripts/test_torch_entry.py). The small MLP of the
README's example, built per the switches it names:
- optimizer=foreach: the process aborts (a crash in native code: SIGABRT);
- sync=async: the build hangs (a deadlock);
- optimizer=fused: it allocates 8 GiB (out of memory under autotune --memory-limit).
`same`: a switch-insensitive model for the tie rule: nothing fails, and sync changes nothing measurable.
`one_rank`: the same faults on the last of several ranks only (the others wait for it).
`nan_at_once`: its data holds a NaN, so the loss is NaN from the first micro-batch (refused by the probe);
`diverges`: finite for its first five losses, NaN from the sixth on, per build (the checked first step passes,
a measured step does not)."""
import os
import time

import torch
from torch import nn


def _mlp(micro_batch, device):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 10)).to(device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 32, generator=g)
    y = torch.randint(0, 10, (512,), generator=g)
    batches = [(x[i:i + micro_batch], y[i:i + micro_batch]) for i in range(0, 512 - micro_batch + 1, micro_batch)]
    return {"model": model, "optimizer": lambda p: torch.optim.AdamW(p, lr=1e-3), "batches": batches,
            "loss": lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1])}


def build(micro_batch, device, optimizer="per_tensor", sync="every_step"):
    if optimizer == "foreach":
        os.abort()
    if sync == "async":
        time.sleep(3600)
    entry = _mlp(micro_batch, device)
    if optimizer == "fused":
        entry["ballast"] = torch.ones(8 << 28)  # 8 GiB of float32
    return entry


def same(micro_batch, device):
    return _mlp(micro_batch, device)


def nan_at_once(micro_batch, device):
    entry = _mlp(micro_batch, device)
    entry["batches"] = [(x.clone().fill_(float("nan")), y) for x, y in entry["batches"]]
    return entry


def diverges(micro_batch, device):
    entry = _mlp(micro_batch, device)
    calls = [0]

    def loss(m, b):
        calls[0] += 1
        value = nn.functional.cross_entropy(m(b[0]), b[1])
        return value if calls[0] <= 5 else value * float("nan")
    entry["loss"] = loss
    return entry


def one_rank(micro_batch, device, optimizer="per_tensor", sync="every_step"):
    """On several ranks, the last rank alone fails: it aborts at optimizer=foreach and hangs at sync=async while
    the others wait for it in the first step's collectives. Its rank is torchrun's (RANK, WORLD_SIZE), not a
    parameter, so its batches are the same on every rank (the tune warns of that)."""
    last = int(os.environ.get("RANK", "0")) == int(os.environ.get("WORLD_SIZE", "1")) - 1
    if last and optimizer == "foreach":
        os.abort()
    if last and sync == "async":
        time.sleep(3600)
    return _mlp(micro_batch, device)

"""`torch-step --allreduce-probe REQUEST` under torchrun: an entry's gradients' all-reduce measured with
torch.distributed itself, for `autotune --entry ... --ranks N --predict` (tuner/distributed.h), as the native
step's is measured with `autotune --allreduce-probe` under mpirun.

REQUEST is {"elements": the entry's parameter count, "bucket_mb": DDP's bucket_cap_mb, "repeats": timed calls,
"backend": "cpu" | "cuda"}. Every rank all-reduces `elements` fp32 values in buckets of `bucket_mb` from the end
(DDP fills its buckets in the reverse order of the parameters, the order the backward produces their gradients),
two warm-up calls then `repeats` timed ones, each started at a barrier; a call's time is the slowest rank's. Rank 0
prints one JSON line: {"seconds": the median call, "ranks", "library": "gloo" | "nccl", "torch"}.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import List, Tuple

from .distributed import world_from_environment

WARMUP_CALLS = 2
DEFAULT_REPEATS = 7
FLOAT_BYTES = 4


def buckets_from_end(elements: int, bucket_mb: float) -> List[Tuple[int, int]]:
    """(begin, length) of each bucket of at most bucket_mb of fp32 values, the last elements' bucket first."""
    per_bucket = max(1, int(bucket_mb * (1 << 20) / FLOAT_BYTES))
    out = []
    end = elements
    while end > 0:
        begin = max(0, end - per_bucket)
        out.append((begin, end - begin))
        end = begin
    return out


def measure(request: dict, device) -> dict:
    """The all-reduce of the request's gradients on this process group; every rank returns the same answer."""
    import torch
    import torch.distributed as dist
    elements = int(request["elements"])
    buckets = buckets_from_end(elements, float(request.get("bucket_mb", 25)))
    grads = torch.zeros(elements, dtype=torch.float32, device=device)

    def all_reduce() -> None:
        for begin, length in buckets:
            dist.all_reduce(grads.narrow(0, begin, length))
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(WARMUP_CALLS):
        all_reduce()
    seconds = []
    slowest = torch.zeros(1, dtype=torch.float64, device=device)
    for _ in range(int(request.get("repeats", DEFAULT_REPEATS))):
        dist.barrier()
        started = time.perf_counter()
        all_reduce()
        slowest.fill_(time.perf_counter() - started)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        seconds.append(float(slowest.item()))
    return {"seconds": statistics.median(seconds), "ranks": dist.get_world_size(), "library": dist.get_backend(),
            "torch": torch.__version__}


def main(request_text: str) -> int:
    """One rank of the probe: 0 when measured (rank 0 printed the answer), 2 for a bad request or a lone process."""
    from .conversation import die_with_parent
    die_with_parent()
    try:
        request = json.loads(request_text)
        if int(request["elements"]) < 1:
            raise ValueError("elements must be at least 1")
    except (ValueError, KeyError, TypeError) as e:
        print(f"torch-step --allreduce-probe: a bad request ({e}): expected "
              '{"elements": N, "bucket_mb": MB, "repeats": K, "backend": "cpu" | "cuda"}', file=sys.stderr)
        return 2
    world = world_from_environment()
    if world is None:
        print("torch-step --allreduce-probe: run it on 2 ranks or more, under python -m torch.distributed.run "
              "--nproc-per-node N", file=sys.stderr)
        return 2
    import torch
    import torch.distributed as dist
    from .distributed import join
    device = torch.device("cpu")
    if request.get("backend") == "cuda":
        device = torch.device("cuda", world["local_rank"])
        torch.cuda.set_device(device)
    join(device)
    try:
        answer = measure(request, device)
    finally:
        dist.destroy_process_group()
    if world["rank"] == 0:
        print(json.dumps(answer), flush=True)
    return 0

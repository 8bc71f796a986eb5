"""An entry's candidate on several ranks of torch.distributed, as the user will train it: DistributedDataParallel or
FSDP2 (fully_shard) over the entry's model, each rank on its share of the global batch (entry.share_over_ranks), the
gradients reduced once per optimizer step when the no_sync switch is on (DDP's no_sync(), FSDP2's
set_requires_gradient_sync(False), around the micro-batches before the last) or after every micro-batch when it is
off (a loop without it).

The switches of a candidate on ranks (each in the output; the first value is what a loop that calls DDP's defaults
does):
  parallel                 ddp | fsdp | fsdp_no_reshard
                           DistributedDataParallel; FSDP2's fully_shard on every repeated block (the layers of a
                           ModuleList of one class: a transformer's blocks) and then the whole model, the blocks'
                           parameters gathered again for the backward (reshard_after_forward=True, FSDP2's
                           default: less memory, one more all-gather a block) or kept from the forward
                           (fsdp_no_reshard: reshard_after_forward=False)
  no_sync                  off | on
  bucket_mb                25 | 5 | 100       DDP's bucket_cap_mb                  (DDP only)
  gradient_as_bucket_view  off | on                                                (DDP only)
  static_graph             off | on                                                (DDP only)

Correct before fast: the first optimizer step of the ranks is checked against one process running the same global
batch, every rank's samples of it joined into one micro-batch (entry.reference_step, fp32, the optimizer as given),
with the single process's tolerances (entry.check_first_step's). Every rank computes that reference from the same
gathered samples, so every rank reaches the same verdict without another message. FSDP2's shards are gathered whole
for the comparison.

The communication a step waits for (profiled_steps): the time a collective is in flight while the rank computes
nothing, from torch.profiler's events (exposed_communication).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

# Each switch's first value is what a loop that calls DDP's defaults does (no no_sync(): every micro-batch reduces).
REPLICATED_SWITCHES = {"parallel": ("ddp", "fsdp", "fsdp_no_reshard"), "no_sync": ("off", "on"),
                       "bucket_mb": ("25", "5", "100"), "gradient_as_bucket_view": ("off", "on"),
                       "static_graph": ("off", "on")}


def world_from_environment(one_rank: bool = False) -> Optional[Dict[str, int]]:
    """rank, world_size and local_rank as torchrun sets them, or None in a process of its own; with `one_rank`, a
    torchrun group of one rank is a world too (autotune --ranks 1 --launcher ...)."""
    size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if size <= 1 and not (one_rank and "RANK" in os.environ):
        return None
    return {"rank": int(os.environ["RANK"]), "world_size": size, "local_rank": int(os.environ.get("LOCAL_RANK", "0"))}


def backend_missing(device) -> Optional[str]:
    """Why this PyTorch cannot join ranks on `device` (no torch.distributed, or no NCCL or gloo in its build), or
    None."""
    import torch.distributed as dist
    if not dist.is_available():
        return "this PyTorch has no torch.distributed (torch.distributed.is_available() is False)"
    name, available = ("NCCL", dist.is_nccl_available) if device.type == "cuda" else ("gloo", dist.is_gloo_available)
    if not available():
        return (f"this PyTorch's torch.distributed has no {name} (torch.distributed.is_{name.lower()}_available() is "
                f"False): ranks on {'GPUs' if device.type == 'cuda' else 'the CPU'} need it")
    return None


def join(device) -> None:
    """The process group of this rank: NCCL on GPUs (one rank per GPU), gloo on the CPU."""
    import torch.distributed as dist
    from ..errors import UsageError
    missing = backend_missing(device)
    if missing:
        raise UsageError(missing)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")


DDP_ONLY = ("bucket_mb", "gradient_as_bucket_view", "static_graph")


def sharded(switches: Dict[str, str]) -> bool:
    return switches.get("parallel", "ddp").startswith("fsdp")


def with_loss(entry):
    """The entry's model with its loss as one module, whose forward takes a micro-batch and returns the loss: DDP's
    and FSDP2's hooks run around the forward, so the whole of the entry's step goes through it, whatever the loss
    calls of the model (a LightningModule's training_step calls its layers, not its forward)."""
    import torch

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = entry.model

        def forward(self, batch):
            return entry.loss(self.model, batch)
    return WithLoss()


def replicate(entry, device, switches: Dict[str, str]):
    """The entry's model and loss (with_loss) as the candidate trains them on the ranks: fully_shard'ed in place
    (parallel=fsdp*: the model's parameters become its shards), else in DistributedDataParallel (rank 0's parameters
    broadcast to all). Its forward takes a micro-batch and returns the loss."""
    whole_step = with_loss(entry)
    if sharded(switches):
        return shard(whole_step, switches.get("parallel") == "fsdp")
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel(
        whole_step, device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=float(switches.get("bucket_mb", "25")),
        gradient_as_bucket_view=switches.get("gradient_as_bucket_view", "off") == "on",
        static_graph=switches.get("static_graph", "off") == "on")


def repeated_blocks(model) -> list:
    """The layers of the outermost ModuleLists whose layers are all of one class with parameters (a transformer's
    blocks): what FSDP2 shards one by one, so that one block's parameters are gathered at a time."""
    import torch
    blocks, inside = [], set()
    for module in model.modules():
        if id(module) in inside:
            continue
        if isinstance(module, torch.nn.ModuleList) and len(module) >= 2 and len({type(m) for m in module}) == 1 \
                and any(True for _ in module[0].parameters()):
            blocks.extend(module)
            inside.update(id(m) for m in module.modules())
    return blocks


def shard(model, reshard_after_forward: bool):
    """FSDP2 over the model, in place: each repeated block, then the whole (the rest of its parameters)."""
    from torch.distributed.fsdp import fully_shard
    for block in repeated_blocks(model):
        fully_shard(block, reshard_after_forward=reshard_after_forward)
    return fully_shard(model, reshard_after_forward=reshard_after_forward)


def restore(model, state) -> None:
    """The model's parameters and buffers set to `state` (full tensors, the same on every rank), sharded or not."""
    import torch
    with torch.no_grad():
        for name, value in model.state_dict().items():
            if hasattr(value, "device_mesh"):  # this rank's shard of the full tensor, cut as FSDP2 cut it
                from torch.distributed.tensor import distribute_tensor
                value.to_local().copy_(distribute_tensor(state[name].to(value.device), value.device_mesh,
                                                         value.placements, src_data_rank=None).to_local())
            else:
                value.copy_(state[name])


def gathered(micro_batches: List[Any]) -> List[Any]:
    """Every rank's micro-batches of one step, rank 0's first (on the CPU): the global batch's samples."""
    import torch.distributed as dist
    from .entry import to_device
    import torch
    mine = [to_device(b, torch.device("cpu")) for b in micro_batches]
    everyone: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return [b for rank_batches in everyone for b in rank_batches]


def refusal(switches: Dict[str, str]) -> Optional[str]:
    """Why DDP cannot run these switches together, or None: its static graph expects every backward to reduce, so
    no_sync's skipped all-reduces break it (an internal assert of its reducer, PyTorch 2.x)."""
    if sharded(switches):
        other = [f"{k}={switches[k]}" for k in DDP_ONLY if k in switches and switches[k] != REPLICATED_SWITCHES[k][0]]
        if other:
            return f"{', '.join(other)} {'is' if len(other) == 1 else 'are'} DDP's; parallel={switches['parallel']} " \
                   "shards the model with FSDP2 instead"
    if switches.get("static_graph", "off") == "on" and switches.get("no_sync", "off") == "on":
        return "static_graph=on cannot skip the all-reduce of micro-batches (no_sync=on): DDP's static graph reduces " \
               "in every backward"
    return None


def replicate_checked(entry, device, switches: Dict[str, str], micro_batches, own: str):
    """The entry's model replicated or sharded with the candidate's switches (None where refusal() refuses them,
    with why), and None when the ranks' first optimizer step (this rank's `micro_batches` through it) moves the
    parameters as one process does on every rank's samples in one micro-batch, else why not. The reference runs
    first, on the model before DDP wraps it or FSDP2 shards it (a backward through a wrapped model's parameters
    outside DDP's forward breaks its reducer); the model is left at its initial parameters."""
    import torch.distributed as dist
    from .entry import (Loop, TOLERANCE_BF16, TOLERANCE_FP32, dropout_off, initial_state, nonfinite_loss, reference_step,
                        update_difference, with_variant)
    refused = refusal(switches)
    if refused:
        return None, refused
    initial = initial_state(entry.model)
    off = dropout_off(entry.model)
    world = dist.get_world_size()
    try:
        everything = gathered(micro_batches)
        reference, parts = reference_step(entry, device, everything, own, initial)
        reference.pop("seconds", None)
        reference_loss = reference.pop("loss")
        one_process = (f"one process on the {world} ranks' samples in one micro-batch" if parts == 1 else
                 f"one process on the {world} ranks' samples in {parts} micro-batches (the whole did not fit)")
        restore(entry.model, initial)
        replicated = replicate(entry, device, switches)
        diverged = nonfinite_loss(reference_loss, 1, f" of the reference ({one_process}, fp32)")
        if diverged:
            return replicated, diverged
        loop = Loop(entry, device, switches, len(micro_batches), replicated=replicated)
        loop.step(with_variant(entry.make_optimizer(entry.model.parameters()), switches.get("optimizer", own)),
                  micro_batches)
        diff = update_difference(entry.model, initial, reference)
        tol = TOLERANCE_BF16 if switches.get("bf16_matmuls") == "on" else TOLERANCE_FP32
        if not (diff <= tol):
            return replicated, (f"the first step of {world} ranks moves the parameters {diff:.3g} (relative to the "
                                f"update) away from {one_process} (tolerance {tol:g}): a loss that depends on the split over "
                                "ranks (batch norm, a mean per micro-batch?)")
        return replicated, None
    finally:
        restore(entry.model, initial)
        for m in off:
            m.train()


# ---- the communication a step waits for ----------------------------------------------------------------------------
COMMUNICATION_PREFIXES = ("gloo:", "nccl:", "c10d::", "record_param_comms", "FSDP::all_gather",
                          "FSDP::post_backward_reduce")


def _union(intervals: List[tuple]) -> List[tuple]:
    merged: List[list] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [tuple(m) for m in merged]


def _length(intervals: List[tuple]) -> float:
    return sum(end - start for start, end in intervals)


def _minus(a: List[tuple], b: List[tuple]) -> List[tuple]:
    """The parts of the (merged) intervals `a` that no interval of (merged) `b` covers."""
    out, j = [], 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k, at = j, start
        while k < len(b) and b[k][0] < end:
            if b[k][0] > at:
                out.append((at, b[k][0]))
            at = max(at, b[k][1])
            k += 1
        if at < end:
            out.append((at, end))
    return out


def exposed_communication(events, on_gpu: bool) -> Dict[str, float]:
    """From a profiled step's events: the seconds a collective was in flight and the seconds of those during which
    nothing computed (the step waited for it). On a GPU, kernels: NCCL's against the others'. On the CPU, gloo's
    work runs in its own threads: its spans against the aten operators of the threads that issue the step's work
    (the ones that record c10d calls or autograd). Times in microseconds in, seconds out."""
    if on_gpu:
        kernels = [e for e in events if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type)]
        comm = _union([(e.time_range.start, e.time_range.end) for e in kernels if "nccl" in e.name.lower()])
        compute = _union([(e.time_range.start, e.time_range.end) for e in kernels if "nccl" not in e.name.lower()])
    else:
        comm = _union([(e.time_range.start, e.time_range.end) for e in events if e.name.startswith(COMMUNICATION_PREFIXES)
                       and not e.name.startswith(("c10d::", "record_param_comms"))])
        workers = {e.thread for e in events if e.name.startswith(("c10d::", "autograd::engine", "Optimizer.step"))}
        compute = _union([(e.time_range.start, e.time_range.end) for e in events if e.thread in workers
                          and e.name.startswith("aten::")])
    return {"communication_seconds": _length(comm) / 1e6, "exposed_seconds": _length(_minus(comm, compute)) / 1e6}


def profiled_steps(step, steps: int, on_gpu: bool) -> Dict[str, float]:
    """`steps` steps under torch.profiler: their wall seconds, the seconds a collective was in flight and those the
    step waited for one (exposed_communication), and that share of the wall time."""
    import time
    import torch
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        for _ in range(steps):
            step()
        if on_gpu:
            torch.cuda.synchronize()
        wall = time.perf_counter() - started
    said = exposed_communication(prof.events(), on_gpu)
    said.update(wall_seconds=wall, steps=steps, share=min(said["exposed_seconds"] / wall, 1.0) if wall > 0 else 0.0)
    return said

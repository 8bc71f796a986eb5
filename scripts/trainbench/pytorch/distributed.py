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
gathered samples, so every rank reaches the same verdict without another message.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

# Each switch's first value is what a loop that calls DDP's defaults does (no no_sync(): every micro-batch reduces).
REPLICATED_SWITCHES = {"parallel": ("ddp", "fsdp", "fsdp_no_reshard"), "no_sync": ("off", "on"), "bucket_mb": ("25", "5", "100"),
                       "gradient_as_bucket_view": ("off", "on"), "static_graph": ("off", "on")}


def world_from_environment() -> Optional[Dict[str, int]]:
    """rank, world_size and local_rank as torchrun sets them, or None in a process of its own."""
    size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if size <= 1:
        return None
    return {"rank": int(os.environ["RANK"]), "world_size": size, "local_rank": int(os.environ.get("LOCAL_RANK", "0"))}


def join(device) -> None:
    """The process group of this rank: NCCL on GPUs (one rank per GPU), gloo on the CPU."""
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")


DDP_ONLY = ("bucket_mb", "gradient_as_bucket_view", "static_graph")


def sharded(switches: Dict[str, str]) -> bool:
    return switches.get("parallel", "ddp").startswith("fsdp")


def replicate(model, device, switches: Dict[str, str]):
    """The model as the candidate trains it on the ranks: fully_shard'ed in place (parallel=fsdp*), else in
    DistributedDataParallel (rank 0's parameters broadcast to all)."""
    if sharded(switches):
        return shard(model, switches.get("parallel") == "fsdp")
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None,
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


def skipping_reduction(model):
    """A context in which a backward keeps its gradients on this rank (the no_sync switch): DDP's no_sync(), or
    FSDP2's set_requires_gradient_sync(False) (its reduce-scatter waits for the micro-batch that syncs)."""
    import contextlib
    if hasattr(model, "no_sync"):
        return model.no_sync()

    @contextlib.contextmanager
    def unsynced():
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    return unsynced()


def whole(tensor):
    """A parameter as one process holds it: an FSDP2 shard (a DTensor) gathered, a plain tensor as it is."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


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
        replicated = replicate(entry.model, device, switches)
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

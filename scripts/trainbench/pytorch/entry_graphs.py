"""The cuda_graphs switch of `autotune --entry`: each micro-batch's forward, loss and backward captured once as
a CUDA graph over static inputs and replayed (PyTorch's whole-network capture with torch.cuda.graph, "CUDA
Graphs" in its CUDA semantics notes); clipping and the optimizer step stay eager. Each micro-batch is copied
into the graph's static inputs before its replay, a DataLoader's included.

The gradients are accumulated in place: every parameter gets a zero .grad before capture, so the captured
backward adds into those fixed buffers and replays accumulate over the micro-batches like eager backward
calls; the loop zeroes them in place after the optimizer step instead of setting them to None.

Where capture cannot work the candidate is refused with the reason (GraphRefused), never crashed: no CUDA
device, torch.compile on as well, a host sync or an operation capture does not allow in the loss (.item(),
printing a tensor, control flow on a tensor's value), or micro-batches whose shapes change from one to the
next (a graph replays fixed shapes)."""

from __future__ import annotations

from typing import Any, Callable, List, Optional

WARMUP_ITERATIONS = 3  # on a side stream before capture, as PyTorch's notes ask (lazy initialisation, autograd)


class GraphRefused(Exception):
    """Why this candidate cannot run as a CUDA graph: its trial's result, not a crash."""


def refusal(on_gpu: bool, switches) -> Optional[str]:
    """The reason cuda_graphs=on is refused before anything is built, or None."""
    if switches.get("cuda_graphs", "off") != "on":
        return None
    if not on_gpu:
        return "no CUDA device here (a CUDA graph captures and replays GPU work)"
    if switches.get("compile", "off") == "on":
        return ("not with compile=on (torch.compile's mode=\"reduce-overhead\" captures CUDA graphs of its own; the "
                "two are not stacked)")
    return None


def _signature(batch) -> Any:
    """What a replay needs unchanged: each tensor's shape and dtype, every other value as it is."""
    import torch
    if isinstance(batch, torch.Tensor):
        return ("tensor", tuple(batch.shape), batch.dtype)
    if isinstance(batch, dict):
        return {k: _signature(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_signature(v) for v in batch)
    return batch


def _static_copy(batch, device):
    import torch
    if isinstance(batch, torch.Tensor):
        return batch.to(device, copy=True)
    if isinstance(batch, dict):
        return {k: _static_copy(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_static_copy(v, device) for v in batch)
    return batch


def _copy_into(static, batch, non_blocking: bool) -> None:
    import torch
    if isinstance(static, torch.Tensor):
        static.copy_(batch, non_blocking=non_blocking)
    elif isinstance(static, dict):
        for k in static:
            _copy_into(static[k], batch[k], non_blocking)
    elif isinstance(static, (list, tuple)):
        for s, b in zip(static, batch):
            _copy_into(s, b, non_blocking)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else "(no message)"


class GraphedMicroBatch:
    """One micro-batch's `run` (forward, loss, backward; returns the loss detached) as a CUDA graph captured on
    `example` (a micro-batch: its shapes are the graph's). Calling it copies a micro-batch into the static
    inputs, replays, and returns the loss; the gradients accumulate into the parameters' .grad."""

    def __init__(self, run: Callable, params: List, example, device, looks_like_oom: Callable):
        import torch
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.params, self.device = params, device
        self.shapes = _signature(example)
        self.static = _static_copy(example, device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        try:
            with torch.cuda.stream(side):
                for _ in range(WARMUP_ITERATIONS):
                    run(self.static)
            torch.cuda.current_stream(device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_loss = run(self.static)
        except Exception as e:  # noqa: BLE001 - out of memory is the trial's oom; any other failure refuses capture
            if looks_like_oom(e):
                raise
            raise GraphRefused(f"capture failed ({type(e).__name__}: {_one_line(e)}): a host sync in the loss "
                               "(.item(), printing a tensor, control flow on a tensor's value) or an operation CUDA "
                               "graphs cannot capture") from None
        zero_grads(params)  # the warm-up's gradients

    def __call__(self, batch, non_blocking: bool = False):
        shapes = _signature(batch)
        if shapes != self.shapes:
            raise GraphRefused(f"the micro-batches change shape ({self.shapes} captured, {shapes} now): a CUDA graph "
                               "replays the shapes it captured")
        _copy_into(self.static, batch, non_blocking)
        self.graph.replay()
        return self.static_loss.clone()


def zero_grads(params) -> None:
    """In place: the captured backward adds into these buffers."""
    import torch
    grads = [p.grad for p in params if p.grad is not None]
    if grads:
        torch._foreach_zero_(grads)

"""The PyTorch twin of trainbench's training step (kernels/step/): the model, data, loss, clipping and AdamW
of the C++ step written as a PyTorch program, so that what autotune tunes on the C++ step can be tuned on the
PyTorch program it stands for.

The twin is built from the workload as the C++ resolved it (`dump_step WORKLOAD` writes it as JSON, with the
constants the step is built from), never from the YAML, and is the same training step, number for number:
- parameters named, laid out and initialised as model.h does (runtime/random.h's generators, ported below:
  the twin is a second program by design, held to the C++ step by its tests); the batches are trainer.h's
  (its Markov-chain dataset, its shuffle, its micro-batches);
- the forward of model.h: token + position embedding, pre-norm blocks (causal attention, tanh-GELU MLP), a
  final layernorm, the LM head tied to the token embedding, cross-entropy averaged over the step's tokens;
- the propagator after every block runs model.h's CG (all rows at once until the worst row's relative
  residual is below cg_tol), its lazy gate and per-layer cache, and its implicit backward: a second, cold
  solve (A is symmetric) in a torch.autograd.Function, not autograd through the iterations;
- clip_grad_norm_ and torch.optim.AdamW in the workload's variant (per_tensor: foreach=False, foreach:
  foreach=True, fused: fused=True), as the C++ optimizer mirrors them;
- the data section as a PyTorch program does it: a Dataset and a DataLoader over the same sample order,
  per-sample __getitem__ copies stacked by the default collate, or one batched gather (__getitems__); from
  pageable or pinned host memory, or a dataset resident on the device indexed there;
- the logging policy: the loss read to the host (.item()) every step, every N steps, or asynchronously (a
  non-blocking copy read one step later), as trainer.h's read_per_policy;
- bf16_matmuls as torch.autocast(dtype=torch.bfloat16) around forward and loss;
- cuda_graphs (a GPU only, without the propagator, whose CG reads the host every iteration) as the C++
  step captures them: from step GRAPH_CAPTURE_STEP on, each micro-batch's forward, loss and backward is one
  graph replay (torch.cuda.make_graphed_callables over the model and its loss), the batch copied into the
  graph's static inputs; data loading, clipping and AdamW stay eager;
- a step can be profiled (`step(clock=PartClock(device))`): its parts (STEP_PARTS) marked where trainer.h's
  profiled step marks them, the propagator's solves apart, for the step's PyTorch row (cases/step.py).
tests/scripts/test_torch_step.py holds the twin's parameters, loss, gradients and the parameters after
optimizer steps to the C++ step's in double precision.

Imported only where torch is installed.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..errors import UsageError

DUMP_SCHEMA = "trainbench-step-dump/1"   # tests/dump_step.cpp's
ATTENTION = ("naive", "sdpa")            # matmul-softmax-matmul (the attention stage's naive), or fused SDPA
# the workload's `switches: {attention: ...}` as the twin runs it: the C++ step's fused is FlashAttention-2, SDPA's
ATTENTION_OF_SWITCH = {"naive": "naive", "fused": "sdpa"}
OPTIMIZER_VARIANTS = {"per_tensor": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
# clip_grad_norm_'s max_norm / (norm + 1e-6) is fixed in PyTorch: a C++ step with another cannot be twinned
TORCH_CLIP_NORM_EPS = 1e-6
# model.h's initialisation: GPT-2's N(0, 0.02) as a uniform of the same spread
INIT_SPREAD = 0.02 * math.sqrt(3.0)
# trainer.h's synthetic dataset: each token's likely successor, taken with this probability, else the other
MARKOV_FIRST = 0.75


# ---- runtime/random.h -------------------------------------------------------------------------------------
M64 = (1 << 64) - 1


def splitmix64_np(x):
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def uniform_array(seed: int, count: int, lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
    """uniform_at(seed, i) for i = 0..count-1, fp32: lo + (hi - lo) * (24 random bits) / 2^24."""
    base = np.uint64((seed * 0x632BE59BD9B4E019) & M64)
    bits = (splitmix64_np(base + np.arange(count, dtype=np.uint64)) >> np.uint64(40)).astype(np.float64)
    return (lo + (hi - lo) * bits / 16777216.0).astype(np.float32)


def fisher_yates(n: int, draws) -> List[int]:
    """0..n-1 shuffled from the top: slot j swaps with draws[j] % (j + 1), j = n-1 .. 1."""
    order = list(range(n))
    picks = (draws % (np.arange(n, dtype=np.uint64) + np.uint64(1))).tolist() if n > 1 else [0] * n
    for j in range(n - 1, 0, -1):
        k = picks[j]
        order[j], order[k] = order[k], order[j]
    return order


# ---- parameters (model.h) ---------------------------------------------------------------------------------
LAYER_TENSORS = ("ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b", "fcw", "fcb", "fcprojw",
                 "fcprojb")


def parameter_shapes(model: dict) -> List[Tuple[str, Tuple[int, ...]]]:
    """model.h's parameter_shapes: (name, shape) in the order of the C++ parameter buffer."""
    C, H = model["d_model"], model["mlp_ratio"] * model["d_model"]
    layer = {"ln1w": (C,), "ln1b": (C,), "qkvw": (3 * C, C), "qkvb": (3 * C,), "attprojw": (C, C), "attprojb": (C,),
             "ln2w": (C,), "ln2b": (C,), "fcw": (H, C), "fcb": (H,), "fcprojw": (C, H), "fcprojb": (C,)}
    out = [("wte", (model["vocab"], C)), ("wpe", (model["seq_len"], C))]
    for l in range(model["layers"]):
        out += [(f"h{l}.{name}", layer[name]) for name in LAYER_TENSORS]
    return out + [("lnfw", (C,)), ("lnfb", (C,))]


def initial_parameters(model: dict, seed_params: int) -> Dict[str, np.ndarray]:
    """Model::initialise_parameters in float64: tensor t is scale x uniform_at(seed_params * 1000 + t, i) (the
    float uniform times a double scale, as the C++ multiplies them), layernorm weights 1, biases 0."""
    residual_scale = INIT_SPREAD / math.sqrt(2.0 * model["layers"])
    out = {}
    for t, (name, shape) in enumerate(parameter_shapes(model)):
        kind = name.split(".")[-1]
        size = math.prod(shape)
        if kind in ("wte", "wpe", "qkvw", "fcw"):
            values = INIT_SPREAD * uniform_array(seed_params * 1000 + t, size).astype(np.float64)
        elif kind in ("attprojw", "fcprojw"):
            values = residual_scale * uniform_array(seed_params * 1000 + t, size).astype(np.float64)
        elif kind in ("ln1w", "ln2w", "lnfw"):
            values = np.ones(size)
        else:
            values = np.zeros(size)
        out[name] = values.reshape(shape)
    return out


# ---- data (trainer.h) -------------------------------------------------------------------------------------
def make_dataset(samples: int, seq_len: int, vocab: int, seed_data: int) -> np.ndarray:
    """trainer.h's make_dataset: samples x (seq_len + 1) int32 tokens; sample s starts at splitmix64(seed x 7919
    + s) % vocab and steps to (7 t + 1) % vocab when uniform_at(seed, s (seq_len + 1) + t, 0, 1) < 0.75, else
    to (3 t + 2) % vocab."""
    width = seq_len + 1
    s = np.arange(samples, dtype=np.uint64)
    token = (splitmix64_np(np.uint64(seed_data * 7919) + s) % np.uint64(vocab)).astype(np.int64)
    u = uniform_array(seed_data, samples * width, 0.0, 1.0).reshape(samples, width)
    rows = np.empty((samples, width), dtype=np.int32)
    for t in range(width):
        rows[:, t] = token
        token = np.where(u[:, t] < MARKOV_FIRST, (token * 7 + 1) % vocab, (token * 3 + 2) % vocab)
    return rows


class SyntheticData:
    """The trainer's data path: an epoch order shuffled by Fisher-Yates (slot i - 1 swaps with splitmix64(seed
    x 104729 + epoch x 1000003 + i) % i, applied to the previous epoch's order), micro-batches taken from it in
    turn, a new epoch's shuffle when it runs out; a sample is tokens row[:T] and targets row[1:]."""

    def __init__(self, samples: int, seq_len: int, vocab: int, seed_data: int):
        self.seed_data = seed_data
        self.rows = make_dataset(samples, seq_len, vocab, seed_data)
        self.order = np.arange(samples, dtype=np.int32)
        self.epoch = 0
        self.cursor = 0
        self._shuffle()

    def _shuffle(self) -> None:
        n = len(self.order)
        first = (self.seed_data * 104729 + self.epoch * 1000003 + 1) & M64   # the draw of slot 0 (i = 1)
        draws = splitmix64_np(np.uint64(first) + np.arange(n, dtype=np.uint64))
        self.order = self.order[fisher_yates(n, draws)]
        self.epoch += 1
        self.cursor = 0

    def next_samples(self, micro: int) -> List[int]:
        picked = []
        for _ in range(micro):
            if self.cursor >= len(self.order):
                self._shuffle()
            picked.append(int(self.order[self.cursor]))
            self.cursor += 1
        return picked

    def batch(self, samples: List[int], device=None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Tokens and targets [B, T] (int64, what embedding and cross_entropy take) of these samples."""
        rows = torch.from_numpy(self.rows[samples].astype(np.int64))
        return rows[:, :-1].contiguous().to(device), rows[:, 1:].contiguous().to(device)


class TokenDataset(torch.utils.data.Dataset):
    """The dataset's rows as a map-style Dataset: __getitem__ returns one sample's row (a copy, as a user's
    __getitem__ builds a tensor), __getitems__ a batch of them in one gather (what DataLoader calls instead
    of per-sample fetches when it is there)."""

    def __init__(self, rows: torch.Tensor, per_sample_copy: bool):
        self.rows = rows
        if not per_sample_copy:
            self.__getitems__ = self._gather

    def __len__(self) -> int:
        return self.rows.shape[0]

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.rows[index].clone()

    def _gather(self, indices: List[int]) -> torch.Tensor:
        return self.rows.index_select(0, torch.tensor(indices, dtype=torch.int64))


class EpochBatches(torch.utils.data.Sampler):
    """The trainer's micro-batches as a DataLoader batch_sampler: SyntheticData's order, without end."""

    def __init__(self, data: SyntheticData, micro: int):
        self.data, self.micro = data, micro
        self.last: List[int] = []   # the batch handed out last (no worker processes: the one just loaded)

    def __iter__(self):
        while True:
            self.last = self.data.next_samples(self.micro)
            yield self.last


def _collate(batch) -> torch.Tensor:
    """The default collate's stack for per-sample rows; a gathered batch passes through."""
    return batch if isinstance(batch, torch.Tensor) else torch.stack(batch)


DATA_LOCATIONS = ("host_pageable", "host_pinned", "device")


class DataPath:
    """The workload's data section as a PyTorch program loads its micro-batches: a DataLoader (no worker
    processes, as the C++ step loads on its own thread) over TokenDataset with the trainer's sample order,
    pinned when the data is host_pinned and a GPU is used, then .to(device) (non_blocking from pinned
    memory); or, with the data resident on the device, the rows indexed there. Each batch is tokens and
    targets [B, T] int64. Every micro-batch's samples are kept in `picked` (the last one's)."""

    def __init__(self, data: SyntheticData, spec: dict, micro: int, device=None):
        location = spec["location"]
        if location not in DATA_LOCATIONS:
            raise UsageError(f"data location must be one of {', '.join(DATA_LOCATIONS)}, not {location!r}")
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.on_gpu = self.device.type == "cuda"
        self.data, self.micro = data, micro
        rows = torch.from_numpy(data.rows.astype(np.int64))
        self.picked: List[int] = []
        self.resident = rows.to(self.device) if location == "device" else None
        self.non_blocking = location == "host_pinned" and self.on_gpu
        if self.resident is None:
            self.sampler = EpochBatches(data, micro)
            loader = torch.utils.data.DataLoader(TokenDataset(rows, bool(spec["per_sample_copy"])),
                                                 batch_sampler=self.sampler, collate_fn=_collate,
                                                 pin_memory=self.non_blocking)
            self._batches = iter(loader)

    def next_batch(self) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.resident is not None:
            self.picked = self.data.next_samples(self.micro)
            index = torch.tensor(self.picked, dtype=torch.int64).to(self.device, non_blocking=False)
            rows = self.resident.index_select(0, index)
        else:
            rows = next(self._batches).to(self.device, non_blocking=self.non_blocking)
            self.picked = self.sampler.last
        return rows[:, :-1], rows[:, 1:]


LOGGING_SYNCS = ("every_step", "every_n", "async")


class LossLog:
    """trainer.h's read_per_policy, the PyTorch way: every_step reads loss and grad norm with .item() after
    every step; every_n every `interval` steps (the loss summed on the device in between); async copies them
    non-blocking into pinned memory and reads the copy queued one step earlier, which never waits for the
    step. `read` holds the last values read to the host: (step, mean loss since the previous read, grad norm)."""

    def __init__(self, logging: dict, device=None):
        if logging["sync"] not in LOGGING_SYNCS:
            raise UsageError(f"logging sync must be one of {', '.join(LOGGING_SYNCS)}, not {logging['sync']!r}")
        self.sync, self.interval = logging["sync"], max(int(logging["interval"]), 1)
        self.on_gpu = device is not None and torch.device(device).type == "cuda"
        self.steps = 0
        self.since_read = 0
        self.loss_sum: Optional[torch.Tensor] = None
        self.pending = None   # async: (host copy, its event, steps in it)
        self.read: Optional[Tuple[int, float, float]] = None
        self.reads = 0

    def after_step(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        self.steps += 1
        self.since_read += 1
        self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss
        if self.sync == "every_n" and self.steps % self.interval:
            return
        values = torch.stack([self.loss_sum, grad_norm.to(self.loss_sum.dtype)])
        steps_in = self.since_read
        self.loss_sum, self.since_read = None, 0
        if self.sync == "async":
            if self.on_gpu:
                host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
                host.copy_(values, non_blocking=True)
                event = torch.cuda.Event()
                event.record()
            else:
                host, event = values, None   # torch.stack made it: nothing later writes it
            arrived, self.pending = self.pending, (host, event, steps_in)
            if arrived is None or (arrived[1] is not None and not arrived[1].query()):
                return
            host, _, steps_in = arrived
            self._take(host.tolist(), steps_in)
        else:
            self._take(values.tolist(), steps_in)   # .tolist(): the .item() of both, one wait

    def _take(self, values: List[float], steps_in: int) -> None:
        self.read = (self.steps, values[0] / max(steps_in, 1), values[1])
        self.reads += 1


# ---- the propagator (model.h's propagate) ------------------------------------------------------------------
@dataclass
class SolveStats:
    """model.h's SolveStats: solves, lazy-gate skips, CG iterations and matrix-vector products."""
    solves: int = 0
    skipped: int = 0
    iterations: int = 0
    matvecs: int = 0
    worst_residual: float = 0.0


def _row_dots(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(dim=-1)


def _max_relative(rs: torch.Tensor, bb: torch.Tensor) -> float:
    """cg::CpuRows::residual's worst: max over rows with b != 0 of sqrt(r.r / b.b), read to the host."""
    nonzero = bb > 0
    if not bool(nonzero.any()):
        return 0.0
    return math.sqrt((rs[nonzero].double() / bb[nonzero].double()).max().item())


def _total_relative(rs: torch.Tensor, bb: torch.Tensor) -> float:
    """cg::CpuRows::residual's total: sqrt(sum r.r / sum b.b), the lazy gate's test."""
    b = bb.double().sum().item()
    return math.sqrt(rs.double().sum().item() / b) if b > 0 else 0.0


class RingSolver:
    """y = (I + alpha L)^-1 b for every row (a token's hidden vector), L the Laplacian of the ring lattice that
    joins each feature to its `sparsity` nearest ones, by model.h's CG: every row at once, one host read of
    the worst relative residual per iteration (the host-checked strategy), stopping when it is at most cg_tol
    or after max_iters. Holds the solve counts of every layer, as the C++ model does."""

    def __init__(self, spec: dict):
        self.sparsity = int(spec["sparsity"])
        self.alpha = float(spec["alpha"])
        self.cg_tol = float(spec["cg_tol"])
        self.lazy_tol = float(spec["lazy_tol"])
        self.max_iters = int(spec["max_iters"])
        self.stats = SolveStats()
        self.clock: Optional[PartClock] = None   # set by a profiled step: its solves are the "solver" part

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """A x = x + alpha (k x_i - the k ring neighbours' sum), summed as cg::CpuRows::laplacian_apply sums it."""
        neighbours = torch.zeros_like(x)
        for d in range(1, self.sparsity // 2 + 1):
            neighbours = neighbours + (torch.roll(x, d, dims=-1) + torch.roll(x, -d, dims=-1))
        return x + self.alpha * (self.sparsity * x - neighbours)

    def solve(self, b: torch.Tensor, cache: Optional[torch.Tensor], lazy: bool) -> torch.Tensor:
        """_solve; in a profiled step, timed as the part "solver" apart from the forward or backward it is in
        (as model.h's profiled solves are)."""
        if self.clock is None:
            return self._solve(b, cache, lazy)
        interrupted = self.clock.switch("solver")
        try:
            return self._solve(b, cache, lazy)
        finally:
            self.clock.mark(interrupted)

    @torch.no_grad()
    def _solve(self, b: torch.Tensor, cache: Optional[torch.Tensor], lazy: bool) -> torch.Tensor:
        """With `cache` (the layer's last solution): the lazy gate keeps it when its relative residual
        (over all rows) is below lazy_tol, else CG starts from it and the solution is cached for the next call.
        Without: CG from zero (the backward's solve)."""
        s = self.stats
        s.solves += 1
        warm = cache is not None
        y = cache.clone() if warm else torch.zeros_like(b)
        bb = _row_dots(b, b)
        r = b - self.apply(y)
        s.matvecs += 1
        rs = _row_dots(r, r)
        residual = _max_relative(rs, bb)
        if lazy and warm and _total_relative(rs, bb) < self.lazy_tol:
            s.skipped += 1
            s.worst_residual = max(s.worst_residual, residual)
            return y
        p = r.clone()
        iteration = 0
        while iteration < self.max_iters and residual > self.cg_tol:
            ap = self.apply(p)
            s.matvecs += 1
            s.iterations += 1
            pap = _row_dots(p, ap)
            a = torch.where(pap > 0, rs / pap, torch.zeros_like(rs)).unsqueeze(-1)   # a converged row stays put
            y += a * p
            r -= a * ap
            rs_new = _row_dots(r, r)
            beta = torch.where(rs > 0, rs_new / rs, torch.zeros_like(rs)).unsqueeze(-1)
            p = r + beta * p
            rs = rs_new
            residual = _max_relative(rs, bb)
            iteration += 1
        s.worst_residual = max(s.worst_residual, residual)
        if warm:
            cache.copy_(y)
        return y


class _PropagateFunction(torch.autograd.Function):
    """y = A^-1 b forward (lazy gate, cache); dL/db = A^-1 dL/dy backward by a second, cold solve, as model.h
    differentiates the propagator (A is symmetric)."""

    @staticmethod
    def forward(ctx, b, solver: RingSolver, cache: torch.Tensor, lazy: bool):
        ctx.solver = solver
        return solver.solve(b, cache, lazy)

    @staticmethod
    def backward(ctx, dy):
        return ctx.solver.solve(dy.contiguous(), None, False), None, None, None


class Propagator(nn.Module):
    """The propagator after one block: its layer's cache of the last solution (zeros at first, as the C++
    model allocates it; zeros again if the micro-batch changes shape), the solver shared by all layers."""

    def __init__(self, solver: RingSolver, lazy: bool):
        super().__init__()
        self.solver = solver
        self.lazy = lazy
        self.cache: Optional[torch.Tensor] = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if self.cache is None or self.cache.shape != rows.shape or self.cache.dtype != rows.dtype:
            self.cache = torch.zeros_like(rows)
        return _PropagateFunction.apply(rows, self.solver, self.cache, self.lazy).view_as(x)


# ---- the model (model.h) ----------------------------------------------------------------------------------
def causal_attention(qkv: torch.Tensor, heads: int, fused: bool) -> torch.Tensor:
    """qkv [B, T, 3C] packed as q | k | v, each head's hs = C / heads columns side by side; out [B, T, C].
    Naive: scores scaled by 1/sqrt(hs), the causal softmax, times V (the C++ step's way, the reference);
    fused: scaled_dot_product_attention."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    hs = C // heads
    q, k, v = (t.view(B, T, heads, hs).transpose(1, 2) for t in qkv.split(C, dim=-1))
    if fused:
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        future = torch.ones(T, T, dtype=torch.bool, device=qkv.device).triu(1)
        y = scores.masked_fill(future, float("-inf")).softmax(dim=-1) @ v
    return y.transpose(1, 2).reshape(B, T, C)


class Block(nn.Module):
    """A pre-norm block: x + attention(ln1 x), then + mlp(ln2 .) with the tanh GELU, then the propagator."""

    def __init__(self, values: Dict[str, np.ndarray], heads: int, eps: float, attention: str,
                 propagator: Optional[Propagator], dtype, device):
        super().__init__()
        for name in LAYER_TENSORS:
            setattr(self, name, nn.Parameter(torch.tensor(values[name], dtype=dtype, device=device)))
        self.heads, self.eps, self.fused = heads, eps, attention == "sdpa"
        self.propagator = propagator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        C = x.shape[-1]
        ln1 = F.layer_norm(x, (C,), self.ln1w, self.ln1b, self.eps)
        atty = causal_attention(F.linear(ln1, self.qkvw, self.qkvb), self.heads, self.fused)
        residual2 = x + F.linear(atty, self.attprojw, self.attprojb)
        ln2 = F.layer_norm(residual2, (C,), self.ln2w, self.ln2b, self.eps)
        fch = F.gelu(F.linear(ln2, self.fcw, self.fcb), approximate="tanh")
        residual3 = residual2 + F.linear(fch, self.fcprojw, self.fcprojb)
        return self.propagator(residual3) if self.propagator is not None else residual3


class TwinModel(nn.Module):
    """model.h's Model: tokens [B, T] -> logits [B, T, vocab]."""

    def __init__(self, workload: dict, constants: dict, attention: Optional[str] = None, dtype=torch.float64,
                 device=None):
        super().__init__()
        if attention is None:   # the workload's own switch (older dumps have none: the naive step they came from)
            attention = ATTENTION_OF_SWITCH[workload["switches"].get("attention", "naive")]
        if attention not in ATTENTION:
            raise UsageError(f"attention must be one of {', '.join(ATTENTION)}, not {attention!r}")
        model, prop, switches = workload["model"], workload["propagator"], workload["switches"]
        values = initial_parameters(model, int(constants["seed_params"]))

        def as_param(name: str) -> nn.Parameter:
            return nn.Parameter(torch.tensor(values[name], dtype=dtype, device=device))

        self.wte, self.wpe = as_param("wte"), as_param("wpe")
        self.solver = RingSolver(prop) if prop["enabled"] else None
        eps = float(constants["layernorm_eps"])
        blocks = []
        for l in range(model["layers"]):
            layer = {name: values[f"h{l}.{name}"] for name in LAYER_TENSORS}
            propagator = Propagator(self.solver, bool(switches["lazy_cg"])) if self.solver else None
            blocks.append(Block(layer, model["heads"], eps, attention, propagator, dtype, device))
        self.blocks = nn.ModuleList(blocks)
        self.lnfw, self.lnfb = as_param("lnfw"), as_param("lnfb")
        self.eps = eps
        self.checkpointing = bool(switches["activation_checkpointing"])

    def layout(self) -> List[Tuple[str, nn.Parameter]]:
        """The parameters under their C++ names, in the C++ buffer's order."""
        out = [("wte", self.wte), ("wpe", self.wpe)]
        for l, block in enumerate(self.blocks):
            out += [(f"h{l}.{name}", getattr(block, name)) for name in LAYER_TENSORS]
        return out + [("lnfw", self.lnfw), ("lnfb", self.lnfb)]

    def solve_stats(self) -> SolveStats:
        return self.solver.stats if self.solver else SolveStats()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte[tokens] + self.wpe[: tokens.shape[1]]
        for block in self.blocks:
            # activation_checkpointing: the block's activations are recomputed in backward, as the C++
            # recomputes a layer's; the recomputed propagator meets its cache and gives the same output
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing and torch.is_grad_enabled() else block(x)
        x = F.layer_norm(x, (x.shape[-1],), self.lnfw, self.lnfb, self.eps)
        return F.linear(x, self.wte)


# ---- the step (trainer.h) ---------------------------------------------------------------------------------
STEP_PARTS = ("data", "forward", "backward", "optimizer", "sync", "solver")   # trainer.h's StepReport parts


class PartClock:
    """A step timed part by part, as Trainer::step(profile=true) marks it: mark(part) starts `part` where the
    part before ends; on a GPU a CUDA event recorded on the current stream (nothing waits for it until
    seconds()), on the CPU the steady clock. switch(part) starts a part inside another (the propagator's
    solves inside forward and backward) and returns the part it interrupted, to be marked again after."""

    def __init__(self, device=None):
        self.on_gpu = device is not None and torch.device(device).type == "cuda"
        self.marks: List[Tuple[str, object]] = []   # (the part that starts here, its event or ns)

    def mark(self, part: str) -> None:
        if self.on_gpu:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((part, event))
        else:
            self.marks.append((part, time.perf_counter_ns()))

    def switch(self, part: str) -> str:
        interrupted = self.marks[-1][0] if self.marks else ""
        self.mark(part)
        return interrupted

    def seconds(self) -> Dict[str, float]:
        """Seconds per part, summed over its spans; the last mark only ends the span before it."""
        if self.on_gpu:
            torch.cuda.synchronize()
        out: Dict[str, float] = {}
        for (part, begin), (_, end) in zip(self.marks, self.marks[1:]):
            span = begin.elapsed_time(end) * 1e-3 if self.on_gpu else (end - begin) * 1e-9
            out[part] = out.get(part, 0.0) + span
        return out


def _unmarked(part: str) -> None:
    """An unprofiled step's marks: none."""


GRAPH_CAPTURE_STEP = 1   # step.h's graph_capture_step: the steps before it run eagerly (the first is checked)


class MicroBatchLoss(nn.Module):
    """A micro-batch's per-token losses [B, T] from tokens and targets: the part the C++ step captures in a
    graph, as one module so that make_graphed_callables graphs its forward and backward together."""

    def __init__(self, model: TwinModel, bf16: bool, device_type: str):
        super().__init__()
        self.model, self.bf16, self.device_type = model, bf16, device_type

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # cache_enabled=False: autocast's cast cache must not outlive a graph capture
        with torch.autocast(self.device_type, dtype=torch.bfloat16, enabled=self.bf16, cache_enabled=False):
            logits = self.model(tokens)
            flat = logits.reshape(-1, logits.shape[-1])
            per_token = F.cross_entropy(flat.float() if self.bf16 else flat, targets.reshape(-1), reduction="none")
        return per_token.view(targets.shape)


@dataclass
class StepResult:
    loss: torch.Tensor        # the mean per-token loss over the step's micro-batches (not read to the host)
    grad_norm: torch.Tensor   # the global gradient norm before clipping
    micro_batches: List[List[int]]   # the dataset samples of each micro-batch
    first_losses: Optional[torch.Tensor] = None   # with record_first: the first sequence's per-token losses


class TrainingStep:
    """One optimizer step of the workload, as Trainer::step runs it: `accumulation` micro-batches from the
    data path, each loss cross-entropy's mean over the micro-batch's tokens divided by the accumulation (so
    the step's gradient is that of the mean over all its tokens), then clip_grad_norm_ (when grad_clip > 0),
    AdamW, the gradients cleared, and the host reads the logging policy asks for.

    `resolved` is dump_step's document (its "workload" and "constants"); `attention` picks naive or SDPA, by
    default what the workload's attention switch says."""

    def __init__(self, resolved: dict, dtype=torch.float64, attention: Optional[str] = None, device=None):
        if resolved.get("schema") != DUMP_SCHEMA:
            raise UsageError(f"not a {DUMP_SCHEMA} document (schema {resolved.get('schema')!r})")
        w, constants = resolved["workload"], resolved["constants"]
        if float(constants["clip_norm_eps"]) != TORCH_CLIP_NORM_EPS:
            raise UsageError(f"the C++ step clips with norm + {constants['clip_norm_eps']}; "
                             f"clip_grad_norm_ adds {TORCH_CLIP_NORM_EPS}")
        self.workload = w
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.micro = int(w["batch"]["micro"])
        self.accumulation = int(w["batch"]["accumulation"])
        self.model = TwinModel(w, constants, attention, dtype, self.device)
        self.params = [p for _, p in self.model.layout()]
        opt = w["optimizer"]
        if opt["variant"] not in OPTIMIZER_VARIANTS:
            raise UsageError(f"unknown optimizer variant {opt['variant']!r} ({', '.join(OPTIMIZER_VARIANTS)})")
        self.grad_clip = float(opt["grad_clip"])
        self.optimizer = torch.optim.AdamW(self.params, lr=opt["lr"], betas=tuple(opt["betas"]), eps=opt["eps"],
                                           weight_decay=opt["weight_decay"], **OPTIMIZER_VARIANTS[opt["variant"]])
        data = w["data"]
        self.data = SyntheticData(data["samples"], w["model"]["seq_len"], w["model"]["vocab"],
                                  int(constants["seed_data"]))
        self.loader = DataPath(self.data, data, self.micro, self.device)
        # bf16_matmuls: the matrix products in bf16 under autocast, the rest (and the CG) in the model's dtype
        self.bf16 = bool(w["switches"]["bf16_matmuls"])
        self.log = LossLog(w["logging"], self.device)
        self.losses = MicroBatchLoss(self.model, self.bf16, self.device.type)
        self.graphs = bool(w["switches"]["cuda_graphs"])
        if self.graphs and self.device.type != "cuda":
            raise UsageError("cuda_graphs needs a GPU (the twin runs on the CPU)")
        if self.graphs and self.model.solver is not None:
            raise UsageError("cuda_graphs with the propagator: its CG reads the host every iteration (as the C++ step, "
                             "the twin does not capture it)")
        self.graphed: Optional[nn.Module] = None   # the captured micro-step, from GRAPH_CAPTURE_STEP on
        self.steps = 0

    def micro_step(self, tokens: torch.Tensor, targets: torch.Tensor, keep_losses: bool = False, mark=_unmarked):
        """Forward and backward of one micro-batch, accumulating into the gradients; its share of the step's
        loss, detached (with keep_losses, also the per-token losses [B, T], detached). `mark`: a PartClock's,
        in a profiled step."""
        mark("forward")
        losses = self.losses
        if self.graphs and self.steps >= GRAPH_CAPTURE_STEP:
            if self.graphed is None:   # capture (after make_graphed_callables' own warm-up iterations)
                self.graphed = torch.cuda.make_graphed_callables(self.losses, (tokens.contiguous(), targets.contiguous()))
            losses = self.graphed
            tokens, targets = tokens.contiguous(), targets.contiguous()   # the static inputs' layout
        per_token = losses(tokens, targets)
        loss = per_token.mean() / self.accumulation
        mark("backward")
        loss.backward()
        if keep_losses:
            return loss.detach(), per_token.detach().view(targets.shape)
        return loss.detach()

    def step(self, record_first: bool = False, clock: Optional[PartClock] = None) -> StepResult:
        """One optimizer step; with record_first, the first micro-batch's first sequence's per-token losses
        are kept (what the trial checks against the C++ double-precision reference). With a clock, the step
        is profiled: its parts (STEP_PARTS) marked on it as trainer.h marks them."""
        if clock is None:
            return self._step(record_first, _unmarked)
        if self.model.solver is not None:
            self.model.solver.clock = clock
        try:
            return self._step(record_first, clock.mark)
        finally:
            if self.model.solver is not None:
                self.model.solver.clock = None

    def _step(self, record_first: bool, mark) -> StepResult:
        loss = torch.zeros((), dtype=self.params[0].dtype, device=self.device)
        picked, first = [], None
        for k in range(self.accumulation):
            mark("data")
            tokens, targets = self.loader.next_batch()
            picked.append(list(self.loader.picked))
            if record_first and k == 0:
                share, per_token = self.micro_step(tokens, targets, keep_losses=True, mark=mark)
                first = per_token[0].double().cpu()
            else:
                share = self.micro_step(tokens, targets, mark=mark)
            loss += share
        mark("optimizer")   # clipping, AdamW and clearing the gradients, as trainer.h's optimizer part
        if self.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in self.params])
        self.optimizer.step()
        # With graphs the gradients stay allocated: the replayed backward accumulates into them in place
        self.optimizer.zero_grad(set_to_none=not self.graphs)
        self.steps += 1
        mark("sync")
        self.log.after_step(loss, grad_norm.detach())
        mark("end")
        return StepResult(loss, grad_norm.detach(), picked, first)


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

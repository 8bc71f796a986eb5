"""The torch side of scripts/torch-peers: one case per peer (set-up, a check against a plain reference, one
call), the timing (CUDA events, as benchsuite's), and the device's context. Imported only to measure.

A case's check() makes its first call(s) itself and compares them with a reference computed another way,
in fp64 where there is arithmetic: the result of a peer that fails it is `incorrect` and never timed.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import math
import re
import time
import warnings
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from .errors import UsageError
from .torch_peers import (CG_CHECK_EVERY, CG_MAX_ITERATIONS, CG_RESIDUAL_ATOL, CG_TOL, CG_WINDOW, DISTURBED_SHARE,
                          HOSTSYNC_ASYNC_SLOTS, LAPLACIAN_ALPHA, LAZY_CG_TOL, MAX_BATCH, SPMV_FP64_RTOL,
                          THROTTLED_SHARE, TOL_ATTENTION, TOL_FP32, WARMUP_CALLS, WARMUP_S, Bench, Outcome, Tolerance,
                          Verdict, Watch, Watched, _median, alloc_probe_value, attention_shape, cg_rhs_sequence,
                          collate_fields, epoch_order, hostsync_metric_sums, hostsync_predictions, laplacian_csr,
                          laplacian_nnz, launch_window, others_share, param_set_sizes, parse_shape, read_cpu_ticks,
                          take_watched, throttled_share, uniform_array)

DEVICE = torch.device("cuda")   # use_device() sets it before any case is made

# torch.optim.AdamW's defaults, which the stage's are (kernels/runtime/defaults.h adamw_*)
ADAMW = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2}
ADAMW_SEEDS = (41, 42)                    # parameters, gradients (adamw::seed_param, seed_grad)
CLIP_MAX_NORM = 1.0                       # defaults::clip_max_norm (clip_grad_norm_(max_norm=1.0), docs/sources.md#003-t4-transformer)
CLIP_NORM_EPS = 1e-6                      # defaults::clip_norm_eps, torch.nn.utils' max_norm / (norm + 1e-6)
ATTENTION_SEEDS = (21, 22, 23)            # q, k, v (attention::seed_q, seed_k, seed_v)
ATTENTION_CHECKED_ROWS = 48               # query rows checked against fp64 (defaults::attention_checked_rows)
# The naive path holds about three B x H x S x S fp32 tensors at once (scores, masked, softmax): on the CPU a
# problem whose scores pass this is unsupported (the CUDA problem 4x16x4096x128 has 4 GiB of them), not swapped.
NAIVE_CPU_SCORES_BYTES = 1 << 30
LAUNCH_STATE_BUFFERS = 4                  # launch::state_buffers
COLLATE_VOCAB = 50257                     # collate::vocab
COLLATE_SEEDS = {"input_embedding": 21, "target_embedding": 22, "tokens": 23}   # collate::seed_*
ALLOC_CHECK_STEPS = 3


class Unsupported(Exception):
    """The peer cannot run this problem here; the message says why."""


def require_cuda() -> None:
    if not torch.cuda.is_available():
        built = "built without CUDA" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise UsageError(f"PyTorch {torch.__version__} ({built}) sees no CUDA device: "
                         "torch.cuda.is_available() is False (--device cpu runs the CPU peers)")


def use_device(kind: str) -> None:
    """cuda (checked to be there) or cpu: where every case puts its tensors and how it is timed."""
    global DEVICE
    if kind == "cuda":
        require_cuda()
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


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _generator(seed: int) -> torch.Generator:
    g = torch.Generator(device=DEVICE)
    g.manual_seed(seed)
    return g


def uniform(shape, seed: int, dtype=torch.float32) -> torch.Tensor:
    """Uniform in [-1, 1) on the device, drawn in fp32 (fp64 for fp64) and rounded to `dtype`."""
    draw = torch.float64 if dtype == torch.float64 else torch.float32
    return (torch.rand(shape, generator=_generator(seed), device=DEVICE, dtype=draw) * 2 - 1).to(dtype)


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

    def counters(self, median_ns: float) -> Dict[str, float]:
        return {}


# ---- adamw -----------------------------------------------------------------------------------------------
class AdamWCase(Case):
    """torch.optim.AdamW over the stage's parameter set (param_set.cpp's sizes), one step() per call."""

    KINDS = {"fused": {"fused": True}, "foreach": {"foreach": True, "fused": False},
             "per_tensor": {"foreach": False, "fused": False}}

    def __init__(self, bench: Bench, env: Env):
        p = bench.problem
        if p["dtype"] != "fp32":
            raise Unsupported("torch keeps AdamW's moments in the parameters' dtype; the stage's bf16 keeps them fp32")
        gp, gg = (_generator(s) for s in ADAMW_SEEDS)
        self.params = []
        for n in param_set_sizes(int(p["params"]), int(p["tensors"])):
            param = torch.nn.Parameter(torch.rand(n, generator=gp, device=DEVICE) * 2 - 1)
            param.grad = torch.rand(n, generator=gg, device=DEVICE) * 2 - 1   # fixed across steps, as the stage's
            self.params.append(param)
        self.opt = torch.optim.AdamW(self.params, **ADAMW, **self.KINDS[bench.peer.variant])

    def call(self):
        self.opt.step()

    def check(self) -> Verdict:
        """The first step from zero moments against the update written out in fp64."""
        before = [q.detach().double() for q in self.params]
        self.opt.step()
        lr, (b1, b2), eps, wd = ADAMW["lr"], ADAMW["betas"], ADAMW["eps"], ADAMW["weight_decay"]
        verdicts = []
        for i, (q, p0) in enumerate(zip(self.params, before)):
            g = q.grad.double()
            m, v = (1 - b1) * g, (1 - b2) * g * g
            ref = p0 * (1 - lr * wd) - (lr / (1 - b1)) * m / (v.sqrt() / math.sqrt(1 - b2) + eps)
            verdicts.append(compare(q, ref, TOL_FP32, f"parameter tensor {i}"))
        return merge(verdicts)


# ---- gradnorm ----------------------------------------------------------------------------------------------
def adamw_grads(params: int, tensors: int) -> List[torch.Tensor]:
    """The adamw peer's gradients: param_set_sizes' tensors drawn in order from the gradient seed."""
    gg = _generator(ADAMW_SEEDS[1])
    return [torch.rand(n, generator=gg, device=DEVICE) * 2 - 1 for n in param_set_sizes(params, tensors)]


class GradNormCase(Case):
    """torch.nn.utils.clip_grad_norm_(max_norm=1.0) over the adamw peer's gradients, in place, one call per
    call as the stage's: no copy is restored between calls (the stage clips its gradients again each call),
    and every call does the same work, because clip_grad_norm_ multiplies by the clamped factor even when it
    is 1 (no branch, no sync). The timed region is the clip_grad_norm_ call (and the .item() of foreach_item)."""

    def __init__(self, bench: Bench, env: Env):
        p = bench.problem
        if p["dtype"] != "fp32":
            raise Unsupported("torch keeps the gradients in the parameters' dtype and returns a bf16 norm of bf16 "
                              "ones; the stage's bf16 rows take the norm in fp32")
        self.variant = bench.peer.variant
        self.params = []
        for g in adamw_grads(int(p["params"]), int(p["tensors"])):
            param = torch.nn.Parameter(torch.empty_like(g))   # its values are never read
            param.grad = g
            self.params.append(param)

    def call(self):
        norm = torch.nn.utils.clip_grad_norm_(self.params, CLIP_MAX_NORM, foreach=self.variant != "per_tensor")
        return norm.item() if self.variant == "foreach_item" else norm

    def check(self) -> Verdict:
        """The first call from the seeded gradients against the norm and the clip written out in fp64: the norm
        with fp32's tolerance, the gradients with fp32's, its absolute part relative to the largest clipped
        gradient (gradnorm::check_grads)."""
        before = [q.grad.detach().clone() for q in self.params]
        norm = self.call()
        norm = float(norm) if isinstance(norm, float) else norm.item()
        sum_sq = 0.0
        for g in before:
            sum_sq += float(g.double().square().sum())
        ref_norm = math.sqrt(sum_sq)
        coef = min(CLIP_MAX_NORM / (ref_norm + CLIP_NORM_EPS), 1.0)
        verdicts = [compare(torch.tensor([norm], dtype=torch.float64), torch.tensor([ref_norm], dtype=torch.float64),
                            TOL_FP32, "total norm")]
        scale = max(float(g.abs().max()) for g in before if g.numel()) * coef
        tol = Tolerance(TOL_FP32.atol * scale, TOL_FP32.rtol)
        worst = 0.0
        for i, (q, g) in enumerate(zip(self.params, before)):
            ref = g.double().mul_(coef)
            diff = q.grad.double().sub_(ref).abs_()
            if g.numel() and not bool((diff <= ref.abs_().mul_(tol.rtol).add_(tol.atol)).all()):
                verdicts.append(compare(q.grad, g.double() * coef, tol, f"grad of tensor {i}"))   # says where
            elif g.numel():
                worst = max(worst, float(diff.max()))
        verdicts.append(Verdict(True, worst))
        return merge(verdicts)


# ---- attention ---------------------------------------------------------------------------------------------
class AttentionCase(Case):
    def __init__(self, bench: Bench, env: Env):
        p = bench.problem
        self.variant = bench.peer.variant
        self.batch, self.heads, self.seq, self.dim = parse_shape(attention_shape(p))
        self.dtype_name = p["dtype"]
        scores = self.batch * self.heads * self.seq * self.seq * (2 if p["dtype"] == "bf16" else 4)
        if self.variant == "naive" and not on_gpu() and scores > NAIVE_CPU_SCORES_BYTES:
            raise Unsupported(f"the naive path's scores take {scores / 2**30:.3g} GiB (three such tensors at "
                              f"once); on the CPU it runs up to {NAIVE_CPU_SCORES_BYTES / 2**30:g} GiB")
        dtype = torch.bfloat16 if p["dtype"] == "bf16" else torch.float32
        self.causal = p["causal"] == "causal"
        shape = (self.batch, self.heads, self.seq, self.dim)
        self.q, self.k, self.v = (uniform(shape, s, dtype) for s in ATTENTION_SEEDS)
        self.scale = 1.0 / math.sqrt(self.dim)
        if self.variant == "naive":   # the causal mask built once at the sequence length (register_buffer)
            self.mask = torch.ones(self.seq, self.seq, dtype=torch.bool, device=DEVICE).triu_(1)
        if self.variant == "sdpa_flash":
            try:
                with self.scope():
                    self.call()
                synchronize()
            except RuntimeError as e:
                raise Unsupported(f"the FlashAttention backend refused it: {_first_line(e)}") from None

    def scope(self):
        if self.variant != "sdpa_flash":
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)

    def call(self):
        if self.variant == "naive":
            att = (self.q @ self.k.transpose(-2, -1)) * self.scale
            if self.causal:
                att = att.masked_fill(self.mask, float("-inf"))
            att = F.softmax(att, dim=-1)
            return att @ self.v
        return F.scaled_dot_product_attention(self.q, self.k, self.v, is_causal=self.causal)

    def check(self) -> Verdict:
        """48 query rows of every (batch, head) against softmax(q K^T / sqrt(D)) V in fp64."""
        out = self.call()
        rows = torch.linspace(0, self.seq - 1, min(ATTENTION_CHECKED_ROWS, self.seq), device=DEVICE)
        rows = rows.round().long().unique()
        q = self.q[:, :, rows, :].double()
        scores = (q @ self.k.double().transpose(-2, -1)) * self.scale
        if self.causal:
            later = torch.arange(self.seq, device=DEVICE)[None, :] > rows[:, None]
            scores = scores.masked_fill(later, float("-inf"))
        ref = torch.softmax(scores, dim=-1) @ self.v.double()
        return compare(out[:, :, rows, :], ref, TOL_ATTENTION[self.dtype_name], "output (checked rows)")


# ---- spmv --------------------------------------------------------------------------------------------------
def _device_laplacian(graph: str, n: int, alpha: float = LAPLACIAN_ALPHA) -> dict:
    """The stage's A = I + alpha L (laplacian_csr) as a torch CSR tensor, int32 indices where torch takes them."""
    row_ptr, col, val = laplacian_csr(graph, n, alpha)
    crow_t, col_t = torch.from_numpy(row_ptr).to(DEVICE), torch.from_numpy(col).to(DEVICE)
    val_t = torch.from_numpy(val).to(DEVICE)
    notes = []
    with warnings.catch_warnings():   # "sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        matrix = torch.sparse_csr_tensor(crow_t, col_t, val_t, size=(n, n))
    try:
        torch.mv(matrix, torch.ones(n, dtype=torch.float64, device=DEVICE))
        synchronize()
    except RuntimeError as e:
        matrix = torch.sparse_csr_tensor(crow_t.long(), col_t.long(), val_t, size=(n, n))
        notes.append(f"int64 indices (torch refused int32: {_first_line(e)}); the work model counts 4-byte ones")
    model = laplacian_nnz(graph, n)
    if val.size != model:
        notes.append(f"{val.size} stored nonzeros (cycles that share an edge store it once); the work model "
                     f"counts {model}, as the stage's does")
    rows = torch.repeat_interleave(torch.arange(n, device=DEVICE), crow_t.long().diff())
    return {"matrix": matrix, "rows": rows, "col": col_t.long(), "val": val_t, "note": "; ".join(notes)}


class SpmvCase(Case):
    def __init__(self, bench: Bench, env: Env):
        p = bench.problem
        self.n = int(p["rows"])
        self.rhs = int(p["rhs"]) if bench.peer.variant == "spmm_csr" else 0
        self.a = env.get(("laplacian", p["graph"], self.n), lambda: _device_laplacian(p["graph"], self.n))
        self.note = self.a["note"]
        self.x = uniform((self.n, self.rhs) if self.rhs else (self.n,), 31, torch.float64)   # x, or a row-major block

    def call(self):
        return torch.mm(self.a["matrix"], self.x) if self.rhs else torch.mv(self.a["matrix"], self.x)

    def check(self) -> Verdict:
        """Against a gather and scatter-add of the same nonzeros in fp64, relative to sum_j |a_ij x_j|."""
        y = self.call()
        columns = [0, self.rhs - 1] if self.rhs else [None]
        verdicts = []
        for c in columns:
            x = self.x if c is None else self.x[:, c]
            terms = self.a["val"] * x[self.a["col"]]
            ref = torch.zeros(self.n, dtype=torch.float64, device=DEVICE).index_add_(0, self.a["rows"], terms)
            scale = torch.zeros_like(ref).index_add_(0, self.a["rows"], terms.abs())
            got = y if c is None else y[:, c]
            verdicts.append(compare(got, ref, Tolerance(0.0, SPMV_FP64_RTOL), "y" if c is None else f"y[:, {c}]",
                                    scale=scale))
        return merge(verdicts)


# ---- cg --------------------------------------------------------------------------------------------------
class CgCase(Case):
    """CG on A = I + alpha L over the stage's window: one call solves b_1..b_16 in turn, the cache set back to
    b_0's solution first (warm and lazy starts), so every call does the same work (cg.h). fp64 throughout.

    host_checked*: the loop as PyTorch code writes it, `while rr.item() > limit`: one host read per iteration
    (and one of ||b||^2 per solve, the limit being a Python float). device_loop*: blocks of cg_check_every
    iterations queued without a read, a solve that converged inside a block kept where it was by
    torch.where(active, ..., 0), and one .item() of the flag per block; its ||b||^2 stays on the device."""

    def __init__(self, bench: Bench, env: Env):
        p = bench.problem
        variant = bench.peer.variant
        self.loop = variant.startswith("device_loop")
        self.start = "lazy" if variant.endswith("_lazy") else "warm" if variant.endswith("_warm") else "cold"
        self.n = int(p["rows"])
        alpha = float(p["alpha"])
        self.a = env.get(("laplacian", p["graph"], self.n, alpha), lambda: _device_laplacian(p["graph"], self.n, alpha))
        self.note = self.a["note"]
        self.rhs = env.get(("cg_rhs", self.n, p["drift"]), lambda: cg_rhs_sequence(self.n, float(p["drift"]))[0])
        self.b = torch.from_numpy(self.rhs).to(DEVICE, copy=True)   # what the solver reads; the check, self.rhs
        self.x = torch.zeros(self.n, dtype=torch.float64, device=DEVICE)
        self.r, self.p = torch.zeros_like(self.x), torch.zeros_like(self.x)
        self.rr = self.bb = None
        self.tally = {"solves": 0, "skips": 0, "iterations": 0, "matvecs": 0, "reads": 0}
        self.device_iterations = torch.zeros((), dtype=torch.int64, device=DEVICE)   # the device loop's count
        self.cache = None
        if self.start != "cold":   # the cache a window starts from: b_0 solved from zero
            self._start_cold(0)
            self._finish()
            self.cache = self.x.clone()
        self._reset_tally()

    def _reset_tally(self):
        self.tally = dict.fromkeys(self.tally, 0)
        self.device_iterations.zero_()

    def _read(self, t: torch.Tensor):
        self.tally["reads"] += 1
        return t.item()

    def _mv(self, v: torch.Tensor) -> torch.Tensor:
        self.tally["matvecs"] += 1
        return torch.mv(self.a["matrix"], v)

    def _start_cold(self, t: int) -> None:
        b = self.b[t]
        self.x.zero_()
        self.r.copy_(b)
        self.p.copy_(b)
        self.bb = b.dot(b)
        self.rr = self.bb.clone()

    def _start_warm(self, t: int) -> None:
        b = self.b[t]
        torch.sub(b, self._mv(self.x), out=self.r)
        self.p.copy_(self.r)
        self.rr, self.bb = self.r.dot(self.r), b.dot(b)

    def _step(self, t: int) -> bool:
        """Starts solve t and finishes it unless the gate skips it; True when skipped."""
        if self.start == "cold":
            self._start_cold(t)
        else:
            self._start_warm(t)
            if self.start == "lazy" and self._read(self.rr <= LAZY_CG_TOL ** 2 * self.bb):
                self.tally["solves"] += 1
                self.tally["skips"] += 1
                return True
        self._finish()
        return False

    def _iteration(self, limit) -> None:
        q = self._mv(self.p)
        step = self.rr / self.p.dot(q)
        if self.loop:   # a converged solve takes no step (its NaN-free branch is the zero)
            active = self.rr > limit
            step = torch.where(active, step, 0.0)
            self.device_iterations += active
        self.x.add_(self.p * step)
        self.r.sub_(q * step)
        rr = self.r.dot(self.r)
        beta = rr / self.rr
        if self.loop:
            beta = torch.where(active, beta, 0.0)
        self.rr = rr
        self.p.mul_(beta).add_(self.r)

    def _finish(self) -> None:
        self.tally["solves"] += 1
        if self.loop:
            limit = CG_TOL ** 2 * self.bb
            for _ in range(0, CG_MAX_ITERATIONS + 1, CG_CHECK_EVERY):
                for _ in range(CG_CHECK_EVERY):
                    self._iteration(limit)
                if not self._read(self.rr > limit):
                    return
            raise RuntimeError("CG did not converge within the iteration limit")
        limit = CG_TOL ** 2 * self._read(self.bb)
        for _ in range(CG_MAX_ITERATIONS + 1):
            if self._read(self.rr) <= limit:
                return
            self._iteration(limit)
            self.tally["iterations"] += 1
        raise RuntimeError("CG did not converge within the iteration limit")

    def call(self):
        if self.cache is not None:
            self.x.copy_(self.cache)
        for t in range(1, CG_WINDOW + 1):
            self._step(t)

    def check(self) -> Verdict:
        """One window replayed solve by solve: each solution's true relative residual ||b - A x|| / ||b||,
        from a gather and scatter-add of the matrix's nonzeros, below the gate's tolerance for a skipped solve
        and the solver's for a solved one (cg::check_solve); only the lazy start may skip."""
        if self.cache is not None:
            self.x.copy_(self.cache)
        self._reset_tally()
        worst = 0.0
        for t in range(1, CG_WINDOW + 1):
            skipped = self._step(t)
            if skipped and self.start != "lazy":
                return Verdict(False, worst, f"step {t} was skipped by a solver without the gate")
            b = torch.from_numpy(self.rhs[t]).to(DEVICE)
            terms = self.a["val"] * self.x[self.a["col"]]
            ax = torch.zeros_like(b).index_add_(0, self.a["rows"], terms)
            residual = float((b - ax).norm() / b.norm())
            limit = (LAZY_CG_TOL if skipped else CG_TOL) + CG_RESIDUAL_ATOL
            worst = max(worst, residual if math.isfinite(residual) else math.inf)
            if not residual <= limit:
                return Verdict(False, worst, f"step {t} ({'skipped by the gate' if skipped else 'solved'}): true "
                                             f"relative residual {residual:.3g} above {limit:.3g}")
        if self.loop:
            self.tally["iterations"] = int(self.device_iterations.item())
        self.checked = dict(self.tally)
        return Verdict(True, worst)

    def counters(self, median_ns: float) -> Dict[str, float]:
        """What the checked window did (every call repeats it): skips, iterations, matvecs and host reads per
        solve."""
        t = getattr(self, "checked", None)
        if not t or not t["solves"]:
            return {}
        solves = float(t["solves"])
        return {"skip_rate": t["skips"] / solves, "iterations_per_solve": t["iterations"] / solves,
                "matvecs_per_solve": t["matvecs"] / solves, "reads_per_solve": t["reads"] / solves}


# ---- hostsync ----------------------------------------------------------------------------------------------
class HostsyncCase(Case):
    """`steps` steps of a training loop per call, each a copy of the step's predictions (the forward's
    stand-in: the stage regenerates them in a kernel), the loss and two metrics as torch ops, and their
    accumulation into fp64 running sums on the device; the variants differ only in how the host reads. The
    predictions of steps 0..steps-1 are precomputed (the stage's prediction(step, i)); every call runs those
    steps, while the running sums go on growing across calls as the stage's do."""

    def __init__(self, bench: Bench, env: Env):
        p = bench.problem
        self.variant = bench.peer.variant
        self.steps, self.elements = int(p["steps"]), int(p["elements"])
        self.predictions = torch.from_numpy(hostsync_predictions(self.steps, self.elements)).to(DEVICE)
        self.targets = torch.from_numpy(uniform_array(32, self.elements)).to(DEVICE)   # hostsync::seed_target
        self.prediction = torch.empty(self.elements, dtype=torch.float32, device=DEVICE)
        self.sums = torch.zeros(3, dtype=torch.float64, device=DEVICE)
        self.host = [0.0, 0.0, 0.0]          # what the host has read: the loss summed, or the last running sums
        self.steps_run = 0
        if self.variant == "async_pinned":
            if not on_gpu():
                raise Unsupported("async_pinned copies into pinned memory behind CUDA events: a GPU pattern")
            self.slots = torch.empty(HOSTSYNC_ASYNC_SLOTS, dtype=torch.float32, pin_memory=True)
            self.events = [torch.cuda.Event() for _ in range(HOSTSYNC_ASYNC_SLOTS)]
            self.ring: List[int] = []          # slots in flight, oldest first
            self.pushed = 0                     # slots are claimed in turn: the ring is first in, first out
            self.stalls = 0

    def _step(self, s: int) -> torch.Tensor:
        pred = self.prediction
        pred.copy_(self.predictions[s])                                 # forward
        error = pred - self.targets
        metrics = torch.stack([(error * error).mean(), error.abs().mean(), (pred * pred).mean()])   # loss
        self.sums += metrics                                            # total_loss += loss.detach()
        return metrics

    def _harvest(self, wait_for_oldest: bool) -> None:
        while self.ring and (wait_for_oldest or self.events[self.ring[0]].query()):
            slot = self.ring.pop(0)
            if wait_for_oldest:
                self.events[slot].synchronize()
                self.stalls += 1
                wait_for_oldest = False
            self.host[0] += float(self.slots[slot])

    def call(self):
        for s in range(self.steps):
            metrics = self._step(s)
            if self.variant == "item_every_step":
                self.host[0] += metrics[0].item()
            elif self.variant == "async_pinned":
                self._harvest(False)
                if len(self.ring) == HOSTSYNC_ASYNC_SLOTS:
                    self._harvest(True)
                slot = self.pushed % HOSTSYNC_ASYNC_SLOTS
                self.pushed += 1
                self.slots[slot].copy_(metrics[0], non_blocking=True)
                self.events[slot].record()
                self.ring.append(slot)
        self.steps_run += self.steps
        if self.variant == "sync_every_n":
            self.host[0] = self.sums[0].item()
        elif self.variant == "metrics_separate":
            self.host = [self.sums[m].item() for m in range(3)]
        elif self.variant == "metrics_batched":
            self.host = self.sums.tolist()

    def check(self) -> Verdict:
        """The first call's N steps: the device's running sums, and what the host read of them (the loss
        summed step by step, or the last read of the sums), against hostsync::metric_sums in fp64 within fp32's
        tolerance (hostsync::check_sums)."""
        self.call()
        if self.variant == "async_pinned":
            torch.cuda.synchronize()
            self._harvest(False)
            self.stalls = self.steps_run = 0   # the counters describe the timed calls
        want = hostsync_metric_sums(self.steps, self.elements)
        names = ("loss", "mean |error|", "mean prediction^2")
        verdicts = [compare(self.sums, torch.tensor(want, dtype=torch.float64), TOL_FP32,
                            f"device running sums after {self.steps} steps")]
        read = {"no_reads": 0, "metrics_separate": 3, "metrics_batched": 3}.get(self.variant, 1)
        if read:
            verdicts.append(compare(torch.tensor(self.host[:read], dtype=torch.float64),
                                    torch.tensor(want[:read], dtype=torch.float64), TOL_FP32,
                                    "what the host read (" + ", ".join(names[:read]) + ")"))
        return merge(verdicts)

    def counters(self, median_ns: float) -> Dict[str, float]:
        out = {"us_per_step": median_ns / 1e3 / self.steps}
        if self.variant == "async_pinned" and self.steps_run:
            out["stalls_per_step"] = self.stalls / self.steps_run
        return out


# ---- launch -------------------------------------------------------------------------------------------------
class LaunchCase(Case):
    """The stage's window of steps x kernels_per_step small kernels, each one in-place lerp_ over
    `elements` floats: eager, or captured once in a CUDA graph and replayed."""

    def __init__(self, bench: Bench, env: Env):
        p = bench.problem
        self.window = launch_window(int(p["steps"]), int(p["kernels_per_step"]), LAUNCH_STATE_BUFFERS)
        self.initial = uniform((LAUNCH_STATE_BUFFERS, int(p["elements"])), 41)   # launch::seed_state
        self.state = self.initial.clone()
        self.buffers = [self.state[b] for b in range(LAUNCH_STATE_BUFFERS)]
        self.graph = None
        if bench.peer.variant == "graph":
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):   # warm-up on a side stream before capturing, as the docs ask
                for _ in range(3):
                    self._eager()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self._eager()

    def _eager(self):
        for dst, src, weight in self.window:
            self.buffers[dst].lerp_(self.buffers[src], weight)

    def call(self):
        if self.graph is not None:
            self.graph.replay()
        else:
            self._eager()

    def check(self) -> Verdict:
        """One window from the initial state against the same lerps in fp64. Each is a convex combination of
        values in [-1, 1] (which it keeps there), rounded three times (difference, product, sum): at most
        2^-22 more error per kernel, so a window is within kernels x 2^-22 (1.8e-4 for 768)."""
        self.state.copy_(self.initial)
        self.call()
        ref = self.initial.cpu().double().numpy()
        for dst, src, weight in self.window:
            ref[dst] = (1.0 - weight) * ref[dst] + weight * ref[src]
        return compare(self.state, torch.from_numpy(ref), Tolerance(len(self.window) * 2.0 ** -22, 0.0), "state")

    def counters(self, median_ns: float) -> Dict[str, float]:
        return {"us_per_kernel": median_ns / 1e3 / len(self.window)}


# ---- alloc ---------------------------------------------------------------------------------------------------
class AllocCase(Case):
    """A step's activations: `buffers` buffers of `buffer_bytes`, a fill of three probe words in each, one
    stack of all probes and their sum into a checksum; allocated per step with torch.empty (the caching
    allocator), the same with torch.cuda.empty_cache() after the step, or allocated once (reuse)."""

    def __init__(self, bench: Bench, env: Env):
        p = bench.problem
        self.variant = bench.peer.variant
        self.count = int(p["buffers"])
        self.words = int(p["buffer_bytes"]) // 4
        if self.words < 3:
            raise Unsupported("a buffer needs three 4-byte probe words")
        self.stride = (self.words - 1) // 2   # probes at the first, the middle and the last (or last but one) word
        self.probes = torch.empty((self.count, 3), dtype=torch.int32, device=DEVICE)
        self.checksum = torch.zeros((), dtype=torch.int64, device=DEVICE)
        self.step = 0
        self.kept = [self._buffer() for _ in range(self.count)] if self.variant == "reuse" else None

    def _buffer(self) -> torch.Tensor:
        return torch.empty(self.words, dtype=torch.int32, device=DEVICE)

    def call(self):
        self._step(self.kept if self.kept is not None else [self._buffer() for _ in range(self.count)])
        if self.variant == "empty_cache":   # the step's buffers died with _step: their blocks go back
            torch.cuda.empty_cache()

    def _step(self, buffers: List[torch.Tensor]) -> None:
        views = [b.as_strided((3,), (self.stride,)) for b in buffers]
        for b, view in enumerate(views):
            view.fill_(alloc_probe_value(self.step, b))
        torch.stack(views, out=self.probes)
        self.checksum += self.probes.sum()
        self.step += 1

    def check(self) -> Verdict:
        for _ in range(ALLOC_CHECK_STEPS):
            self.call()
        want = sum(3 * alloc_probe_value(s, b) for s in range(ALLOC_CHECK_STEPS) for b in range(self.count))
        got = int(self.checksum.item())
        if got != want:
            return Verdict(False, float(abs(got - want)), f"checksum after {ALLOC_CHECK_STEPS} steps is {got}, "
                                                         f"expected {want}: a probe word was lost or overwritten")
        return Verdict(True, 0.0)


# ---- collate ---------------------------------------------------------------------------------------------------
_TORCH_DTYPES = {"float32": torch.float32, "int64": torch.int64}


def _dataset(problem: Dict[str, str], env: Env) -> List[torch.Tensor]:
    """The dataset in pageable host memory, one tensor per field as a loaded dataset dict holds them. Its
    values are random, not the stage's generator's: a copy does not depend on them."""
    samples = int(problem["samples"])
    out = []
    for name, n, dtype in collate_fields(problem):
        def build(name=name, n=n, dtype=dtype):
            g = torch.Generator().manual_seed(COLLATE_SEEDS[name])
            if dtype == "int64":
                return torch.randint(0, COLLATE_VOCAB, (samples, n), generator=g, dtype=torch.int64)
            return torch.rand((samples, n), generator=g, dtype=torch.float32) * 2 - 1
        out.append(env.get(("field", name, samples, n), build))
    return out


class CollateCase(Case):
    """A batch from a host dataset to the device, the epoch's shuffled order (the stage's permutation), one
    batch per call cycling through the epoch."""

    def __init__(self, bench: Bench, env: Env):
        p = bench.problem
        self.variant = bench.peer.variant
        self.batch = int(p["batch"])
        samples = int(p["samples"])
        if samples < self.batch:
            raise Unsupported(f"{samples} samples hold no batch of {self.batch}")
        self.fields = collate_fields(p)
        self.data = _dataset(p, env)
        self.order = env.get(("order", samples, p["order"]), lambda: epoch_order(samples, p["order"] == "shuffled"))
        self.order_t = torch.tensor(self.order, dtype=torch.int64)
        self.batches = samples // self.batch
        self.k = 0
        self.calls = 0
        self.out: List[torch.Tensor] = []
        if self.variant == "pinned":   # two pinned batches and two device batches, field by field in each
            nbytes = sum(self.batch * n * (4 if d == "float32" else 8) for _, n, d in self.fields)
            self.host = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
            self.device = [torch.empty(nbytes, dtype=torch.uint8, device=DEVICE) for _ in range(2)]
            self.host_views = [self._views(s) for s in self.host]
            self.device_views = [self._views(s) for s in self.device]
            self.copied = [torch.cuda.Event(), torch.cuda.Event()]

    def _views(self, slab: torch.Tensor) -> List[torch.Tensor]:
        views, at = [], 0
        for _, n, dtype in self.fields:
            size = self.batch * n * (4 if dtype == "float32" else 8)
            views.append(slab[at:at + size].view(_TORCH_DTYPES[dtype]).view(self.batch, n))
            at += size
        return views

    def call(self):
        k = self.k
        self.k = (k + 1) % self.batches
        if self.variant == "pinned":
            slot = self.calls % 2
            self.calls += 1
            self.copied[slot].synchronize()   # this slot's previous copy has left its pinned batch
            idx = self.order_t[k * self.batch:(k + 1) * self.batch]
            for field, view in zip(self.data, self.host_views[slot]):
                torch.index_select(field, 0, idx, out=view)
            self.device[slot].copy_(self.host[slot], non_blocking=True)
            self.copied[slot].record()
            self.out = self.device_views[slot]
            return
        if self.variant == "index_select":
            if not self.out:
                self.out = [torch.empty((self.batch, n), dtype=_TORCH_DTYPES[d]) for _, n, d in self.fields]
            idx = self.order_t[k * self.batch:(k + 1) * self.batch]
            for field, out in zip(self.data, self.out):
                torch.index_select(field, 0, idx, out=out)
            return
        idx = self.order[k * self.batch:(k + 1) * self.batch]
        samples = [tuple(field[i].clone() for field in self.data) for i in idx]       # __getitem__
        stacked = [torch.stack([s[f] for s in samples]) for f in range(len(self.data))]   # default_collate
        if self.variant == "pin_memory":
            self.out = [t.pin_memory().to(DEVICE, non_blocking=True) for t in stacked]
        else:
            self.out = [t.to(DEVICE) for t in stacked]

    def check(self) -> Verdict:
        """The epoch's first batch, byte for byte, against numpy's fancy indexing of the host dataset."""
        self.k = 0
        self.call()
        idx = np.asarray(self.order[:self.batch], dtype=np.int64)
        for (name, _, _), field, got in zip(self.fields, self.data, self.out):
            want = torch.from_numpy(field.numpy()[idx]).to(DEVICE)
            if not torch.equal(got, want):
                bad = (got != want).reshape(-1)
                i = int(bad.nonzero()[0, 0])
                return Verdict(False, float(bad.sum()), f"{name}: {int(bad.sum())} elements differ, the first at "
                                                        f"sample {i // got.shape[1]} element {i % got.shape[1]}")
        return Verdict(True, 0.0)


CASES = {"adamw": AdamWCase, "gradnorm": GradNormCase, "attention": AttentionCase, "spmv": SpmvCase, "cg": CgCase,
         "hostsync": HostsyncCase, "launch": LaunchCase,
         "alloc": AllocCase, "collate": CollateCase}


# ---- timing -----------------------------------------------------------------------------------------------
def _time_calls(case: Case, n: int) -> float:
    """ns per call of n back-to-back calls, between two CUDA events on the current stream (on the CPU,
    the steady clock around them)."""
    if not on_gpu():
        begin = time.perf_counter_ns()
        for _ in range(n):
            case.call()
        return (time.perf_counter_ns() - begin) / n
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        case.call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e6 / n


@functools.lru_cache(maxsize=None)
def _gpu_clock_reasons() -> Optional[Callable[[], Optional[int]]]:
    """A reader of the current GPU's NVML clock event reasons (None when a read fails), where pynvml is
    installed; None without it (it is optional: the GPU rows then go unwatched). NVML stays initialised
    for the run."""
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(_device_uuid(torch.cuda.current_device()))
        current = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    except Exception:   # noqa: BLE001 - NVML is optional
        return None

    def read() -> Optional[int]:
        try:
            return int(current(handle))
        except Exception:   # noqa: BLE001 - an unanswered read is an unknown share
            return None
    return read


def _watch() -> Optional[Watch]:
    """On the CPU, other processes' share of the CPUs; on a GPU, its throttle reasons where NVML answers."""
    if not on_gpu():
        return Watch(read_cpu_ticks, others_share, DISTURBED_SHARE)
    reasons = _gpu_clock_reasons()
    return Watch(reasons, throttled_share, THROTTLED_SHARE) if reasons else None


def measure(case: Case, repetitions: int, min_sample_s: float) -> Tuple[List[float], int, Watched]:
    """Warm-up, then `repetitions` samples of `batch` calls each, a sample lasting at least min_sample_s,
    watched for other load (take_watched: disturbed samples are taken again)."""
    with case.scope():
        for _ in range(WARMUP_CALLS):
            case.call()
        per_call = max(_time_calls(case, 1), 1.0)
        per_call = max(_time_calls(case, min(max(math.ceil(WARMUP_S * 1e9 / per_call), 1), MAX_BATCH)), 1.0)
        batch = min(max(math.ceil(min_sample_s * 1e9 / per_call), 1), MAX_BATCH)
        samples, watched = take_watched(lambda: _time_calls(case, batch), repetitions, _watch())
        return samples, batch, watched


_ENV = Env()


def run_bench(bench: Bench, repetitions: int, min_sample_s: float) -> Outcome:
    """Set up, check, then time one row; whatever a peer throws makes its row failed, never ends the run."""
    _ENV.enter(bench.peer.stage)
    case = None
    try:
        try:
            case = CASES[bench.peer.stage](bench, _ENV)
            with case.scope():
                verdict = case.check()
        except Unsupported as e:
            return Outcome("unsupported", str(e))
        if not verdict.ok:
            return Outcome("incorrect", verdict.detail, verdict.max_error, note=case.note)
        samples, batch, watched = measure(case, repetitions, min_sample_s)
        return Outcome("passed", "", verdict.max_error, samples, batch, case.counters(_median(samples)), case.note,
                       disturbed=watched.disturbed, retaken=watched.retaken,
                       others_share=-1.0 if on_gpu() else watched.share,
                       throttled_share=watched.share if on_gpu() else -1.0)
    except torch.cuda.OutOfMemoryError as e:
        return Outcome("failed", f"out of memory: {_first_line(e)}")
    except Exception as e:   # noqa: BLE001 - the row says what it was
        return Outcome("failed", f"{type(e).__name__}: {_first_line(e)}")
    finally:
        del case
        gc.collect()
        release_cached_memory()


# ---- context -----------------------------------------------------------------------------------------------
def _driver_version() -> int:
    """cuDriverGetVersion (13000 for CUDA 13.0), what benchsuite records as driver_version; 0 if unknown."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        return v.value if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 else 0
    except (OSError, AttributeError):
        return 0


def _runtime_version() -> int:
    """torch's CUDA runtime as cudaRuntimeGetVersion has it: "13.0" -> 13000."""
    parts = (torch.version.cuda or "0.0").split(".")
    try:
        return int(parts[0]) * 1000 + int(parts[1]) * 10
    except (IndexError, ValueError):
        return 0


def _nvml_clocks(uuid: str) -> Dict[str, int]:
    """The SM and memory clocks' maxima from NVML (nvidia-ml-py), where it answers."""
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            return {"sm_clock_mhz": int(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)),
                    "memory_clock_mhz": int(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM))}
        finally:
            pynvml.nvmlShutdown()
    except Exception:   # noqa: BLE001 - NVML is optional
        return {}


def _device_uuid(index: int) -> str:
    """The GPU's UUID as NVML names it ("GPU-..."); "" when torch does not say."""
    uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
    if re.fullmatch(r"[0-9a-fA-F-]{32,36}", uuid):   # torch prints it without NVML's "GPU-"
        return "GPU-" + uuid
    return uuid if re.fullmatch(r"GPU-[0-9a-fA-F-]{32,36}", uuid) else ""


def device_context() -> Tuple[List[dict], dict]:
    """context.devices (the GPU the peers ran on, as benchsuite describes one; none on the CPU) and
    context.torch."""
    if not on_gpu():
        return [], {"version": torch.__version__, "cuda": torch.version.cuda or "", "numpy": np.__version__,
                    "git_version": getattr(torch.version, "git_version", ""), "threads": torch.get_num_threads(),
                    "float32_matmul_precision": torch.get_float32_matmul_precision()}
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    uuid = _device_uuid(index)
    device = {"index": index, "name": props.name, "uuid": uuid, "compute_capability": f"{props.major}.{props.minor}",
              "sms": props.multi_processor_count, "memory_bytes": props.total_memory,
              "l2_bytes": int(getattr(props, "L2_cache_size", 0) or 0),
              "driver_version": _driver_version(), "runtime_version": _runtime_version()}
    if getattr(props, "clock_rate", 0):
        device["sm_clock_mhz"] = int(props.clock_rate) // 1000
    if getattr(props, "memory_clock_rate", 0):
        device["memory_clock_mhz"] = int(props.memory_clock_rate) // 1000
    if getattr(props, "memory_bus_width", 0):
        device["memory_bus_bits"] = int(props.memory_bus_width)
    for key, value in _nvml_clocks(uuid).items():
        device.setdefault(key, value)
    info = {"version": torch.__version__, "cuda": torch.version.cuda or "", "cudnn": torch.backends.cudnn.version(),
            "git_version": getattr(torch.version, "git_version", ""), "gpu_name": props.name,
            "numpy": np.__version__, "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
            "float32_matmul_precision": torch.get_float32_matmul_precision()}
    return [device], info

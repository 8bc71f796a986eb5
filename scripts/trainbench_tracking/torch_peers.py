"""scripts/torch-peers: the PyTorch way of doing trainbench's stages, timed on the problems benchsuite uses.

Each peer mirrors one CUDA variant of a stage: `adamw/torch_cuda/fused/<label>` is timed on the problem of
`adamw/cuda/fused/<label>`, with benchsuite's own label, so the two rows line up. The problems come from
benchsuite's list (`--benchsuite PATH` runs `PATH --list --format json --backend cuda`) or, by default, from
AXES below: a copy of the stages' axes (kernels/<stage>/<stage>_registry.cpp, sizes from
kernels/runtime/defaults.h) that tests/scripts/test_torch_peers.py holds equal to benchsuite's list. The
bytes and FLOPs per call are the stages' own work models, ported, so GB/s and TFLOP/s compare.

On the CPU with a benchsuite (`--device cpu --benchsuite PATH`, what `benchsuite --backend cpu,torch` runs)
the peers that are no GPU pattern mirror the CPU variants instead (Peer.mirrors_cpu): the problems and
labels of `PATH --list --format json --backend cpu`, so `adamw/torch/fused/<label>` lines up with
`adamw/cpu/fused/<label>`. Without --benchsuite, `--device cpu` runs them on the CUDA variants' problems.
Every row says which benchsuite row it stands beside: `"mirrors": "cpu/fused"` (or "cuda/fused").

The rows are `trainbench-results/1` (results/README.md) with backend "torch_cuda" (GPU) or "torch" (CPU).
This module needs neither torch nor numpy to list, name, summarise and write rows; the torch code is in
torch_peer_cases.py, imported when something is measured (numpy only where a matrix or a reference is built).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from statistics import NormalDist
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .argtypes import positive_int
from .errors import UsageError
from .resultfile import SCHEMA

# The rows' backend: PyTorch on the GPU (`--device cuda`, the default) or on the CPU (`--device cpu`),
# named as `stage/torch_cuda/...` and `stage/torch/...`. main() sets it before any row is made.
BACKENDS = {"cuda": "torch_cuda", "cpu": "torch"}
BACKEND = BACKENDS["cuda"]


def use_device(device: str) -> None:
    global BACKEND
    BACKEND = BACKENDS[device]
PROG = "torch-peers"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))

# ---- measuring (kernels/runtime/defaults.h, except where said) ---------------------------------------
REPETITIONS = 10               # samples per row (one per repetition)
NOISE_TARGET = 0.05            # CI half-width / median above this: "noisy"
WARMUP_S = 0.02                # warm-up before the first sample
WARMUP_CALLS = 2
CUDA_MIN_SAMPLE_S = 100e-6     # a sample is never shorter (CUDA events resolve ~0.5 us)
MAX_BATCH = 1 << 16
# Calls are batched so that one sample lasts at least this long. benchsuite's samples last 0.2 s each
# (Google Benchmark's min_time); 0.05 s, its --quick figure, keeps the whole run near a minute and a half
# on an H100. --min-time sets it.
MIN_SAMPLE_S = 0.05
QUICK_MIN_SAMPLE_S = 0.01


@dataclass(frozen=True)
class Tolerance:
    """|got - ref| <= atol + rtol * |ref| (kernels/runtime/tolerance.h)."""

    atol: float
    rtol: float


TOL_FP32 = Tolerance(1e-6, 1e-5)
TOL_ATTENTION = {"fp32": Tolerance(2e-5, 2e-4), "bf16": Tolerance(2e-2, 2e-2)}
SPMV_FP64_RTOL = 1e-13         # relative to sum_j |a_ij x_j|, the rounding scale of a row


# ---- problems -------------------------------------------------------------------------------------------
# Each stage's axes as benchsuite lists them: (values, quick values). From the registries, with the
# constants of kernels/runtime/defaults.h they use.
AXES: Dict[str, Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...]]]] = {
    "adamw": {   # adamw_registry.cpp: adamw_params 29.9M (quick 10M), adamw_tensors 200
        "params": (("29900000",), ("10000000",)),
        "tensors": (("200",), ("200",)),
        "dtype": (("fp32", "bf16"), ("fp32", "bf16")),
    },
    "gradnorm": {   # gradnorm_registry.cpp: adamw_params 29.9M (quick: quick_gradnorm_params, also 29.9M), 200 tensors
        "params": (("29900000",), ("29900000",)),
        "tensors": (("200",), ("200",)),
        "dtype": (("fp32", "bf16"), ("fp32", "bf16")),
    },
    "attention": {   # attention_registry.cpp: attention_small_gpt, attention_t4, attention_llm (CUDA shapes)
        "shape": (("4x6x256x64", "32x8x128x64", "4x16x4096x128"), ("4x6x256x64", "4x16x4096x128")),
        "causal": (("causal", "full"), ("causal",)),
        "dtype": (("fp32", "bf16"), ("fp32", "bf16")),
    },
    "spmv": {   # spmv_registry.cpp: laplacian_sparsity 8, spmv_rows 2^20 and 2^22 (quick 2^20), spmm_rhs 32 (8)
        "graph": (("ring8", "random8", "grid3d"), ("ring8",)),
        "rows": (("1048576", "4194304"), ("1048576",)),
        "rhs": (("32",), ("8",)),
    },
    "cg": {   # cg_registry.cpp: cg_rows 2^16 and cg_rows_large 2^18 (quick 2^16), laplacian_alpha 0.5, cg_drifts
        "graph": (("ring8",), ("ring8",)),
        "rows": (("65536", "262144"), ("65536",)),
        "alpha": (("0.5",), ("0.5",)),
        "drift": (("2e-6", "1e-6", "5e-7"), ("2e-6", "1e-6", "5e-7")),
    },
    "hostsync": {   # hostsync_registry.cpp: hostsync_intervals 1, 5, 50, 500, hostsync_elements 4096
        "steps": (("1", "5", "50", "500"), ("1", "5", "50", "500")),
        "elements": (("4096",), ("4096",)),
    },
    "launch": {   # launch_registry.cpp: launch_window_steps 64, launch_kernels_per_step 12, launch_elements 4096
        "steps": (("64",), ("64",)),
        "kernels_per_step": (("12",), ("12",)),
        "elements": (("4096",), ("4096",)),
    },
    "alloc": {   # alloc_registry.cpp: alloc_buffers 12, 128 x 768 x 4 B and 4096 x 768 x 4 B buffers
        "buffers": (("12",), ("12",)),
        "buffer_bytes": (("393216", "12582912"), ("393216", "12582912")),
    },
    "collate": {   # collate_registry.cpp: collate_samples 32768 (quick 8192), batches 16, 64, 4096 (quick 64, 4096)
        "layout": (("text_pair", "tokens"), ("text_pair",)),
        "order": (("shuffled",), ("shuffled",)),
        "samples": (("32768",), ("8192",)),
        "batch": (("16", "64", "4096"), ("64", "4096")),
        "embed_dim": (("768",), ("768",)),
        "seq_len": (("128",), ("128",)),
        "compute_us": (("0", "1000"), ("0", "1000")),
    },
}

# The axes of the CUDA variants the peers mirror, in the order of benchsuite's labels.
VARIANT_AXES: Dict[Tuple[str, str], Tuple[str, ...]] = {
    ("adamw", "per_tensor"): ("params", "tensors", "dtype"),
    ("adamw", "foreach"): ("params", "tensors", "dtype"),
    ("adamw", "fused"): ("params", "tensors", "dtype"),
    ("gradnorm", "per_tensor"): ("params", "tensors", "dtype"),
    ("gradnorm", "multi_tensor"): ("params", "tensors", "dtype"),
    ("attention", "naive"): ("shape", "causal", "dtype"),
    ("attention", "fused"): ("shape", "causal", "dtype"),
    ("spmv", "cusparse_csr"): ("graph", "rows"),
    ("spmv", "cusparse_spmm"): ("graph", "rows", "rhs"),
    ("cg", "host_checked"): ("graph", "rows", "alpha", "drift"),
    ("cg", "host_checked_warm"): ("graph", "rows", "alpha", "drift"),
    ("cg", "host_checked_lazy"): ("graph", "rows", "alpha", "drift"),
    ("cg", "graph"): ("graph", "rows", "alpha", "drift"),
    ("cg", "graph_warm"): ("graph", "rows", "alpha", "drift"),
    ("cg", "graph_lazy"): ("graph", "rows", "alpha", "drift"),
    ("hostsync", "no_reads"): ("steps", "elements"),
    ("hostsync", "item_every_step"): ("steps", "elements"),
    ("hostsync", "sync_every_n"): ("steps", "elements"),
    ("hostsync", "metrics_separate"): ("steps", "elements"),
    ("hostsync", "metrics_batched"): ("steps", "elements"),
    ("hostsync", "async_pinned"): ("steps", "elements"),
    ("launch", "eager"): ("steps", "kernels_per_step", "elements"),
    ("launch", "graph"): ("steps", "kernels_per_step", "elements"),
    ("alloc", "pool"): ("buffers", "buffer_bytes"),
    ("alloc", "reuse"): ("buffers", "buffer_bytes"),
    ("alloc", "empty_cache"): ("buffers", "buffer_bytes"),
    ("collate", "per_sample"): ("layout", "order", "samples", "batch", "embed_dim", "seq_len", "compute_us"),
    ("collate", "pinned"): ("layout", "order", "samples", "batch", "embed_dim", "seq_len", "compute_us"),
}


@dataclass(frozen=True)
class Peer:
    stage: str
    variant: str          # the torch row's variant
    mirrors: str          # the CUDA variant whose problems it takes ("": a CPU pattern only)
    rationale: str
    only: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()   # axis values it runs (others are left out); an axis
    #                                                      the problem does not have restricts nothing
    needs_cuda: bool = False   # a GPU pattern (graphs, the caching allocator, pinned copies): no CPU row
    mirrors_cpu: str = ""      # the CPU variant it mirrors with --device cpu --benchsuite ("": none)
    cpu_implied: Tuple[Tuple[str, str], ...] = ()   # what that CPU variant runs without an axis for it
    #                                                 (attention's CPU variants: fp32; naive_mask_*: causal)

    def accepts(self, problem: Dict[str, str]) -> bool:
        return all(problem[axis] in values for axis, values in self.only if axis in problem)

    def mirrored(self, backend: str) -> str:
        """The variant of benchsuite's `backend` (cuda | cpu) whose problems it takes; "" for none."""
        return self.mirrors if backend == "cuda" else self.mirrors_cpu


FP32 = (("dtype", ("fp32",)),)
NO_COMPUTE = (("compute_us", ("0",)),)   # the data path alone: no stand-in compute kernel to overlap
# The field-major layouts only: layout=token_rows (the training step's rows, --axis collate.layout=token_rows)
# has no PyTorch peer here, and a peer must not time another layout under its label.
FIELD_LAYOUTS = (("layout", ("text_pair", "tokens")),)

CPU_FP32 = (("dtype", "fp32"),)   # attention's CPU variants have no dtype axis: fp32

PEERS: Tuple[Peer, ...] = (
    # AdamW: torch keeps the moments in the parameters' dtype, the stage in fp32: fp32 problems only.
    Peer("adamw", "fused", "fused", "torch.optim.AdamW(fused=True): one fused multi-tensor kernel per step", FP32,
         mirrors_cpu="fused"),
    Peer("adamw", "foreach", "foreach", "torch.optim.AdamW(foreach=True): _foreach_ ops over the tensor lists", FP32,
         mirrors_cpu="foreach"),
    Peer("adamw", "per_tensor", "per_tensor",
         "torch.optim.AdamW(foreach=False): the for-loop path, several kernels per tensor", FP32,
         mirrors_cpu="per_tensor"),
    # Gradient clipping over adamw's parameter set, in place as the stage's calls are (every call scales: torch
    # multiplies by the clamped factor even where it is 1). fp32 only: torch keeps the gradients in the
    # parameters' dtype and returns the norm of bf16 gradients as bf16; the stage's bf16 rows take an fp32 norm.
    Peer("gradnorm", "per_tensor", "per_tensor",
         "clip_grad_norm_(max_norm=1.0, foreach=False): a vector_norm per tensor, stack, norm, then mul_ per "
         "tensor; no host read (the stage's CUDA per_tensor reads each norm with .item())", FP32,
         mirrors_cpu="per_tensor"),
    Peer("gradnorm", "foreach", "multi_tensor",
         "clip_grad_norm_(max_norm=1.0, foreach=True): _foreach_norm, stack, norm, _foreach_mul_; no host read",
         FP32, mirrors_cpu="multi_tensor"),
    Peer("gradnorm", "foreach_item", "multi_tensor",
         "the same + .item() of the returned total norm (the logging pattern): one multi-tensor norm, one host "
         "read, one multi-tensor scale, as the stage's multi_tensor (whose read comes before the scale)", FP32,
         mirrors_cpu="multi_tensor"),
    # FlashAttention takes fp16 and bf16 only.
    Peer("attention", "sdpa_flash", "fused",
         "F.scaled_dot_product_attention under sdpa_kernel(SDPBackend.FLASH_ATTENTION)", (("dtype", ("bf16",)),),
         needs_cuda=True),
    Peer("attention", "sdpa", "fused", "F.scaled_dot_product_attention, the backend PyTorch picks",
         mirrors_cpu="fused", cpu_implied=CPU_FP32),
    # The CPU stage's `naive` applies causality inside its softmax; its cached-mask variant is nanoGPT's path
    # (always causal: it has no causal axis).
    Peer("attention", "naive", "naive",
         "nanoGPT's slow path: q @ k^T * scale, masked_fill with a cached causal mask, softmax, @ v",
         mirrors_cpu="naive_mask_cached", cpu_implied=CPU_FP32 + (("causal", "causal"),)),
    Peer("spmv", "csr", "cusparse_csr", "torch.sparse_csr_tensor (int32 indices, fp64) times a vector: torch.mv",
         mirrors_cpu="csr"),
    Peer("spmv", "spmm_csr", "cusparse_spmm", "torch.sparse_csr_tensor times a row-major block: torch.mm",
         mirrors_cpu="spmm_csr"),
    # CG over the stage's window of drifting right-hand sides, fp64, torch.mv on a CSR tensor. The host-checked
    # loop is the one a PyTorch propagator writes (`while rr.item() > limit`); the device loop queues
    # cg_check_every iterations with no read (a converged solve's updates masked by torch.where) and reads the
    # flag once per block, as the stage's graph variant replays its captured block.
    Peer("cg", "host_checked", "host_checked",
         "torch CG from x = 0, the residual norm read with .item() every iteration", mirrors_cpu="host_checked"),
    Peer("cg", "host_checked_warm", "host_checked_warm",
         "the same warm-started from the cached solution (one torch.mv for its residual), never skipped",
         mirrors_cpu="host_checked_warm"),
    Peer("cg", "host_checked_lazy", "host_checked_lazy",
         "the lazy gate: warm start, the solve skipped when (rr <= tol^2 bb).item() says the cache is within 1e-6",
         mirrors_cpu="host_checked_lazy"),
    Peer("cg", "device_loop", "graph",
         "8 CG iterations queued with no read (converged updates masked by torch.where), one .item() per 8",
         needs_cuda=True),
    Peer("cg", "device_loop_warm", "graph_warm", "the device loop warm-started from the cache, never skipped",
         needs_cuda=True),
    Peer("cg", "device_loop_lazy", "graph_lazy", "the device loop with the lazy gate (its verdict read with .item())",
         needs_cuda=True),
    # The loss of a training loop read on the host: the step is a copy standing for the forward, the loss and
    # two metrics (torch ops) and their accumulation into fp64 running sums on the device. GPU-only, as the stage.
    Peer("hostsync", "no_reads", "no_reads", "the same steps with no host read: the floor", needs_cuda=True),
    Peer("hostsync", "item_every_step", "item_every_step", "total += loss.item() every step", needs_cuda=True),
    Peer("hostsync", "sync_every_n", "sync_every_n",
         "running_loss += loss.detach() on the device, running_loss.item() once per N steps", needs_cuda=True),
    Peer("hostsync", "metrics_separate", "metrics_separate", "three running metrics read with three .item() per N steps",
         needs_cuda=True),
    Peer("hostsync", "metrics_batched", "metrics_batched", "the three running metrics in one .tolist() per N steps",
         needs_cuda=True),
    Peer("hostsync", "async_pinned", "async_pinned",
         "each step's loss copied non_blocking into a pinned slot behind a torch.cuda.Event, read once query() says "
         "done (8 slots)", needs_cuda=True),
    Peer("launch", "eager", "eager", "the window's 768 in-place lerp_ kernels launched one by one", needs_cuda=True),
    Peer("launch", "graph", "graph", "the same window captured once in a torch.cuda.CUDAGraph, then replay()",
         needs_cuda=True),
    Peer("alloc", "caching_allocator", "pool",
         "torch.empty per buffer per step and del after: PyTorch's caching allocator", (), needs_cuda=True),
    Peer("alloc", "empty_cache", "empty_cache", "the same, with torch.cuda.empty_cache() after every step",
         needs_cuda=True),
    Peer("alloc", "reuse", "reuse", "the same kernels on buffers allocated once: the floor", needs_cuda=True),
    # On the CPU the .to(device) is a no-op: __getitem__ clones and the stack, as the CPU stage's per_sample.
    Peer("collate", "per_sample", "per_sample",
         "__getitem__ clones, torch.stack per field, .to('cuda') from pageable memory (on the CPU: no copy)", NO_COMPUTE + FIELD_LAYOUTS,
         mirrors_cpu="per_sample"),
    # The PyTorch fix on the CPU, where there is no copy to the device to pin for: no CUDA row stands for it.
    Peer("collate", "index_select", "",
         "torch.index_select(field, 0, batch_indices, out=batch) per field into reused batch tensors: the "
         "dataset pre-stacked, no __getitem__, no stack", NO_COMPUTE + FIELD_LAYOUTS, mirrors_cpu="gather"),
    Peer("collate", "pin_memory", "per_sample",
         "the same + .pin_memory() + .to('cuda', non_blocking=True): DataLoader(pin_memory=True)", NO_COMPUTE + FIELD_LAYOUTS,
         needs_cuda=True),
    Peer("collate", "pinned", "pinned",
         "index_select straight into a pinned batch (double-buffered), one non_blocking copy", NO_COMPUTE + FIELD_LAYOUTS,
         needs_cuda=True),
)

# Declared pairs: (stage, baseline variant, improved variant, label), judged per problem.
PAIRS = (
    ("adamw", "per_tensor", "fused", "torch AdamW: fused vs per-tensor"),
    ("adamw", "foreach", "fused", "torch AdamW: fused vs foreach"),
    ("adamw", "per_tensor", "foreach", "torch AdamW: foreach vs per-tensor"),
    ("gradnorm", "per_tensor", "foreach", "torch clip_grad_norm_: foreach vs for-loop"),
    ("gradnorm", "foreach_item", "foreach", "torch clip_grad_norm_: no host read vs .item() of the norm"),
    ("gradnorm", "per_tensor", "foreach_item", "torch clip_grad_norm_: foreach + .item() vs for-loop"),
    ("attention", "naive", "sdpa_flash", "torch attention: SDPA flash vs naive"),
    ("attention", "naive", "sdpa", "torch attention: SDPA vs naive"),
    ("cg", "host_checked", "host_checked_warm", "torch CG: warm start vs cold start (.item() per iteration)"),
    ("cg", "host_checked_warm", "host_checked_lazy", "torch CG: gate vs warm start alone (.item() per iteration)"),
    ("cg", "device_loop_warm", "device_loop_lazy", "torch CG: gate vs warm start alone (device loop)"),
    ("cg", "host_checked", "device_loop", "torch CG: one read per 8 iterations vs .item() per iteration"),
    ("cg", "host_checked_lazy", "device_loop_lazy", "torch CG: one read per 8 iterations vs .item() per iteration, lazy"),
    ("hostsync", "item_every_step", "sync_every_n", "torch hostsync: loss.item() every N vs every step"),
    ("hostsync", "item_every_step", "async_pinned", "torch hostsync: async pinned copy vs loss.item() every step"),
    ("hostsync", "metrics_separate", "metrics_batched", "torch hostsync: metrics in one .tolist() vs three .item()"),
    ("hostsync", "item_every_step", "no_reads", "torch hostsync: no reads vs loss.item() every step"),
    ("launch", "eager", "graph", "torch launch: CUDA graph replay vs eager"),
    ("alloc", "caching_allocator", "reuse", "torch alloc: reuse vs caching allocator"),
    ("alloc", "empty_cache", "caching_allocator", "torch alloc: cache kept vs emptied every step"),
    ("collate", "per_sample", "pinned", "torch collate: pinned gather + async copy vs per-sample + stack"),
    ("collate", "per_sample", "pin_memory", "torch collate: pin_memory vs per-sample + stack"),
    ("collate", "per_sample", "index_select", "torch collate: index_select into a reused batch vs per-sample + stack"),
)


@dataclass(frozen=True)
class Bench:
    """One row to measure: a peer on one problem."""

    peer: Peer
    label: str                  # benchsuite's problem label, "params=29900000,tensors=200,dtype=fp32"
    problem: Dict[str, str]     # its axes, and on a CPU variant's problem what the variant implies
    mirrors: str = ""           # the benchsuite row's backend/variant it stands beside: "cuda/fused", "cpu/fused"
    listed_peak_key: str = ""   # that row's peak key where a listing gave it (a CPU variant's)

    @property
    def name(self) -> str:
        return row_name(self.peer.stage, self.peer.variant, self.label)


def row_name(stage: str, variant: str, label: str) -> str:
    return f"{stage}/{BACKEND}/{variant}/{label}" if label else f"{stage}/{BACKEND}/{variant}"


def problem_label(problem: Dict[str, str], axes: Sequence[str]) -> str:
    return ",".join(f"{a}={problem[a]}" for a in axes)


def attention_shape(problem: Dict[str, str]) -> str:
    """BATCHxHEADSxSEQxHEAD_DIM: the CUDA variants' `shape` axis, the CPU variants' `cpu_shape`."""
    return problem["shape"] if "shape" in problem else problem["cpu_shape"]


def builtin_problems(peer: Peer, quick: bool) -> List[Tuple[str, Dict[str, str]]]:
    """The problems of the mirrored CUDA variant as benchsuite enumerates them (the last axis fastest); none
    for a peer that mirrors no CUDA variant."""
    if not peer.mirrors:
        return []
    axes = VARIANT_AXES[(peer.stage, peer.mirrors)]
    values = [AXES[peer.stage][a][1 if quick else 0] for a in axes]
    out = []
    for combo in itertools.product(*values):
        problem = dict(zip(axes, combo))
        if peer.accepts(problem):
            out.append((problem_label(problem, axes), problem))
    return out


def listed_rows(doc: dict, peer: Peer, backend: str = "cuda") -> List[Tuple[str, Dict[str, str], dict]]:
    """(label, problem, work) of the rows of the variant of `backend` the peer mirrors in a `trainbench-list/1`
    document (benchsuite --list --format json --backend ...), in its order, those the peer accepts. On a CPU
    variant the problem also holds what the variant implies (Peer.cpu_implied)."""
    variant = peer.mirrored(backend)
    out = []
    for row in doc.get("benchmarks") or []:
        if not variant or not isinstance(row, dict) or \
                (row.get("stage"), row.get("backend"), row.get("variant")) != (peer.stage, backend, variant):
            continue
        parts = str(row.get("name", "")).split("/", 3)
        problem = {str(k): str(v) for k, v in (row.get("problem") or {}).items()}
        if backend == "cpu":
            problem.update((axis, value) for axis, value in peer.cpu_implied if axis not in problem)
        if len(parts) == 4 and peer.accepts(problem):
            work = row.get("work") if isinstance(row.get("work"), dict) else {}
            out.append((parts[3], problem, work))
    return out


def problems_from_list(doc: dict, peer: Peer, backend: str = "cuda") -> List[Tuple[str, Dict[str, str]]]:
    """listed_rows' (label, problem) pairs."""
    return [(label, problem) for label, problem, _ in listed_rows(doc, peer, backend)]


def read_listing(path: str) -> dict:
    """A benchsuite --list --format json document from a file (benchsuite --backend ...,torch writes one)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise UsageError(f"--listing {path}: cannot read ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"--listing {path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, dict) or doc.get("schema") != "trainbench-list/1":
        raise UsageError(f"--listing {path}: not a benchsuite --list --format json document (schema trainbench-list/1)")
    return doc


def benchsuite_list(benchsuite: str, quick: bool, timeout: float = 120.0, backend: str = "cuda") -> dict:
    """Runs `benchsuite --list --format json --backend <backend> [--quick]` and returns the document."""
    cmd = [benchsuite, "--list", "--format", "json", "--backend", backend] + (["--quick"] if quick else [])
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except OSError as e:
        raise UsageError(f"cannot run {benchsuite}: {e.strerror or e}") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"{' '.join(cmd)} ran past {timeout:g} s") from None
    if proc.returncode != 0:
        said = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        raise UsageError(f"{' '.join(cmd)} exited {proc.returncode}: {said[0]}")
    try:
        doc = json.loads(proc.stdout.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"{' '.join(cmd)} did not print a JSON list: {e}") from None
    if not isinstance(doc, dict) or doc.get("schema") != "trainbench-list/1":
        raise UsageError(f"{' '.join(cmd)} printed no trainbench-list/1 document")
    return doc


def select_benches(quick: bool, pattern: Optional[str], listing: Optional[dict] = None,
                   mirror: str = "cuda", empty_ok: bool = False) -> List[Bench]:
    """Every peer on its problems, those whose name or mirrored row's name matches (so benchsuite's
    `--filter adamw/cpu` keeps the torch rows beside adamw/cpu's; empty_ok: none is no error). `mirror` is the backend of the benchsuite
    variants mirrored: cuda (the problems from `listing` when given, else AXES) or cpu (from `listing`, a
    `--backend cpu` list; the peers without a CPU variant are left out). On the CPU (BACKEND torch) the
    GPU-only peers are left out."""
    if mirror not in ("cuda", "cpu"):
        raise ValueError(f"mirror is cuda or cpu, not {mirror!r}")
    if mirror == "cpu" and listing is None:
        raise ValueError("mirroring the CPU variants needs benchsuite's --backend cpu list")
    try:
        rx = re.compile(pattern) if pattern else None
    except re.error as e:
        raise UsageError(f"--filter is not a valid regular expression: {e}") from None
    benches = []
    for peer in PEERS:
        variant = peer.mirrored(mirror)
        if (peer.needs_cuda and BACKEND == BACKENDS["cpu"]) or not variant:
            continue
        mirrors = f"{mirror}/{variant}"
        if listing is None:
            benches += [Bench(peer, label, problem, mirrors) for label, problem in builtin_problems(peer, quick)]
            continue
        rows = listed_rows(listing, peer, mirror)
        if not rows:
            raise UsageError(f"benchsuite lists no {peer.stage}/{mirrors} problems for "
                             f"{row_name(peer.stage, peer.variant, '')}")
        for label, problem, work in rows:   # a CPU row's peak key (the CUDA ones come from work_model)
            peak_key = str(work.get("peak_key") or "") if mirror == "cpu" else ""
            benches.append(Bench(peer, label, problem, mirrors, peak_key))
    chosen = [b for b in benches if rx is None or rx.search(b.name) or
              (b.mirrors and rx.search(f"{b.peer.stage}/{b.mirrors}/{b.label}" if b.label else
                                       f"{b.peer.stage}/{b.mirrors}"))]
    if not chosen and not empty_ok:
        stages = sorted({f"{b.peer.stage}/{BACKEND}/{b.peer.variant}" for b in benches})
        raise UsageError(f"--filter {pattern!r} matches no benchmark; there are: {', '.join(stages)}")
    return chosen


# ---- work models (bytes and FLOPs per call), the stages' own -------------------------------------------
@dataclass
class Work:
    bytes: float
    flops: float
    bound: str                       # memory | compute: which rate a peak would be of
    peak_key: str
    footprint: Optional[float] = None   # the data a call touches; None: bytes
    counters: Dict[str, float] = field(default_factory=dict)


def param_set_sizes(total: int, tensors: int) -> List[int]:
    """adamw::make_param_set's tensor sizes (kernels/adamw/param_set.cpp): a token embedding first and an
    untied head last (between them at least 1/8 of the total), and in between a transformer layer's 12
    tensors repeated, with the largest width d that fits."""
    if total < 1 or tensors < 1:
        raise UsageError(f"params and tensors must be at least 1 (got {total}, {tensors})")
    # per layer tensor: multiples of d*d and of d (GPT-2 order: ln_1 w/b, c_attn w/b, c_proj w/b, ln_2 w/b,
    # c_fc w/b, mlp c_proj w/b)
    roles = [(0, 1), (0, 1), (3, 0), (0, 3), (1, 0), (0, 1), (0, 1), (0, 1), (4, 0), (0, 4), (4, 0), (0, 1)]
    layer_tensors = max(tensors - 2, 0)
    a = sum(roles[k % 12][0] for k in range(layer_tensors))
    b = sum(roles[k % 12][1] for k in range(layer_tensors))
    budget = total - (total + 7) // 8

    def layers_size(d: int) -> int:
        return a * d * d + b * d

    d = 0
    if a > 0:
        d = int((math.sqrt(float(b) * b + 4.0 * a * budget) - b) / (2.0 * a))
    elif b > 0:
        d = budget // b
    while d > 0 and layers_size(d) > budget:
        d -= 1
    while (a > 0 or b > 0) and layers_size(d + 1) <= budget:
        d += 1
    embedding = total - layers_size(d)
    sizes = [total if tensors == 1 else embedding // 2]
    sizes += [roles[k % 12][0] * d * d + roles[k % 12][1] * d for k in range(layer_tensors)]
    if tensors > 1:
        sizes.append(embedding - embedding // 2)
    return sizes


def parse_shape(text: str) -> Tuple[int, int, int, int]:
    """BATCHxHEADSxSEQxHEAD_DIM."""
    parts = text.split("x")
    if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise UsageError(f"attention shape {text!r} is not BATCHxHEADSxSEQxHEAD_DIM")
    return tuple(int(p) for p in parts)  # type: ignore[return-value]


def graph_spec(name: str) -> Tuple[str, int]:
    """laplacian::parse_graph: ('ring' | 'random', k 4..8), ('grid2d', 4) or ('grid3d', 6)."""
    if name == "grid2d":
        return "grid2d", 4
    if name == "grid3d":
        return "grid3d", 6
    m = re.fullmatch(r"(ring|random)([4-8])", name)
    if not m:
        raise UsageError(f"unknown graph {name!r} (ring4..ring8, random4..random8, grid2d, grid3d)")
    return m.group(1), int(m.group(2))


def _round_half_away(x: float) -> int:
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


def grid_width(family: str, n: int) -> int:
    """nx of a grid: round(sqrt(n)) (2D) or round(cbrt(n)) (3D), halves away from zero, at least 1."""
    cbrt = getattr(math, "cbrt", lambda v: v ** (1.0 / 3.0))   # math.cbrt: Python 3.11
    return max(1, _round_half_away(math.sqrt(n) if family == "grid2d" else cbrt(n)))


def laplacian_nnz(graph: str, n: int) -> int:
    """laplacian::nnz for the closed forms (n >= 4096): stored nonzeros of A = I + alpha L."""
    family, k = graph_spec(graph)
    if family == "ring":
        return n * (1 + 2 * (k // 2)) + (2 * (n // 2) if k % 2 else 0)
    if family == "random":
        return n * (k + 1)

    def line_edges(nx: int) -> int:
        return (n // nx) * (nx - 1) + max(n % nx - 1, 0)

    nx = grid_width(family, n)
    if family == "grid2d":
        return n + 2 * (line_edges(nx) + max(n - nx, 0))
    ny, lines = nx, (n + nx - 1) // nx
    y_edges = sum(min(nx, n - (line + 1) * nx) for line in range(lines - 1) if line % ny != ny - 1)
    return n + 2 * (line_edges(nx) + y_edges + max(n - nx * ny, 0))


def collate_fields(problem: Dict[str, str]) -> List[Tuple[str, int, str]]:
    """(name, elements per sample, dtype) per field, in batch order (collate::Shape::fields)."""
    seq = int(problem["seq_len"])
    fields = []
    if problem["layout"] == "text_pair":
        embed = int(problem["embed_dim"])
        fields += [("input_embedding", embed, "float32"), ("target_embedding", embed, "float32")]
    return fields + [("tokens", seq, "int64")]


def collate_sample_bytes(problem: Dict[str, str]) -> int:
    return sum(n * (4 if dtype == "float32" else 8) for _, n, dtype in collate_fields(problem))


# collate: (peak key, H2D copies per field, fixed H2D copies, host copies of the batch, touched epochs,
# touched batch-sized buffers), as collate_registry.cpp's work() has them for its per_sample and pinned
_COLLATE_WORK = {
    "per_sample": ("cuda.h2d_pageable", 1, 0, 2, 1, 3),
    "pin_memory": ("cuda.h2d_pinned", 1, 0, 3, 1, 4),    # + the copy into pinned memory, + the pinned batch
    "pinned": ("cuda.h2d_pinned", 0, 1, 1, 1, 3),
}
# On a CPU variant's problem (no compute_us axis): (bytes per batch byte, host copies of the batch, touched
# epochs, touched batch-sized buffers), as collate_registry.cpp's CPU per_sample has them: the batch read
# and written once (2 B per batch byte), no transfer.
_COLLATE_CPU_WORK = {
    "per_sample": (2, 2, 1, 2),
    "index_select": (2, 1, 1, 1),   # as the CPU gather: each row copied once, into a reused batch
}


def work_model(bench: Bench) -> Work:
    """Bytes and FLOPs per call of the stage's work model (kernels/<stage>/<stage>_registry.cpp)."""
    stage, variant, p = bench.peer.stage, bench.peer.variant, bench.problem
    if stage == "adamw":
        # credited with one fused pass's traffic: read p, g, m, v, write p, m, v: 28 B per fp32 parameter
        eb = 4.0 if p["dtype"] == "fp32" else 2.0
        n = float(p["params"])
        return Work((3 * eb + 16) * n, 15 * n, "memory", "cuda.copy", (2 * eb + 8) * n,
                    {"tensors": float(p["tensors"])})
    if stage == "gradnorm":
        # the minimal traffic of a norm and a clip: one read of every gradient for the norm, one read and one
        # write for the scale, whatever the variant does on top; the footprint is the gradients
        eb = 4.0 if p["dtype"] == "fp32" else 2.0
        n = float(p["params"])
        return Work(3 * eb * n, 3 * n, "memory", "cuda.copy", eb * n, {"tensors": float(p["tensors"])})
    if stage == "attention":
        # the two products, halved when causal (the masked half is no useful work, as FlashAttention
        # counts it); the bytes: Q, K, V read once and O written once
        batch, heads, seq, dim = parse_shape(attention_shape(p))
        eb = 2.0 if p["dtype"] == "bf16" else 4.0
        flops = 4.0 * batch * heads * seq * seq * dim / (2 if p["causal"] == "causal" else 1)
        scores_mib = 4.0 * batch * heads * seq * seq / (1 << 20) if variant == "naive" else 0.0
        return Work(4.0 * batch * heads * seq * dim * eb, flops, "compute",
                    "cuda.gemm_bf16" if p["dtype"] == "bf16" else "cuda.gemm_fp32", None, {"scores_mib": scores_mib})
    if stage == "spmv":
        # CSR: 12 B per nonzero, 4 B per row pointer, x read and y written once per right-hand side
        n, nnz = float(p["rows"]), float(laplacian_nnz(p["graph"], int(p["rows"])))
        rhs = float(p.get("rhs", 1))
        return Work(12.0 * nnz + 4.0 * (n + 1) + 16.0 * n * rhs, 2.0 * nnz * rhs, "memory", "cuda.copy", None,
                    {"nnz": nnz})
    if stage == "cg":
        # cg_registry.cpp's cg_work: no bytes (a solve's traffic is known only once it ran), one matvec per
        # solve as the FLOP floor; the counters say what happened
        n = int(p["rows"])
        return Work(0.0, 2.0 * laplacian_nnz(p["graph"], n) * CG_WINDOW, "memory", "", None,
                    {"solves": float(CG_WINDOW)})
    if stage == "hostsync":
        steps, elements = int(p["steps"]), int(p["elements"])
        return Work(hostsync_bytes_per_call(variant, steps, elements), 0.0, "memory", "cuda.copy", None,
                    {"steps": float(steps), "syncs": float(HOSTSYNC_READS[variant](steps)[0]),
                     "transfers": float(HOSTSYNC_READS[variant](steps)[1])})
    if stage == "launch":
        steps, per_step, elements = (int(p[a]) for a in ("steps", "kernels_per_step", "elements"))
        return Work(steps * per_step * 3.0 * 4 * elements, 0.0, "memory", "cuda.copy", None,
                    {"steps": float(steps), "kernels": float(steps * per_step)})
    if stage == "alloc":
        # the kernels' few bytes (3 probe words per buffer written, read, summed); the counters say what a
        # step asks of the allocator
        buffers = int(p["buffers"])
        allocations = 0 if variant == "reuse" else buffers
        counters = {"buffers": float(buffers), "allocations": float(allocations),
                    "kernels": float(buffers + 3),   # a fill per buffer, stack, sum, add to the checksum
                    "bytes_allocated": float(allocations * int(p["buffer_bytes"]))}
        if variant == "empty_cache":
            counters["releases"] = 1.0
        return Work(buffers * 3 * 24.0, 0.0, "memory", "", None, counters)
    if stage == "collate":
        batch = int(p["batch"]) * collate_sample_bytes(p)
        epoch = (int(p["samples"]) // int(p["batch"])) * batch
        if "compute_us" not in p:   # a CPU variant's problem: a copy in host memory
            per_byte, host_copies, epochs, batches = _COLLATE_CPU_WORK[variant]
            return Work(float(per_byte * batch), 0.0, "memory", "cpu.copy", float(epochs * epoch + batches * batch),
                        {"samples_per_call": float(p["batch"]), "host_bytes": float(host_copies * batch)})
        peak_key, per_field, fixed, host_copies, epochs, batches = _COLLATE_WORK[variant]
        return Work(float(batch), 0.0, "memory", peak_key, float(epochs * epoch + batches * batch),
                    {"samples_per_call": float(p["batch"]),
                     "h2d_copies": float(per_field * len(collate_fields(p)) + fixed), "kernels": 0.0,
                     "host_bytes": float(host_copies * batch)})
    raise UsageError(f"no work model for stage {stage!r}")


# ---- deterministic generators shared with the C++ stages (kernels/runtime/random.h) ------------------
_M64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def uniform_at(seed: int, i: int, lo: float = -1.0, hi: float = 1.0) -> float:
    """Uniform in [lo, hi) from 24 random bits, rounded to fp32 as the C++ computes it."""
    bits = splitmix64((seed * 0x632BE59BD9B4E019 + i) & _M64) >> 40
    return struct.unpack("f", struct.pack("f", lo + (hi - lo) * bits / 16777216.0))[0]


def _splitmix64_np(x):
    import numpy as np
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _fisher_yates(n: int, draws) -> List[int]:
    """0..n-1 shuffled from the top: slot j swaps with draws[j] % (j + 1), j = n-1 .. 1."""
    order = list(range(n))
    picks = [0] * n
    if n > 1:
        import numpy as np
        j = np.arange(n, dtype=np.uint64)
        picks = (draws % (j + np.uint64(1))).tolist()
    for j in range(n - 1, 0, -1):
        k = picks[j]
        order[j], order[k] = order[k], order[j]
    return order


def epoch_order(samples: int, shuffled: bool, seed: int = 5) -> List[int]:
    """collate::epoch_order: the epoch's sample order (defaults::collate_shuffle_seed 5)."""
    if not shuffled or samples < 2:
        return list(range(samples))
    import numpy as np
    j = np.arange(samples, dtype=np.uint64)
    return _fisher_yates(samples, _splitmix64_np(np.uint64((seed * 0x9E3779B97F4A7C15) & _M64) + j))


def graph_permutation(n: int, seed: int, stream: int) -> List[int]:
    """laplacian.cpp's permutation(n, seed, stream): one random Hamiltonian cycle's node order."""
    import numpy as np
    j = np.arange(n, dtype=np.uint64)
    base = np.uint64(((seed * 0x9E3779B97F4A7C15) & _M64) ^ ((stream << 40) & _M64))
    return _fisher_yates(n, _splitmix64_np(base ^ j))


GRAPH_SEED = 21          # laplacian::graph_seed
LAPLACIAN_ALPHA = 0.5    # defaults::laplacian_alpha


def laplacian_csr(graph: str, n: int, alpha: float = LAPLACIAN_ALPHA, seed: int = GRAPH_SEED):
    """laplacian::build_shifted_laplacian: A = I + alpha L in CSR (int32 row_ptr and columns, fp64 values),
    columns sorted within a row, the diagonal among them: the stages' matrix, element for element (numpy)."""
    import numpy as np
    family, k = graph_spec(graph)
    if not 1 <= n <= 2**31 - 1:
        raise UsageError(f"a graph needs 1 to 2^31 - 1 nodes, not {n}")
    index = np.int32 if 2 * n < 2**31 else np.int64   # every sum below stays under 2n
    i = np.arange(n, dtype=index)
    cand = []   # neighbour candidates per node, -1 where there is none
    if family == "ring":
        for d in range(1, k // 2 + 1):
            cand += [(i + d) % n, (i + (n - d % n)) % n]
        m = n // 2
        if k % 2 and m > 0:
            cand.append(np.where(i < m, i + m, np.where(i < 2 * m, i - m, -1)))
    elif family == "random":
        cycles = k // 2
        for c in range(cycles + k % 2):
            order = np.asarray(graph_permutation(n, seed, c), dtype=index)
            pos = np.empty(n, dtype=index)
            pos[order] = i
            if c < cycles:
                cand += [order[(pos + 1) % n], order[(pos + (n - 1)) % n]]
            else:   # odd k: a perfect matching of consecutive positions
                partner = pos ^ 1
                cand.append(np.where(partner < n, order[np.minimum(partner, n - 1)], -1))
    else:
        nx = grid_width(family, n)
        x = i % nx
        cand += [np.where(x > 0, i - 1, -1), np.where((x < nx - 1) & (i + 1 < n), i + 1, -1)]
        if family == "grid2d":
            cand += [np.where(i >= nx, i - nx, -1), np.where(i < n - nx, i + nx, -1)]
        else:
            ny, plane = nx, nx * nx
            y = (i // nx) % ny
            cand += [np.where(y > 0, i - nx, -1), np.where((y < ny - 1) & (i < n - nx), i + nx, -1),
                     np.where(i >= plane, i - plane, -1), np.where(i < n - plane, i + plane, -1)]
    cols = np.stack(cand + [i], axis=1).astype(index, copy=False)   # the diagonal last, sorted in below
    diagonal = cols == i[:, None]
    diagonal[:, -1] = False
    cols[(cols < 0) | diagonal] = n                           # absent and self links sort to the end
    cols.sort(axis=1)
    repeat = np.zeros(cols.shape, dtype=bool)
    repeat[:, 1:] = cols[:, 1:] == cols[:, :-1]
    cols[repeat] = n                                          # a neighbour reached twice is one link
    cols.sort(axis=1)
    keep = cols < n
    counts = keep.sum(axis=1)
    row_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=row_ptr[1:])
    if row_ptr[-1] > 2**31 - 1:
        raise UsageError(f"{graph} with {n} rows has more than 2^31 - 1 nonzeros")
    diagonal_value = 1.0 + alpha * (counts - 1).astype(np.float64)
    val = np.where(cols == i[:, None], diagonal_value[:, None], -alpha)[keep]
    col = cols[keep]
    return row_ptr.astype(np.int32), col.astype(np.int32), val


def uniform_array(seed: int, count: int, lo: float = -1.0, hi: float = 1.0):
    """uniform_at(seed, i) for i = 0..count-1 as a float32 numpy array (for [-1, 1) the float arithmetic of
    the C++ is exact: lo + 2 * bits / 2^24 needs no rounding)."""
    import numpy as np
    base = np.uint64((seed * 0x632BE59BD9B4E019) & _M64)
    bits = (_splitmix64_np(base + np.arange(count, dtype=np.uint64)) >> np.uint64(40)).astype(np.float64)
    return (lo + (hi - lo) * bits / 16777216.0).astype(np.float32)


# cg (kernels/cg/cg.h, defaults.h): the window, the tolerances, the right-hand sides' seed
CG_WINDOW = 16              # defaults::cg_window: solves per call
CG_TOL = 1e-7               # defaults::cg_tol
LAZY_CG_TOL = 1e-6          # defaults::lazy_cg_tol
CG_MAX_ITERATIONS = 1000    # defaults::cg_max_iterations
CG_CHECK_EVERY = 8          # defaults::cg_check_every
CG_RESIDUAL_ATOL = 1e-12    # tolerance::cg_residual_atol
CG_SEED_RHS = 41            # cg::seed_rhs


def cg_rhs_sequence(n: int, drift: float, steps: int = CG_WINDOW):
    """cg::RhsSequence: b_0 .. b_steps as a (steps + 1) x n float64 array, and each step's drawn drift. b_0 is
    uniform_at(41, i); step t moves b_{t-1} by drift x (0.5 + (j + 1/2) / steps) of its norm (j a seeded
    permutation of 0..steps-1) along the direction uniform_at(41 + 1000 + t, i)."""
    import numpy as np
    order = list(range(steps))
    for j in range(steps - 1, 0, -1):
        k = splitmix64((CG_SEED_RHS * 0x9E3779B97F4A7C15 + j) & _M64) % (j + 1)
        order[j], order[k] = order[k], order[j]
    b = np.empty((steps + 1, n), dtype=np.float64)
    b[0] = uniform_array(CG_SEED_RHS, n)
    drifts = [0.0] * (steps + 1)
    for t in range(1, steps + 1):
        drifts[t] = drift * (0.5 + (order[t - 1] + 0.5) / steps)
        direction = uniform_array(CG_SEED_RHS + 1000 + t, n).astype(np.float64)
        u = float(np.sqrt(np.dot(direction, direction)))
        scale = drifts[t] * float(np.sqrt(np.dot(b[t - 1], b[t - 1]))) / u if u > 0 else 0.0
        b[t] = b[t - 1] + scale * direction
    return b, drifts


# hostsync (kernels/hostsync/hostsync.h): a step's inputs and its three metrics
HOSTSYNC_SEEDS = (31, 32)    # hostsync::seed_prediction, seed_target
HOSTSYNC_METRICS = 3
HOSTSYNC_ASYNC_SLOTS = 8     # defaults::hostsync_async_slots
# read_plan(pattern, steps): (host waits, device-to-host copies, bytes) per call of `steps` steps
HOSTSYNC_READS = {
    "no_reads": lambda s: (0, 0, 0),
    "item_every_step": lambda s: (s, s, 4 * s),
    "sync_every_n": lambda s: (1, 1, 8),
    "metrics_separate": lambda s: (HOSTSYNC_METRICS, HOSTSYNC_METRICS, 8 * HOSTSYNC_METRICS),
    "metrics_batched": lambda s: (1, 1, 8 * HOSTSYNC_METRICS),
    "async_pinned": lambda s: (0, s, 4 * s),
}


def hostsync_bytes_per_call(variant: str, steps: int, elements: int) -> float:
    """hostsync::bytes_per_call: the step kernels' device traffic and the reads to the host."""
    forward, loss = 4.0 * elements, 8.0 * elements + 4 * HOSTSYNC_METRICS
    accumulate = 4 * HOSTSYNC_METRICS + 16 * HOSTSYNC_METRICS
    return steps * (forward + loss + accumulate) + HOSTSYNC_READS[variant](steps)[2]


def hostsync_predictions(steps: int, elements: int):
    """prediction(step, i) for steps 0..steps-1: a steps x elements float32 array (uniform_at(31, step x
    elements + i))."""
    return uniform_array(HOSTSYNC_SEEDS[0], steps * elements).reshape(steps, elements)


def hostsync_metric_sums(steps: int, elements: int) -> List[float]:
    """hostsync::metric_sums: the loss (mean squared error), mean |error| and mean prediction^2 of steps
    0..steps-1 summed, in fp64."""
    import numpy as np
    p = hostsync_predictions(steps, elements).astype(np.float64)
    e = p - uniform_array(HOSTSYNC_SEEDS[1], elements).astype(np.float64)[None, :]
    return [float((e * e).mean(axis=1).sum()), float(np.abs(e).mean(axis=1).sum()), float((p * p).mean(axis=1).sum())]


def launch_window(steps: int, kernels_per_step: int, buffers: int = 4) -> List[Tuple[int, int, float]]:
    """The launch stage's window (launch_reference.cpp build_window) as (dst, src, weight) of one lerp_
    each: dst = (1 - w) dst + w src, w = 1 - a with the stage's coefficient a in [0.5, 0.75). One kernel
    per node, like the stage's dst = a dst + b src + c, and a convex combination, so the state stays bounded."""
    window = []
    for s in range(steps):
        for k in range(kernels_per_step):
            dst = k % buffers
            src = (dst + 1 + s % (buffers - 1)) % buffers
            a = uniform_at(42, 3 * (s * kernels_per_step + k), 0.5, 0.75)
            window.append((dst, src, 1.0 - a))
    return window


def alloc_probe_value(step: int, buffer: int) -> int:
    """The word a step writes into a buffer's probes (any value a wrong buffer would not hold)."""
    return (step * 1009 + buffer * 17 + 1) % 1000003


# ---- statistics (kernels/runtime/stats.cpp) ---------------------------------------------------------------
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


def summarize(samples: Sequence[float], noise_target: float = NOISE_TARGET, level: float = 0.95) -> Summary:
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


def ratio_estimate(baseline: Sequence[float], improved: Sequence[float], level: float = 0.95
                   ) -> Tuple[float, float, float, float]:
    """Hodges-Lehmann baseline / improved (median of all pairwise ratios) with the Mann-Whitney interval
    on the log scale (normal approximation): (ratio, low, high, coverage)."""
    d = sorted(math.log(b) - math.log(a) for b in baseline for a in improved)
    m, n = float(len(baseline)), float(len(improved))
    z = NormalDist().inv_cdf(0.5 + level / 2)
    k = math.floor(m * n / 2 - z * math.sqrt(m * n * (m + n + 1) / 12))
    if k >= 1:
        return math.exp(_median(d)), math.exp(d[k - 1]), math.exp(d[len(d) - k]), level
    return math.exp(_median(d)), math.exp(d[0]), math.exp(d[-1]), 1.0 - 2.0 / math.comb(int(m + n), int(m))


# ---- other load (benches/harness.cpp check_disturbance, kernels/runtime/cpu_load.cpp) ---------------------
# A sample taken while something else held the machine measures that, not the peer: taken again, watched
# on its own, up to DISTURBED_RETAKES times; a row that cannot get clean samples is "disturbed" and gets no
# ratio (kernels/runtime/defaults.h).
DISTURBED_SHARE = 0.25         # a CPU window in which other processes used more of all CPUs is disturbed
THROTTLED_SHARE = 0.02         # a GPU window throttled for more of its time is disturbed
DISTURBED_RETAKES = 3          # attempts per sample
MIN_WINDOW_TICKS = 8           # /proc/stat counts in 10 ms ticks: a shorter window tells nothing
# nvmlClocksEventReason bits that mean the environment set the speed (kernels/runtime/gpu_monitor.h):
# hw_slowdown, sw and hw thermal slowdown, power brake. The software power cap is not one: a heavy kernel
# runs at it every time.
DISTURBING_CLOCK_REASONS = 0x8 | 0x20 | 0x40 | 0x80


@dataclass(frozen=True)
class CpuTicks:
    """All CPUs' busy and total time and this process's own (all its threads), in clock ticks."""

    busy: int = 0
    total: int = 0
    own: int = 0
    valid: bool = False


def read_cpu_ticks(stat_path: str = "/proc/stat", self_stat_path: str = "/proc/self/stat") -> CpuTicks:
    """/proc/stat's aggregate "cpu" line and /proc/self/stat's utime + stime; invalid where unreadable."""
    try:
        with open(stat_path, encoding="ascii", errors="replace") as f:
            cpu = f.readline().split()
        with open(self_stat_path, encoding="ascii", errors="replace") as f:
            # the command (field 2) may hold spaces and parentheses: fields 3.. follow the last ')'
            own = f.read().rpartition(")")[2].split()
        if not cpu or cpu[0] != "cpu":
            return CpuTicks()
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in cpu[1:9])
        utime, stime = int(own[14 - 3]), int(own[15 - 3])
    except (OSError, ValueError, IndexError):
        return CpuTicks()
    busy = user + nice + system + irq + softirq + steal   # guest time is counted in user already
    return CpuTicks(busy, busy + idle + iowait, utime + stime, True)


def others_share(before: CpuTicks, after: CpuTicks, min_ticks: int = MIN_WINDOW_TICKS) -> float:
    """Of all CPUs' time between two reads, the share other processes (and the hypervisor's steal) used,
    0..1; -1 when unknown (a read failed, or the window is shorter than min_ticks)."""
    if not before.valid or not after.valid or after.total < before.total + min_ticks:
        return -1.0
    others = (after.busy - before.busy) - (after.own - before.own)   # ticks are sampled: noise either way
    return 0.0 if others <= 0 else min(1.0, others / (after.total - before.total))


def throttled_share(before: Optional[int], after: Optional[int]) -> float:
    """1 when a disturbing clock event reason was active at either read (NVML's reason bits), else 0;
    -1 when unknown. benchsuite also reads NVML's thermal violation time between the reads; the torch rows
    go by the reasons alone."""
    if before is None or after is None:
        return -1.0
    return 1.0 if (before | after) & DISTURBING_CLOCK_REASONS else 0.0


@dataclass(frozen=True)
class Watch:
    """How a row's samples are watched: a reading taken before and after, the disturbed share of the
    window between two readings (-1: unknown) and the share above which a sample is taken again."""

    read: Callable[[], object]
    share: Callable[[object, object], float]
    limit: float


@dataclass
class Watched:
    """What watching a row's samples saw."""

    share: float = -1.0        # the worst kept sample's share, or the whole window's when none was retaken
    disturbed: bool = False    # a sample stayed over the limit through all its attempts
    retaken: int = 0           # samples taken again


def take_watched(take_sample: Callable[[], float], repetitions: int, watch: Optional[Watch],
                 retakes: int = DISTURBED_RETAKES) -> Tuple[List[float], Watched]:
    """`repetitions` samples, watched as one window; when that window is disturbed each sample is taken
    again, each attempt watched on its own, and the first one within the limit is kept (the last attempt
    when none is). An unknown share counts as clean, as benchsuite's does."""
    start = watch.read() if watch else None
    samples = [take_sample() for _ in range(repetitions)]
    if watch is None:
        return samples, Watched()
    window = watch.share(start, watch.read())
    if window <= watch.limit:
        return samples, Watched(window)
    seen = Watched(0.0)
    for i in range(len(samples)):
        for attempt in range(retakes):
            before = watch.read()
            samples[i] = take_sample()
            share = watch.share(before, watch.read())
            seen.retaken += 1
            if share <= watch.limit:
                seen.share = max(seen.share, share)
                break
            if attempt + 1 == retakes:
                seen.disturbed = True
                seen.share = max(seen.share, share)
    return samples, seen


# ---- rows and the result file -------------------------------------------------------------------------
@dataclass
class Verdict:
    """A check against the reference: ok, the worst error seen, and where it failed."""

    ok: bool
    max_error: float
    detail: str = ""


@dataclass
class Outcome:
    """What measuring one bench gave."""

    disposition: str                 # passed | incorrect | unsupported | failed
    reason: str = ""
    max_error: Optional[float] = None
    samples_ns: List[float] = field(default_factory=list)
    batch: int = 1
    counters: Dict[str, float] = field(default_factory=dict)   # measured, beside the work model's
    note: str = ""
    disturbed: bool = False          # a sample stayed disturbed through its retakes (take_watched)
    retaken: int = 0                 # samples taken again
    others_share: float = -1.0       # CPU rows: other processes' share of the CPUs (-1: unknown, unwatched)
    throttled_share: float = -1.0    # GPU rows: the share of time throttled (-1: unknown, unwatched)


def make_row(bench: Bench, outcome: Outcome, noise_target: float = NOISE_TARGET) -> dict:
    """The `trainbench-results/1` row (benches/results.cpp row_to_json's keys); timings only when passed."""
    work = work_model(bench)
    name = bench.name
    max_error = outcome.max_error
    row = {"name": name, "run_name": name, "run_type": "aggregate", "aggregate_name": "median", "threads": 1,
           "stage": bench.peer.stage, "variant": bench.peer.variant, "backend": BACKEND,
           "mirrors": bench.mirrors or f"cuda/{bench.peer.mirrors}",   # the benchsuite row it stands beside
           "problem": dict(bench.problem), "disposition": outcome.disposition, "reason": outcome.reason,
           "max_error": max_error if max_error is not None and math.isfinite(max_error) else None,
           "mode": "hot", "batch": outcome.batch, "bytes": work.bytes, "flops": work.flops, "bound": work.bound,
           # the GPU's ceilings on the GPU; on the CPU the mirrored CPU row's, where the listing gave it
           "peak_key": work.peak_key if BACKEND == BACKENDS["cuda"] else bench.listed_peak_key,
           "footprint_bytes": work.footprint if work.footprint is not None else work.bytes,
           "counters": dict(work.counters, **outcome.counters), "rationale": bench.peer.rationale}
    if outcome.note:
        row["note"] = outcome.note
    if outcome.disposition == "passed":
        s = summarize(outcome.samples_ns, noise_target)
        row.update({"iterations": outcome.batch, "repetitions": len(outcome.samples_ns), "real_time": s.median,
                    "cpu_time": s.median, "time_unit": "ns", "samples_ns": list(outcome.samples_ns),
                    "median_ns": s.median, "ci_low_ns": s.ci_low, "ci_high_ns": s.ci_high, "ci_level": s.ci_level,
                    "noisy": s.noisy, "gb_per_s": work.bytes / s.median, "tflop_per_s": work.flops / s.median * 1e-3})
        if outcome.others_share >= 0:
            row["others_cpu_share"] = outcome.others_share
        row.update({"disturbed": outcome.disturbed, "retaken_samples": outcome.retaken})
        if outcome.throttled_share >= 0:
            row["throttled_share"] = outcome.throttled_share
    return row


def disturbance_text(row: dict) -> str:
    """What disturbed a row, as benches/results.cpp disturbance_text says it."""
    if row.get("throttled_share", -1) >= 0:
        return f"the GPU was throttled {int(100 * row['throttled_share'] + 0.5)}% of the time"
    return f"other processes used {int(100 * max(row.get('others_cpu_share', 0.0), 0.0) + 0.5)}% of the CPUs"


def make_pairs(rows: List[dict]) -> Tuple[List[dict], List[dict]]:
    """The declared pairs whose two rows both passed, per problem, and those withheld (`pairs_withheld`)
    because one of the two was disturbed: its timing measures the disturbance. Two rows pair when their
    problems are the same, whatever their labels: the CPU's naive attention row is labelled by its shape
    alone (naive_mask_cached has no causal axis) and is the causal SDPA row's problem."""
    passed = [r for r in rows if r.get("disposition") == "passed"]

    def problem_key(row: dict) -> tuple:
        return tuple(sorted((row.get("problem") or {}).items()))

    pairs, withheld = [], []
    for stage, base, improved, text in PAIRS:
        bases = {problem_key(r): r for r in passed if (r.get("stage"), r.get("variant")) == (stage, base)}
        for i in (r for r in passed if (r.get("stage"), r.get("variant")) == (stage, improved)):
            b = bases.get(problem_key(i))
            if not b:
                continue
            if b.get("disturbed") or i.get("disturbed"):
                d = i if i.get("disturbed") else b
                withheld.append({"stage": stage, "label": text, "baseline": b["name"], "improved": i["name"],
                                 "why": f"{d['name']} was disturbed: {disturbance_text(d)} during its samples"})
                continue
            ratio, low, high, level = ratio_estimate(b["samples_ns"], i["samples_ns"])
            pairs.append({"stage": stage, "label": text, "baseline": b["name"], "improved": i["name"], "kind": "timed",
                          "ratio": ratio, "ci_low": low, "ci_high": high, "ci_level": level,
                          "baseline_median_ns": b["median_ns"], "improved_median_ns": i["median_ns"]})
    return pairs, withheld


def _cpu_info() -> Tuple[str, float]:
    model, mhz = "", 0.0
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                elif key.strip() == "cpu MHz" and not mhz:
                    try:
                        mhz = float(value)
                    except ValueError:
                        pass
    except OSError:
        pass
    return model or platform.processor() or "unknown CPU", mhz


def _git_commit() -> str:
    try:
        proc = subprocess.run(["git", "-C", REPO_ROOT, "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=10)
        return proc.stdout.decode().strip() if proc.returncode == 0 else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def _trainbench_version() -> str:
    try:
        with open(os.path.join(REPO_ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
            m = re.search(r"project\(\s*trainbench\s+VERSION\s+([0-9.]+)", f.read())
        return m.group(1) if m else "unknown"
    except OSError:
        return "unknown"


def make_context(devices: List[dict], torch_info: dict, settings: dict, now: Optional[datetime] = None) -> dict:
    """The run's context: Google Benchmark's keys, trainbench's (host, devices, settings) and `torch`.
    `devices` and `torch_info` come from torch_peer_cases.device_context()."""
    model, mhz = _cpu_info()
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        load = list(os.getloadavg())
    except OSError:
        load = []
    return {
        "date": (now or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
        "host_name": socket.gethostname(), "executable": "scripts/torch-peers",
        "num_cpus": os.cpu_count() or cores, "mhz_per_cpu": int(round(mhz)), "cpu_scaling_enabled": False,
        "caches": [], "load_avg": load, "library_build_type": "release",
        "trainbench": {"version": _trainbench_version(), "git_commit": _git_commit(), "tool": "torch-peers"},
        "host": {"cpu_model": model, "cores": cores, "threads": os.cpu_count() or cores,
                 "python": platform.python_version()},
        "devices": devices,
        "cuda_unavailable_reason": "",
        "settings": dict(settings),
        "peaks": {},
        "torch": torch_info,
    }


def results_document(context: dict, rows: List[dict]) -> dict:
    pairs, withheld = make_pairs(rows)
    return {"schema": SCHEMA, "context": context, "benchmarks": rows, "pairs": pairs, "pairs_withheld": withheld}


def write_atomically(path: str, text: str) -> None:
    """A temporary file beside `path`, flushed, then renamed over it: a reader never sees half a file."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# ---- console -----------------------------------------------------------------------------------------------
def human_time(ns: float) -> str:
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}" if ns / scale < 100 else f"{ns / scale:.1f} {unit}"
    return f"{ns:.1f} ns"


def rate_text(row: dict) -> str:
    if row.get("disposition") != "passed":
        return ""
    if row.get("bound") == "compute" and row.get("flops"):
        return f"{row['tflop_per_s']:.2f} TFLOP/s"
    if row.get("bytes"):
        return f"{row['gb_per_s']:.2f} GB/s"
    return ""


def result_text(row: dict) -> str:
    disp = row["disposition"]
    if disp == "passed" and row.get("disturbed"):
        return "passed (disturbed)"
    if disp == "passed":
        return "passed (noisy)" if row.get("noisy") else "passed"
    return disp


def _label_of(name: str) -> str:
    return name.split("/", 3)[3] if name.count("/") >= 3 else ""


def render_console(rows: List[dict], pairs: List[dict], withheld: Sequence[dict] = ()) -> str:
    width = max([len("benchmark")] + [len(r["name"]) for r in rows])
    lines = [f"{'benchmark':<{width}}  {'result':<15} {'median':>10} {'+-CI':>7} {'rate':>16}  counters"]
    for r in rows:
        if r["disposition"] == "passed":
            half = (r["ci_high_ns"] - r["ci_low_ns"]) / (2 * r["median_ns"]) if r["median_ns"] > 0 else 0.0
            counters = "  ".join(f"{k}={v:g}" for k, v in r.get("counters", {}).items())
            lines.append(f"{r['name']:<{width}}  {result_text(r):<15} {human_time(r['median_ns']):>10} "
                         f"{half:>6.1%} {rate_text(r):>16}  {counters}")
        else:
            lines.append(f"{r['name']:<{width}}  {result_text(r):<15} {r.get('reason', '')}")
    if pairs or withheld:
        lines += ["", "Pairs: baseline time / improved time (> 1: the improved variant is faster)"]
        for p in pairs:
            lines.append(f"  {p['label']} [{_label_of(p['improved'])}]: {p['ratio']:.2f}x "
                         f"(95% CI {p['ci_low']:.2f}-{p['ci_high']:.2f})")
        for w in withheld:
            lines.append(f"  {w['label']} [{_label_of(w['improved'])}]: no ratio: {w['why']}")
    return "\n".join(lines) + "\n"


# ---- command line ----------------------------------------------------------------------------------------
EPILOG = """\
Each row is named stage/torch_cuda/variant/problem (--device cpu: stage/torch/...), the problem label
benchsuite's (`adamw/torch_cuda/fused/...` lines up with `adamw/cuda/fused/...`; with --device cpu
--benchsuite, `adamw/torch/fused/...` with `adamw/cpu/fused/...`), and says which row it stands beside
("mirrors": "cuda/fused"). Each is checked against a plain reference before it is timed (a wrong result
is `incorrect` and never timed). Timing: CUDA events (on the CPU a steady clock), warm-up, calls batched
so a sample lasts at least --min-time, the median of --repetitions samples with its interval. On the
CPU, samples during which other processes used more than 25% of all CPU time are taken again, as
benchsuite's (a row that stays loaded is `passed (disturbed)` and its pairs are withheld).

examples:
  scripts/torch-peers --out torch.json
  scripts/torch-peers --quick --filter 'adamw|attention'
  scripts/torch-peers --benchsuite build/benches/benchsuite --out torch.json   # benchsuite's problems
  scripts/torch-peers --device cpu --benchsuite build/benches/benchsuite --quick   # beside its CPU rows
  scripts/torch-peers --list

exit codes: 0 done, 1 a peer was incorrect or failed, 2 bad usage or no PyTorch with CUDA,
130 interrupted by Ctrl-C (SIGINT), 143 by SIGTERM (what was measured is still written)
"""


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < v <= 60:
        raise argparse.ArgumentTypeError(f"must be in (0, 60] seconds: {text!r}")
    return v


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Time the PyTorch way of trainbench's stages on the "
                                "problems benchsuite uses; write trainbench-results/1 rows (backend torch).",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--filter", metavar="REGEX", help="only the rows whose name matches (searched)")
    p.add_argument("--quick", action="store_true", help="benchsuite's --quick problems and shorter samples")
    p.add_argument("--repetitions", type=positive_int, default=REPETITIONS,
                   help=f"samples per row (default {REPETITIONS})")
    p.add_argument("--min-time", type=_seconds, metavar="S",
                   help=f"each sample lasts at least S seconds (default {MIN_SAMPLE_S:g}, "
                        f"--quick {QUICK_MIN_SAMPLE_S:g})")
    p.add_argument("--out", metavar="FILE", help="write the results (JSON, trainbench-results/1) atomically")
    p.add_argument("--benchsuite", metavar="PATH",
                   help="take the problems from PATH --list --format json --backend cuda (default: the copy of "
                        "the stages' axes in this script); with --device cpu, --backend cpu: mirror the CPU "
                        "variants, on their problems and labels")
    p.add_argument("--listing", metavar="FILE",
                   help="the problems to measure: a benchsuite --list --format json document (what benchsuite "
                        "--backend ...,torch hands over, its --axis and --quick applied); instead of --benchsuite")
    p.add_argument("--list", action="store_true", help="print the rows that would be measured and exit")
    p.add_argument("--device", choices=tuple(BACKENDS), default="cuda",
                   help="cuda (default; rows torch_cuda) or cpu (rows torch: the peers that are no GPU pattern, "
                        "on the CUDA problems, or with --benchsuite the CPU variants'; with --quick, a check of "
                        "the peers anywhere)")
    p.add_argument("--empty-ok", action="store_true",
                   help="a --filter that selects no row is no error: write an empty result (benchsuite "
                        "--backend cpu,torch passes its own filter, which may select only its rows)")
    return p


def _fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    use_device(args.device)
    given = args.benchsuite or args.listing
    mirror = "cpu" if args.device == "cpu" and given else "cuda"   # whose variants the rows mirror
    try:
        if args.benchsuite and args.listing:
            raise UsageError("--benchsuite and --listing both name the problems: give one")
        if args.listing:
            listing = read_listing(args.listing)
        else:
            listing = benchsuite_list(args.benchsuite, args.quick, backend=mirror) if args.benchsuite else None
        benches = select_benches(args.quick, args.filter, listing, mirror, args.empty_ok)
        if args.out and os.path.isdir(args.out):
            raise UsageError(f"--out {args.out} is a directory")
    except UsageError as e:
        return _fail(str(e))
    if args.list:
        for b in benches:
            print(b.name)
        return 0
    try:
        from . import torch_peer_cases as cases
        cases.use_device(args.device)
    except (ImportError, OSError) as e:
        return _fail(f"PyTorch is not importable ({e}); the peers need PyTorch and numpy "
                     "(the GPU node's python3 has them; elsewhere: python3 -m pip install torch numpy)")
    except UsageError as e:
        return _fail(str(e))

    min_sample_s = max(args.min_time or (QUICK_MIN_SAMPLE_S if args.quick else MIN_SAMPLE_S), CUDA_MIN_SAMPLE_S)
    index = 0 if args.device == "cuda" else None
    settings = {"mode": "hot", "repetitions": args.repetitions, "min_time_s": min_sample_s, "quick": args.quick,
                "noise_target": NOISE_TARGET, "backend": BACKEND, "filter": args.filter or "", "device": index,
                "mirrors": mirror,
                "problems_from": f"{args.benchsuite} --list --backend {mirror}" if args.benchsuite
                else f"the listing {args.listing}" if args.listing else "built-in copy of benchsuite's axes"}
    devices, torch_info = cases.device_context()
    context = make_context(devices, torch_info, settings)
    rows: List[dict] = []
    interrupted = False
    # Ctrl-C, or SIGTERM (`timeout`, a job's time limit, benchsuite passing on its own stop): the rows
    # measured are written. The first signal interrupts; later ones are ignored, so the writing is not.
    stopped_by: List[int] = []
    measuring = [True]

    def stop(signum, frame):
        stopped_by.append(signum)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if measuring[0]:
            raise KeyboardInterrupt

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for i, bench in enumerate(benches):
            outcome = cases.run_bench(bench, args.repetitions, min_sample_s)
            row = make_row(bench, outcome)
            rows.append(row)
            shown = human_time(row["median_ns"]) if outcome.disposition == "passed" else outcome.reason
            if outcome.disturbed:
                shown += f" (disturbed: {disturbance_text(row)} after {outcome.retaken} retakes)"
            elif outcome.retaken:
                held = "the GPU throttled" if outcome.throttled_share >= 0 else "other processes held the CPUs"
                shown += f" ({outcome.retaken} samples taken again: {held})"
            print(f"{PROG}: [{i + 1}/{len(benches)}] {bench.name}: {result_text(row)} {shown}", file=sys.stderr,
                  flush=True)
        measuring[0] = False
    except KeyboardInterrupt:
        interrupted = True
        print(f"{PROG}: interrupted after {len(rows)} of {len(benches)} rows", file=sys.stderr)
    try:
        doc = results_document(context, rows)
        sys.stdout.write(render_console(rows, doc["pairs"], doc["pairs_withheld"]))
        sys.stdout.flush()
        if args.out:
            try:
                write_atomically(args.out, json.dumps(doc, indent=1) + "\n")
            except OSError as e:
                return _fail(f"cannot write {args.out}: {e.strerror or e}")
            print(f"{PROG}: wrote {len(rows)} rows to {args.out}", file=sys.stderr)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if interrupted or stopped_by:
        return 128 + (stopped_by[0] if stopped_by else signal.SIGINT)
    return 1 if any(r["disposition"] in ("incorrect", "failed") for r in rows) else 0

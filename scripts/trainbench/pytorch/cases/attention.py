"""The attention stage done the PyTorch way (kernels/attention/): one case per PyTorch variant, checked against
a reference computed another way before it is timed."""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

from .. import case as base
from ..case import Case, Env, tolerance, Unsupported, Verdict, compare, first_line, on_gpu, synchronize, uniform
from ...errors import UsageError
from ..inputs import constant

# problem whose scores pass this is unsupported (the CUDA problem 4x16x4096x128 has 4 GiB of them), not swapped.
NAIVE_CPU_SCORES_BYTES = 1 << 30


def parse_shape(problem) -> tuple:
    """BATCHxHEADSxSEQxHEAD_DIM: the CUDA variants' `shape` axis, the CPU variants' `cpu_shape`."""
    text = problem["shape"] if "shape" in problem else problem["cpu_shape"]
    parts = text.split("x")
    if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise UsageError(f"attention shape {text!r} is not BATCHxHEADSxSEQxHEAD_DIM")
    return tuple(int(p) for p in parts)


class AttentionCase(Case):
    def __init__(self, bench, env: Env):
        p = bench.problem
        self.variant = bench.variant
        self.batch, self.heads, self.seq, self.dim = parse_shape(p)
        self.dtype_name = p["dtype"]
        scores = self.batch * self.heads * self.seq * self.seq * (2 if p["dtype"] == "bf16" else 4)
        if self.variant == "naive" and not on_gpu() and scores > NAIVE_CPU_SCORES_BYTES:
            raise Unsupported(f"the naive path's scores take {scores / 2**30:.3g} GiB (three such tensors at "
                              f"once); on the CPU it runs up to {NAIVE_CPU_SCORES_BYTES / 2**30:g} GiB")
        dtype = torch.bfloat16 if p["dtype"] == "bf16" else torch.float32
        self.causal = p["causal"] == "causal"
        shape = (self.batch, self.heads, self.seq, self.dim)
        self.q, self.k, self.v = (uniform(shape, int(constant(f"attention.seed_{s}")), dtype) for s in "qkv")
        self.scale = 1.0 / math.sqrt(self.dim)
        if self.variant == "naive":   # the causal mask built once at the sequence length (register_buffer)
            self.mask = torch.ones(self.seq, self.seq, dtype=torch.bool, device=base.DEVICE).triu_(1)
        if self.variant == "sdpa_flash":
            try:
                with self.scope():
                    self.call()
                synchronize()
            except RuntimeError as e:
                raise Unsupported(f"the FlashAttention backend refused it: {first_line(e)}") from None

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
        rows = torch.linspace(0, self.seq - 1, min(int(constant("attention.checked_rows")), self.seq), device=base.DEVICE)
        rows = rows.round().long().unique()
        q = self.q[:, :, rows, :].double()
        scores = (q @ self.k.double().transpose(-2, -1)) * self.scale
        if self.causal:
            later = torch.arange(self.seq, device=base.DEVICE)[None, :] > rows[:, None]
            scores = scores.masked_fill(later, float("-inf"))
        ref = torch.softmax(scores, dim=-1) @ self.v.double()
        return compare(out[:, :, rows, :], ref, tolerance(f"attention.tolerance_{self.dtype_name}"), "output (checked rows)")

"""The alloc stage done the PyTorch way (kernels/alloc/): one case per PyTorch variant, checked against
a reference computed another way before it is timed."""

from __future__ import annotations

from typing import List

import torch

from .. import case as base
from ..case import Case, Env, Unsupported, Verdict
ALLOC_CHECK_STEPS = 3


def alloc_probe_value(step: int, buffer: int) -> int:
    """The word a step writes into a buffer's probes (any value a wrong buffer would not hold)."""
    return (step * 1009 + buffer * 17 + 1) % 1000003


class AllocCase(Case):
    """A step's activations: `buffers` buffers of `buffer_bytes`, a fill of three probe words in each, one
    stack of all probes and their sum into a checksum; allocated per step with torch.empty (the caching
    allocator), the same with torch.cuda.empty_cache() after the step, or allocated once (reuse)."""

    def __init__(self, bench, env: Env):
        p = bench.problem
        self.variant = bench.variant
        self.count = int(p["buffers"])
        self.words = int(p["buffer_bytes"]) // 4
        if self.words < 3:
            raise Unsupported("a buffer needs three 4-byte probe words")
        self.stride = (self.words - 1) // 2   # probes at the first, the middle and the last (or last but one) word
        self.probes = torch.empty((self.count, 3), dtype=torch.int32, device=base.DEVICE)
        self.checksum = torch.zeros((), dtype=torch.int64, device=base.DEVICE)
        self.step = 0
        self.kept = [self._buffer() for _ in range(self.count)] if self.variant == "reuse" else None

    def _buffer(self) -> torch.Tensor:
        return torch.empty(self.words, dtype=torch.int32, device=base.DEVICE)

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

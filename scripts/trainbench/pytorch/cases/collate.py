"""The collate stage done the PyTorch way (kernels/collate/): one case per PyTorch variant, checked against
a reference computed another way before it is timed."""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
import torch

from .. import case as base
from ..case import Case, Env, Unsupported, Verdict
from ..inputs import constant, read_input

COLLATE_SEEDS = {"input_embedding": "collate.seed_input", "target_embedding": "collate.seed_target",
                 "tokens": "collate.seed_tokens"}   # each field's seed, by its constant's name


def collate_fields(problem: Dict[str, str]) -> List[Tuple[str, int, str]]:
    """(name, elements per sample, dtype) per field, in batch order (collate::Shape::fields)."""
    embed, tokens = int(problem.get("embed_dim", 0)), [("tokens", int(problem["seq_len"]), "int64")]
    if problem["layout"] != "text_pair":
        return tokens
    return [("input_embedding", embed, "float32"), ("target_embedding", embed, "float32")] + tokens


def _dataset(problem: Dict[str, str], env: Env) -> List[torch.Tensor]:
    """The dataset in pageable host memory, one tensor per field as a loaded dataset dict holds them. Its
    values are random, not the stage's generator's: a copy does not depend on them."""
    samples = int(problem["samples"])
    out = []
    for name, n, dtype in collate_fields(problem):
        def build(name=name, n=n, dtype=dtype):
            g = torch.Generator().manual_seed(int(constant(COLLATE_SEEDS[name])))
            if dtype == "int64":
                return torch.randint(0, int(constant("collate.vocab")), (samples, n), generator=g, dtype=torch.int64)
            return torch.rand((samples, n), generator=g, dtype=torch.float32) * 2 - 1
        out.append(env.get(("field", name, samples, n), build))
    return out


class CollateCase(Case):
    """A batch from a host dataset to the device, the epoch's shuffled order (the stage's permutation), one
    batch per call cycling through the epoch."""

    def __init__(self, bench, env: Env):
        p = bench.problem
        self.variant = bench.variant
        self.batch = int(p["batch"])
        samples = int(p["samples"])
        if samples < self.batch:
            raise Unsupported(f"{samples} samples hold no batch of {self.batch}")
        self.fields = collate_fields(p)
        self.data = _dataset(p, env)
        self.order = env.get(("order", samples, p["order"]), lambda: read_input(bench, "order").tolist())
        self.order_t = torch.tensor(self.order, dtype=torch.int64)
        self.batches = samples // self.batch
        self.k = 0
        self.calls = 0
        self.out: List[torch.Tensor] = []
        if self.variant == "pinned":   # two pinned batches and two device batches, field by field in each
            self.field_bytes = [self.batch * n * getattr(torch, d).itemsize for _, n, d in self.fields]
            nbytes = sum(self.field_bytes)
            self.host = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
            self.device = [torch.empty(nbytes, dtype=torch.uint8, device=base.DEVICE) for _ in range(2)]
            self.host_views = [self._views(s) for s in self.host]
            self.device_views = [self._views(s) for s in self.device]
            self.copied = [torch.cuda.Event(), torch.cuda.Event()]

    def _views(self, slab: torch.Tensor) -> List[torch.Tensor]:
        return [part.view(getattr(torch, d)).view(self.batch, n)
                for part, (_, n, d) in zip(slab.split(self.field_bytes), self.fields)]

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
                self.out = [torch.empty((self.batch, n), dtype=getattr(torch, d)) for _, n, d in self.fields]
            idx = self.order_t[k * self.batch:(k + 1) * self.batch]
            for field, out in zip(self.data, self.out):
                torch.index_select(field, 0, idx, out=out)
            return
        idx = self.order[k * self.batch:(k + 1) * self.batch]
        samples = [tuple(field[i].clone() for field in self.data) for i in idx]       # __getitem__
        stacked = [torch.stack([s[f] for s in samples]) for f in range(len(self.data))]   # default_collate
        if self.variant == "pin_memory":
            self.out = [t.pin_memory().to(base.DEVICE, non_blocking=True) for t in stacked]
        else:
            self.out = [t.to(base.DEVICE) for t in stacked]

    def check(self) -> Verdict:
        """The epoch's first batch, byte for byte, against numpy's fancy indexing of the host dataset."""
        self.k = 0
        self.call()
        idx = np.asarray(self.order[:self.batch], dtype=np.int64)
        for (name, _, _), field, got in zip(self.fields, self.data, self.out):
            want = torch.from_numpy(field.numpy()[idx]).to(base.DEVICE)
            if not torch.equal(got, want):
                bad = (got != want).reshape(-1)
                i = int(bad.nonzero()[0, 0])
                return Verdict(False, float(bad.sum()), f"{name}: {int(bad.sum())} elements differ, the first at "
                                                        f"sample {i // got.shape[1]} element {i % got.shape[1]}")
        return Verdict(True, 0.0)

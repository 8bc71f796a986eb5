"""The spmv stage done the PyTorch way (kernels/spmv/): one case per PyTorch variant, checked against
a reference computed another way before it is timed."""

from __future__ import annotations

import warnings

from typing import Optional

import torch

from .. import torch_case as base
from ..torch_case import Case, Env, Tolerance, Verdict, compare, first_line, merge, synchronize, uniform
from ..torch_generators import constant, laplacian_csr

SPMV_FP64_RTOL = 1e-13         # relative to sum_j |a_ij x_j|, the rounding scale of a row


def device_laplacian(graph: str, n: int, alpha: Optional[float] = None) -> dict:
    """The stage's A = I + alpha L (laplacian_csr) as a torch CSR tensor, int32 indices where torch takes them."""
    row_ptr, col, val = laplacian_csr(graph, n, alpha)
    crow_t, col_t = torch.from_numpy(row_ptr).to(base.DEVICE), torch.from_numpy(col).to(base.DEVICE)
    val_t = torch.from_numpy(val).to(base.DEVICE)
    notes = []
    with warnings.catch_warnings():   # "sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        matrix = torch.sparse_csr_tensor(crow_t, col_t, val_t, size=(n, n))
    try:
        torch.mv(matrix, torch.ones(n, dtype=torch.float64, device=base.DEVICE))
        synchronize()
    except RuntimeError as e:
        matrix = torch.sparse_csr_tensor(crow_t.long(), col_t.long(), val_t, size=(n, n))
        notes.append(f"int64 indices (torch refused int32: {first_line(e)}); the work model counts 4-byte ones")
    rows = torch.repeat_interleave(torch.arange(n, device=base.DEVICE), crow_t.long().diff())
    return {"matrix": matrix, "rows": rows, "col": col_t.long(), "val": val_t, "note": "; ".join(notes)}


class SpmvCase(Case):
    def __init__(self, bench, env: Env):
        p = bench.problem
        self.n = int(p["rows"])
        self.rhs = int(p["rhs"]) if bench.variant == "spmm_csr" else 0
        self.a = env.get(("laplacian", p["graph"], self.n), lambda: device_laplacian(p["graph"], self.n))
        self.note = self.a["note"]
        self.x = uniform((self.n, self.rhs) if self.rhs else (self.n,), int(constant("spmv.seed_x")), torch.float64)   # x, or a row-major block

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
            ref = torch.zeros(self.n, dtype=torch.float64, device=base.DEVICE).index_add_(0, self.a["rows"], terms)
            scale = torch.zeros_like(ref).index_add_(0, self.a["rows"], terms.abs())
            got = y if c is None else y[:, c]
            verdicts.append(compare(got, ref, Tolerance(0.0, SPMV_FP64_RTOL), "y" if c is None else f"y[:, {c}]",
                                    scale=scale))
        return merge(verdicts)

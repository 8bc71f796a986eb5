"""The spmv stage done the PyTorch way (kernels/spmv/): one case per PyTorch variant, checked against
a reference computed another way before it is timed."""

from __future__ import annotations

import warnings

import torch

from .. import case as base
from ..case import Case, Env, Tolerance, Verdict, compare, first_line, merge, synchronize, uniform
from ..inputs import constant, read_input

SPMV_FP64_RTOL = 1e-13         # relative to sum_j |a_ij x_j|, the rounding scale of a row


def device_laplacian(bench) -> dict:
    """The stage's A = I + alpha L (the row's inputs) as a torch CSR tensor, int32 indices where torch takes them."""
    n = int(bench.problem["rows"])
    crow_t, col_t, val_t = (torch.from_numpy(read_input(bench, k)).to(base.DEVICE) for k in ("row_ptr", "col", "val"))
    note = ""
    with warnings.catch_warnings():   # "sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        matrix = torch.sparse_csr_tensor(crow_t, col_t, val_t, size=(n, n))
    try:
        torch.mv(matrix, torch.ones(n, dtype=torch.float64, device=base.DEVICE))
        synchronize()
    except RuntimeError as e:
        matrix = torch.sparse_csr_tensor(crow_t.long(), col_t.long(), val_t, size=(n, n))
        note = f"int64 indices (torch refused int32: {first_line(e)}); the work model counts 4-byte ones"
    rows = torch.repeat_interleave(torch.arange(n, device=base.DEVICE), crow_t.long().diff())
    return {"matrix": matrix, "rows": rows, "col": col_t.long(), "val": val_t, "note": note}


def reference_matvec(a: dict, x: torch.Tensor):
    """A x in fp64 by a gather and scatter-add of the matrix's nonzeros (no sparse kernel), and sum_j |a_ij x_j|
    per row, the rounding scale of a row."""
    terms = a["val"] * x[a["col"]]
    ref = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device).index_add_(0, a["rows"], terms)
    return ref, torch.zeros_like(ref).index_add_(0, a["rows"], terms.abs())


class SpmvCase(Case):
    def __init__(self, bench, env: Env):
        p = bench.problem
        self.n = int(p["rows"])
        self.rhs = int(p["rhs"]) if bench.variant == "spmm_csr" else 0
        self.a = env.get(("laplacian", p["graph"], self.n), lambda: device_laplacian(bench))
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
            ref, scale = reference_matvec(self.a, self.x if c is None else self.x[:, c])
            got = y if c is None else y[:, c]
            verdicts.append(compare(got, ref, Tolerance(0.0, SPMV_FP64_RTOL), "y" if c is None else f"y[:, {c}]",
                                    scale=scale))
        return merge(verdicts)

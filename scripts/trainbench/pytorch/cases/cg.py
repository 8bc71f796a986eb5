"""The cg stage done the PyTorch way (kernels/cg/): one case per PyTorch variant, checked against
a reference computed another way before it is timed."""

from __future__ import annotations

import math
from typing import Dict

import torch

from .. import case as base
from ..case import Case, Env, Verdict
from .spmv import device_laplacian, reference_matvec
from ..inputs import constant, read_input


class CgCase(Case):
    """CG on A = I + alpha L over the stage's window: one call solves b_1..b_16 in turn, the cache set back to
    b_0's solution first (warm and lazy starts), so every call does the same work (cg.h). fp64 throughout.

    host_checked*: the loop as PyTorch code writes it, `while rr.item() > limit`: one host read per iteration
    (and one of ||b||^2 per solve, the limit being a Python float). device_loop*: blocks of cg_check_every
    iterations queued without a read, a solve that converged inside a block kept where it was by
    torch.where(active, ..., 0), and one .item() of the flag per block; its ||b||^2 stays on the device."""

    def __init__(self, bench, env: Env):
        p = bench.problem
        variant = bench.variant
        self.loop = variant.startswith("device_loop")
        self.start = "lazy" if variant.endswith("_lazy") else "warm" if variant.endswith("_warm") else "cold"
        self.n = int(p["rows"])
        alpha = float(p["alpha"])
        self.a = env.get(("laplacian", p["graph"], self.n, alpha), lambda: device_laplacian(bench))
        self.note = self.a["note"]
        self.rhs = env.get(("cg_rhs", self.n, p["drift"]), lambda: read_input(bench, "rhs"))
        self.b = torch.from_numpy(self.rhs).to(base.DEVICE, copy=True)   # what the solver reads; the check, self.rhs
        self.x = torch.zeros(self.n, dtype=torch.float64, device=base.DEVICE)
        self.r, self.p = torch.zeros_like(self.x), torch.zeros_like(self.x)
        self.rr = self.bb = None
        self.tally = {"solves": 0, "skips": 0, "iterations": 0, "matvecs": 0, "reads": 0}
        self.device_iterations = torch.zeros((), dtype=torch.int64, device=base.DEVICE)   # the device loop's count
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
            if self.start == "lazy" and self._read(self.rr <= constant("cg.lazy_tol") ** 2 * self.bb):
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
            limit = constant("cg.tol") ** 2 * self.bb
            for _ in range(0, int(constant("cg.max_iterations")) + 1, int(constant("cg.check_every"))):
                for _ in range(int(constant("cg.check_every"))):
                    self._iteration(limit)
                if not self._read(self.rr > limit):
                    return
            raise RuntimeError("CG did not converge within the iteration limit")
        limit = constant("cg.tol") ** 2 * self._read(self.bb)
        for _ in range(int(constant("cg.max_iterations")) + 1):
            if self._read(self.rr) <= limit:
                return
            self._iteration(limit)
            self.tally["iterations"] += 1
        raise RuntimeError("CG did not converge within the iteration limit")

    def call(self):
        if self.cache is not None:
            self.x.copy_(self.cache)
        for t in range(1, int(constant("cg.window")) + 1):
            self._step(t)

    def check(self) -> Verdict:
        """One window replayed solve by solve: each solution's true relative residual ||b - A x|| / ||b||,
        from a gather and scatter-add of the matrix's nonzeros, below the gate's tolerance for a skipped solve
        and the solver's for a solved one (cg::check_solve); only the lazy start may skip."""
        if self.cache is not None:
            self.x.copy_(self.cache)
        self._reset_tally()
        worst = 0.0
        for t in range(1, int(constant("cg.window")) + 1):
            skipped = self._step(t)
            if skipped and self.start != "lazy":
                return Verdict(False, worst, f"step {t} was skipped by a solver without the gate")
            b = torch.from_numpy(self.rhs[t]).to(base.DEVICE)
            ax, _ = reference_matvec(self.a, self.x)
            residual = float((b - ax).norm() / b.norm())
            limit = (constant("cg.lazy_tol") if skipped else constant("cg.tol")) + constant("cg.residual_atol")
            worst = max(worst, residual if math.isfinite(residual) else math.inf)
            if not residual <= limit:
                return Verdict(False, worst, f"step {t} ({'skipped by the gate' if skipped else 'solved'}): true "
                                             f"relative residual {residual:.3g} above {limit:.3g}")
        if self.loop:
            self.tally["iterations"] = int(self.device_iterations.item())
        self.checked = dict(self.tally)
        return Verdict(True, worst)

    def counters(self) -> Dict[str, float]:
        """What the checked window did (every call repeats it): skips, iterations, matvecs and host reads per
        solve."""
        t = getattr(self, "checked", None)
        if not t or not t["solves"]:
            return {}
        solves = float(t["solves"])
        return {"skip_rate": t["skips"] / solves, "iterations_per_solve": t["iterations"] / solves,
                "matvecs_per_solve": t["matvecs"] / solves, "reads_per_solve": t["reads"] / solves}

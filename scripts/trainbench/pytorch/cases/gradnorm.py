"""The gradnorm stage done the PyTorch way (kernels/gradnorm/): one case per PyTorch variant, checked against
a reference computed another way before it is timed."""

from __future__ import annotations

import math

import torch

from ..case import Case, Env, tolerance, Tolerance, Unsupported, Verdict, compare, merge, uniform_set
from ..inputs import constant, read_input


class GradNormCase(Case):
    """torch.nn.utils.clip_grad_norm_(max_norm=1.0) over the adamw peer's gradients, in place, one call per
    call as the stage's: no copy is restored between calls (the stage clips its gradients again each call),
    and every call does the same work, because clip_grad_norm_ multiplies by the clamped factor even when it
    is 1 (no branch, no sync). The timed region is the clip_grad_norm_ call (and the .item() of foreach_item)."""

    def __init__(self, bench, env: Env):
        p = bench.problem
        if p["dtype"] != "fp32":
            raise Unsupported("torch keeps the gradients in the parameters' dtype and returns a bf16 norm of bf16 "
                              "ones; the stage's bf16 rows take the norm in fp32")
        self.variant = bench.variant
        self.params = []
        # the adamw peer's gradients: its parameter set, from its gradient seed
        for g in uniform_set(read_input(bench, "tensor_sizes").tolist(), int(constant("adamw.seed_grad"))):
            param = torch.nn.Parameter(torch.empty_like(g))   # its values are never read
            param.grad = g
            self.params.append(param)

    def call(self):
        norm = torch.nn.utils.clip_grad_norm_(self.params, constant("gradnorm.clip_max_norm"), foreach=self.variant != "per_tensor")
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
        coef = min(constant("gradnorm.clip_max_norm") / (ref_norm + constant("gradnorm.clip_norm_eps")), 1.0)
        verdicts = [compare(torch.tensor([norm], dtype=torch.float64), torch.tensor([ref_norm], dtype=torch.float64),
                            tolerance("tolerance.fp32"), "total norm")]
        scale = max(float(g.abs().max()) for g in before if g.numel()) * coef
        fp32 = tolerance("tolerance.fp32")
        tol = Tolerance(fp32.atol * scale, fp32.rtol)
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

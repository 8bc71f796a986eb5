"""The adamw stage done the PyTorch way (kernels/adamw/): one case per PyTorch variant, checked against
a reference computed another way before it is timed."""

from __future__ import annotations

import math

import torch

from ..case import Case, Env, tolerance, Unsupported, Verdict, compare, merge, uniform_set
from ..inputs import constant, read_input


def adamw_hyperparameters() -> dict:
    """torch.optim.AdamW's keyword arguments: the stage's (which are torch's defaults)."""
    return {"lr": constant("adamw.lr"), "betas": (constant("adamw.beta1"), constant("adamw.beta2")),
            "eps": constant("adamw.eps"), "weight_decay": constant("adamw.weight_decay")}


class AdamWCase(Case):
    """torch.optim.AdamW over the stage's parameter set (param_set.cpp's sizes), one step() per call."""

    KINDS = {"fused": {"fused": True}, "foreach": {"foreach": True, "fused": False},
             "per_tensor": {"foreach": False, "fused": False}}

    def __init__(self, bench, env: Env):
        p = bench.problem
        if p["dtype"] != "fp32":
            raise Unsupported("torch keeps AdamW's moments in the parameters' dtype; the stage's bf16 keeps them fp32")
        sizes = read_input(bench, "tensor_sizes").tolist()
        self.params = [torch.nn.Parameter(t) for t in uniform_set(sizes, int(constant("adamw.seed_param")))]
        for param, grad in zip(self.params, uniform_set(sizes, int(constant("adamw.seed_grad")))):
            param.grad = grad   # fixed across steps, as the stage's
        self.opt = torch.optim.AdamW(self.params, **adamw_hyperparameters(), **self.KINDS[bench.variant])

    def call(self):
        self.opt.step()

    def check(self) -> Verdict:
        """The first step from zero moments against the update written out in fp64."""
        before = [q.detach().double() for q in self.params]
        self.opt.step()
        h = adamw_hyperparameters()
        lr, (b1, b2), eps, wd = h["lr"], h["betas"], h["eps"], h["weight_decay"]
        verdicts = []
        for i, (q, p0) in enumerate(zip(self.params, before)):
            g = q.grad.double()
            m, v = (1 - b1) * g, (1 - b2) * g * g
            ref = p0 * (1 - lr * wd) - (lr / (1 - b1)) * m / (v.sqrt() / math.sqrt(1 - b2) + eps)
            verdicts.append(compare(q, ref, tolerance("tolerance.fp32"), f"parameter tensor {i}"))
        return merge(verdicts)

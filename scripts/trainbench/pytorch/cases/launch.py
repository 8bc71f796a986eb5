"""The launch stage done the PyTorch way (kernels/launch/): one case per PyTorch variant, checked against
a reference computed another way before it is timed."""

from __future__ import annotations

from typing import Dict

import torch

from ..case import Case, Env, Tolerance, Verdict, compare, uniform
from ..inputs import constant, read_input


class LaunchCase(Case):
    """The stage's window of steps x kernels_per_step small kernels, each one in-place lerp_ over
    `elements` floats: eager, or captured once in a CUDA graph and replayed."""

    def __init__(self, bench, env: Env):
        p = bench.problem
        buffers = int(constant("launch.state_buffers"))
        # the stage's window (launch::build_window): per kernel dst, src and its coefficient a; lerp_ by 1 - a
        self.window = [(int(d), int(s), 1.0 - a) for d, s, a in read_input(bench, "window").tolist()]
        self.initial = uniform((buffers, int(p["elements"])), int(constant("launch.seed_state")))
        self.state = self.initial.clone()
        self.buffers = [self.state[b] for b in range(buffers)]
        self.graph = None
        if bench.variant == "graph":
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

    def per_unit(self) -> Dict[str, float]:
        return {"us_per_kernel": float(len(self.window))}

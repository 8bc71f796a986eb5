"""The hostsync stage done the PyTorch way (kernels/hostsync/): one case per PyTorch variant, checked against
a reference computed another way before it is timed."""

from __future__ import annotations

from typing import Dict, List

import torch

from .. import case as base
from ..case import Case, Env, tolerance, Unsupported, Verdict, compare, merge, on_gpu
from ..inputs import constant, read_input


class HostsyncCase(Case):
    """`steps` steps of a training loop per call, each a copy of the step's predictions (the forward's
    stand-in: the stage regenerates them in a kernel), the loss and two metrics as torch ops, and their
    accumulation into fp64 running sums on the device; the variants differ only in how the host reads. The
    predictions of steps 0..steps-1 are precomputed (the stage's prediction(step, i)); every call runs those
    steps, while the running sums go on growing across calls as the stage's do."""

    def __init__(self, bench, env: Env):
        p = bench.problem
        self.variant = bench.variant
        self.steps, self.elements = int(p["steps"]), int(p["elements"])
        self.predictions, self.targets = (torch.from_numpy(read_input(bench, k)).to(base.DEVICE)
                                          for k in ("predictions", "targets"))
        self.want = read_input(bench, "metric_sums").tolist()   # hostsync::metric_sums: the reference
        self.prediction = torch.empty(self.elements, dtype=torch.float32, device=base.DEVICE)
        self.sums = torch.zeros(3, dtype=torch.float64, device=base.DEVICE)
        self.host = [0.0, 0.0, 0.0]          # what the host has read: the loss summed, or the last running sums
        self.steps_run = 0
        self.async_slots = int(constant("hostsync.async_slots"))
        if self.variant == "async_pinned":
            if not on_gpu():
                raise Unsupported("async_pinned copies into pinned memory behind CUDA events: a GPU pattern")
            self.slots = torch.empty(self.async_slots, dtype=torch.float32, pin_memory=True)
            self.events = [torch.cuda.Event() for _ in range(self.async_slots)]
            self.ring: List[int] = []          # slots in flight, oldest first
            self.pushed = 0                     # slots are claimed in turn: the ring is first in, first out
            self.stalls = 0

    def _step(self, s: int) -> torch.Tensor:
        pred = self.prediction
        pred.copy_(self.predictions[s])                                 # forward
        error = pred - self.targets
        metrics = torch.stack([(error * error).mean(), error.abs().mean(), (pred * pred).mean()])   # loss
        self.sums += metrics                                            # total_loss += loss.detach()
        return metrics

    def _harvest(self, wait_for_oldest: bool) -> None:
        while self.ring and (wait_for_oldest or self.events[self.ring[0]].query()):
            slot = self.ring.pop(0)
            if wait_for_oldest:
                self.events[slot].synchronize()
                self.stalls += 1
                wait_for_oldest = False
            self.host[0] += float(self.slots[slot])

    def call(self):
        for s in range(self.steps):
            metrics = self._step(s)
            if self.variant == "item_every_step":
                self.host[0] += metrics[0].item()
            elif self.variant == "async_pinned":
                self._harvest(False)
                if len(self.ring) == self.async_slots:
                    self._harvest(True)
                slot = self.pushed % self.async_slots
                self.pushed += 1
                self.slots[slot].copy_(metrics[0], non_blocking=True)
                self.events[slot].record()
                self.ring.append(slot)
        self.steps_run += self.steps
        if self.variant == "sync_every_n":
            self.host[0] = self.sums[0].item()
        elif self.variant == "metrics_separate":
            self.host = [self.sums[m].item() for m in range(3)]
        elif self.variant == "metrics_batched":
            self.host = self.sums.tolist()

    def check(self) -> Verdict:
        """The first call's N steps: the device's running sums, and what the host read of them (the loss
        summed step by step, or the last read of the sums), against hostsync::metric_sums in fp64 within fp32's
        tolerance (hostsync::check_sums)."""
        self.call()
        if self.variant == "async_pinned":
            torch.cuda.synchronize()
            self._harvest(False)
            self.stalls = self.steps_run = 0   # the counters describe the timed calls
        names = ("loss", "mean |error|", "mean prediction^2")
        verdicts = [compare(self.sums, torch.tensor(self.want, dtype=torch.float64), tolerance("tolerance.fp32"),
                            f"device running sums after {self.steps} steps")]
        read = {"no_reads": 0, "metrics_separate": 3, "metrics_batched": 3}.get(self.variant, 1)
        if read:
            verdicts.append(compare(torch.tensor(self.host[:read], dtype=torch.float64),
                                    torch.tensor(self.want[:read], dtype=torch.float64), tolerance("tolerance.fp32"),
                                    "what the host read (" + ", ".join(names[:read]) + ")"))
        return merge(verdicts)

    def counters(self) -> Dict[str, float]:
        if self.variant == "async_pinned" and self.steps_run:
            return {"stalls_per_step": self.stalls / self.steps_run}
        return {}

    def per_unit(self) -> Dict[str, float]:
        return {"us_per_step": float(self.steps)}

"""The step stage done the PyTorch way (kernels/step/): the twin of the training step (step.py), built from
the workload as the C++ step resolved it, checked as the C++ step checks itself before it is timed, and timed
part by part after its samples, with the names the C++ step's row gives its parts."""

from __future__ import annotations

import statistics
from typing import Dict

import torch

from .. import case as base
from ...errors import UsageError
from ..case import Case, Env, Tolerance, Unsupported, Verdict, compare
from ..inputs import read_document
from ..step import STEP_PARTS, PartClock, TrainingStep

# Profiled steps after the samples, the parts the median of theirs: trainer.h's observe() takes as many.
PROFILED_STEPS = 3


class StepCase(Case):
    """One call: one optimizer step of the twin (every micro-batch, clipping, AdamW, the logging policy's
    reads), float32 on the device; bf16 autocast, SDPA and CUDA graphs where the workload's switches say."""

    def __init__(self, bench, env: Env):
        doc = read_document(bench, "step")   # benchsuite's: {"resolved", "reference"}
        self.reference = doc["reference"]
        try:
            self.twin = TrainingStep(doc["resolved"], dtype=torch.float32, device=base.DEVICE)
        except UsageError as e:   # a switch the twin cannot run here (CUDA graphs on the CPU, ...)
            raise Unsupported(str(e)) from None

    def call(self):
        self.twin.step()

    def check(self) -> Verdict:
        """The first step's first sequence: its dataset sample is the C++ trainer's, and its per-token losses
        are within the step's tolerance (runtime/tolerance.h step_fp32, step_bf16 with bf16 matmuls) of the
        C++ forward in double (step::reference_losses): what check_first_losses holds the C++ step to."""
        first = self.twin.step(record_first=True)
        sample = first.micro_batches[0][0]
        if sample != int(self.reference["sample"]):
            return Verdict(False, float("inf"), f"the first micro-batch starts with dataset sample {sample}, the C++ "
                                                f"step's with {self.reference['sample']}: the twin's data order differs")
        want = torch.tensor(self.reference["losses"], dtype=torch.float64)
        tol = Tolerance(float(self.reference["atol"]), float(self.reference["rtol"]))
        return compare(first.first_losses, want, tol, f"per-token loss of sample {sample}")

    def counters(self) -> Dict[str, float]:
        """Per part of a step, in ns (data_ns, forward_ns, ... as the C++ row's): the median over
        PROFILED_STEPS steps marked part by part after the samples, so the samples run unmarked. The
        propagator's solves are solver_ns, not the forward's or backward's."""
        profiled = []
        for _ in range(PROFILED_STEPS):
            clock = PartClock(base.DEVICE)
            self.twin.step(clock=clock)
            profiled.append(clock.seconds())
        return {f"{part}_ns": statistics.median(p.get(part, 0.0) for p in profiled) * 1e9 for part in STEP_PARTS}

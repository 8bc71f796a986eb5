"""scripts/torch-peers: the PyTorch way of doing trainbench's stages, measured beside benchsuite's rows.

benchsuite --backend cpu,torch (or cuda,torch) hands this script its `--list --format json` document
(`--listing`; --axis, --quick and --filter applied), whose "torch" section names the PyTorch rows that stand
beside the selected rows (`adamw/torch/fused/<label>` beside `adamw/cpu/fused/<label>`, each with the inputs it
reads, drawn by the stages' own generators) and whose "constants" are the stages' seeds and tolerances. For
each PyTorch row the stage's case (torch_cases) builds its tensors (torch_inputs), runs the PyTorch code,
checks it against its reference, and times it. What it writes is raw: per row the samples, the check's error
and what it read of the machine at the samples' ends (`trainbench-torch-samples/1`). benchsuite credits each
row with the work of the row it mirrors and computes the summaries, disturbance, % of peak and the pairs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from .argtypes import positive_int, seconds_up_to
from .atomic import write_atomically
from .errors import UsageError
from .torch_inputs import use_constants

SAMPLES_SCHEMA = "trainbench-torch-samples/1"   # benches/torch_rows.h torch_samples_schema
PROG = "torch-peers"
REPETITIONS = 10
MIN_SAMPLE_S = 0.05            # a sample lasts at least this long (benchsuite passes its --min-time)
QUICK_MIN_SAMPLE_S = 0.01
CUDA_MIN_SAMPLE_S = 100e-6     # a sample is never shorter (CUDA events resolve ~0.5 us)


@dataclass(frozen=True)
class Bench:
    """One PyTorch row to measure, as benchsuite's listing names it ("torch" rows: benches/torch_rows.cpp
    torch_benches): a PyTorch variant beside one selected row, at that row's problem."""

    name: str                   # "adamw/torch/fused/params=10000000,tensors=200,dtype=fp32"
    stage: str
    variant: str                # the PyTorch variant: which case of the stage's module runs
    label: str                  # the mirrored row's problem label
    problem: Dict[str, str]     # its axes, and on a CPU variant's problem what the variant implies
    mirrors: str                # the benchsuite row's backend/variant it stands beside: "cpu/fused"
    inputs: Dict[str, dict] = field(default_factory=dict)   # name -> {file, dtype, shape} (torch_inputs.read_input)
    inputs_dir: str = ""


# ---- the listing ------------------------------------------------------------------------------------------
def read_listing(path: str) -> dict:
    """A benchsuite --list --format json document from a file (benchsuite --backend ...,torch writes one)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise UsageError(f"--listing {path}: cannot read ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"--listing {path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, dict) or doc.get("schema") != "trainbench-list/1":
        raise UsageError(f"--listing {path}: not a benchsuite --list --format json document (schema trainbench-list/1)")
    return doc


def select_benches(listing: dict, device: str) -> List[Bench]:
    """The listing's PyTorch rows; a UsageError when it has none for `device` (a listing made without
    --backend ...,torch, or for the other device)."""
    torch_rows = listing.get("torch")
    if not isinstance(torch_rows, dict) or not isinstance(torch_rows.get("rows"), list):
        raise UsageError("the listing has no PyTorch rows: make it with benchsuite --backend cpu,torch (or cuda,torch) "
                         "--list --format json")
    if torch_rows.get("device") != device:
        raise UsageError(f"the listing's PyTorch rows are for --device {torch_rows.get('device')}, not {device}")
    try:
        return [Bench(str(r["name"]), str(r["stage"]), str(r["variant"]), str(r["label"]),
                      {str(k): str(v) for k, v in r["problem"].items()}, str(r["mirrors"]), dict(r.get("inputs", {})),
                      str(torch_rows.get("inputs_dir", ""))) for r in torch_rows["rows"]]
    except (KeyError, TypeError, AttributeError) as e:
        raise UsageError(f"the listing's PyTorch rows are malformed ({type(e).__name__}: {e})") from None


def samples_record(bench: Bench, outcome) -> dict:
    """What one row measured (a torch_case.Outcome), raw: benchsuite derives the rest."""
    finite = outcome.max_error is not None and math.isfinite(outcome.max_error)
    record = {"stage": bench.stage, "variant": bench.variant, "label": bench.label, "problem": dict(bench.problem),
              "mirrors": bench.mirrors, "disposition": outcome.disposition, "reason": outcome.reason,
              "max_error": outcome.max_error if finite else None, **({"note": outcome.note} if outcome.note else {})}
    if outcome.disposition == "passed":
        record.update({"batch": outcome.batch, "samples_ns": list(outcome.samples_ns), "counters": outcome.counters,
                       "per_unit": outcome.per_unit, "watch": outcome.watch})
    return record


# ---- command line ----------------------------------------------------------------------------------------
EPILOG = """\
benchsuite runs this script: `benchsuite --backend cpu,torch` (or cuda,torch) adds the PyTorch rows, each
named stage/torch/variant/problem (on a GPU stage/torch_cuda/...) beside the row it mirrors, to its own
results, with the PyTorch pairs and the cross pairs. Each row is checked against a plain reference before
it is timed (a wrong result is `incorrect` and never timed). Timing: CUDA events (on the CPU a steady clock),
warm-up, calls batched so that a sample lasts at least --min-time. On the CPU, samples during which other
processes used more than 25% of all CPU time are taken again by benchsuite, as its own.

examples:
  benchsuite --backend cpu,torch --quick --filter adamw
  benchsuite --backend cpu,torch --quick --list --format json | benchsuite --torch-inputs /tmp/in > list.json
  scripts/torch-peers --device cpu --listing list.json --out samples.json

exit codes: 0 done, 1 a peer was incorrect or failed, 2 bad usage or no PyTorch,
130 interrupted by Ctrl-C (SIGINT), 143 by SIGTERM (what was measured is still written)
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Measure the PyTorch way of trainbench's stages beside the "
                                "rows of a benchsuite listing; write their samples (trainbench-torch-samples/1).",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listing", metavar="FILE", required=True,
                   help="the rows to measure: a benchsuite --backend ...,torch --list --format json document")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda (default; the listing's cuda rows) or cpu (its cpu rows; no GPU pattern)")
    p.add_argument("--quick", action="store_true", help=f"shorter samples ({QUICK_MIN_SAMPLE_S:g} s)")
    p.add_argument("--repetitions", type=positive_int, default=REPETITIONS,
                   help=f"samples per row (default {REPETITIONS})")
    p.add_argument("--min-time", type=seconds_up_to(60), metavar="S",
                   help=f"each sample lasts at least S seconds (default {MIN_SAMPLE_S:g})")
    p.add_argument("--out", metavar="FILE", help="write the samples (JSON) atomically")
    p.add_argument("--list", action="store_true", help="print the rows that would be measured and exit")
    return p


def _fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        listing = read_listing(args.listing)
        benches = select_benches(listing, args.device)
        if not args.list and not isinstance(listing.get("constants"), dict):
            raise UsageError(f"--listing {args.listing} carries no generator constants (a benchsuite older than "
                             "this script wrote it): the inputs cannot be built as the stages build theirs")
        use_constants(listing.get("constants") or {})
        if args.out and os.path.isdir(args.out):
            raise UsageError(f"--out {args.out} is a directory")
    except UsageError as e:
        return _fail(str(e))
    if args.list:
        for b in benches:
            print(b.name)
        return 0
    try:
        from . import torch_case
        from .torch_cases import CASES
        torch_case.use_device(args.device)
    except (ImportError, OSError) as e:
        return _fail(f"PyTorch is not importable ({e}); the peers need PyTorch and numpy "
                     "(scripts/install-deps --torch, or python3 -m pip install torch numpy)")
    except UsageError as e:
        return _fail(str(e))

    min_sample_s = max(args.min_time or (QUICK_MIN_SAMPLE_S if args.quick else MIN_SAMPLE_S), CUDA_MIN_SAMPLE_S)
    torch_info = torch_case.torch_context()
    records: List[dict] = []
    # Ctrl-C, or SIGTERM (`timeout`, a job's time limit, benchsuite passing on its own stop): the rows
    # measured are written. The first signal interrupts; later ones are ignored, so the writing is not.
    stopped_by: List[int] = []

    def stop(signum, frame):
        stopped_by.append(signum)
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for i, bench in enumerate(benches):
            outcome = torch_case.run_bench(CASES[bench.stage], bench, args.repetitions, min_sample_s)
            records.append(samples_record(bench, outcome))
            said = (outcome.reason or f"{len(outcome.samples_ns)} samples of {outcome.batch} calls") + \
                (f"; {outcome.note}" if outcome.note else "")
            print(f"{PROG}: [{i + 1}/{len(benches)}] {bench.name}: {outcome.disposition}: {said}",
                  file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted after {len(records)} of {len(benches)} rows", file=sys.stderr)
    for s in previous:
        signal.signal(s, signal.SIG_IGN)
    try:
        if args.out:
            doc = {"schema": SAMPLES_SCHEMA, "device": args.device, "torch": torch_info, "rows": records}
            try:
                write_atomically(args.out, (json.dumps(doc, indent=1) + "\n").encode())
            except OSError as e:
                return _fail(f"cannot write {args.out}: {e.strerror or e}")
            print(f"{PROG}: wrote {len(records)} rows to {args.out}", file=sys.stderr)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if stopped_by:
        return 128 + stopped_by[0]
    return 1 if any(r["disposition"] in ("incorrect", "failed") for r in records) else 0

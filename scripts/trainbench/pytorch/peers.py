"""scripts/torch-peers: the PyTorch way of doing trainbench's stages, measured beside benchsuite's rows.

benchsuite --backend cpu,torch (or cuda,torch) starts this script once per run with its `--list --format json`
document (`--listing`; --axis, --quick and --filter applied), whose "torch" section names the PyTorch rows that
stand beside the selected rows (`adamw/torch/fused/<label>` beside `adamw/cpu/fused/<label>`, each with the inputs
it reads, drawn by the stages' own generators) and whose "constants" are the stages' seeds and tolerances. The
script then serves benchsuite's requests, one JSON object a line on its stdin, one answer a line on its stdout
(`--serve`, protocol trainbench-torch-serve/1): open a row (its case, cases/, builds its tensors, runs the
PyTorch code and checks it against its reference), time n calls of it, say what it counted, close it. benchsuite
measures the PyTorch rows as its own: in rounds with the rows they are compared with, watching the machine,
taking disturbed samples again, and computing the summaries, % of peak and the pairs
(benches/torch_rows.cpp).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, TextIO

from .conversation import answer, converse
from ..errors import UsageError
from .inputs import use_constants

SERVE_PROTOCOL = "trainbench-torch-serve/1"   # benches/torch_rows.h torch_serve_protocol
PROG = "torch-peers"


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
    inputs: Dict[str, dict] = field(default_factory=dict)   # name -> {file, dtype, shape} (inputs.read_input)
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


# ---- serving benchsuite ------------------------------------------------------------------------------------
def serve(benches: List[Bench], requests: TextIO, answers: TextIO) -> int:
    """Answers benchsuite's requests until its end of the conversation closes: {"op": "open" | "time" | "counters"
    | "close", "row": NAME, "calls": N}. A request that fails is answered {"error": ...}; the script goes on."""
    from . import case as torch_case
    from .cases import CASES

    by_name = {b.name: b for b in benches}
    opened: Dict[str, object] = {}

    def handle(request: dict) -> dict:
        op, name = request.get("op"), request.get("row")
        if op not in ("open", "time", "counters", "close"):
            return {"error": f"unknown op {op!r}"}
        if op == "open":
            if name not in by_name:
                return {"error": f"no PyTorch row {name!r} in the listing"}
            case, said = torch_case.open_case(CASES[by_name[name].stage], by_name[name])
            if case is not None:
                opened[name] = case
            print(f"{PROG}: {name}: {said['disposition']}" + (f": {said['reason']}" if said["reason"] else "") +
                  (f" ({said['note']})" if said.get("note") else ""), file=sys.stderr, flush=True)
            return said
        if name not in opened:
            return {"error": f"row {name!r} is not open"}
        case = opened[name]
        if op == "time":
            calls = request.get("calls")
            if not isinstance(calls, int) or calls < 0:
                return {"error": f"'calls' must be a count, not {calls!r}"}
            return {"seconds": torch_case.time_calls(case, calls)}
        if op == "counters":
            return {"counters": case.counters(), "per_unit": case.per_unit()}
        torch_case.close_case(opened.pop(name))
        return {}

    answer(answers, {"protocol": SERVE_PROTOCOL, "torch": torch_case.torch_context()})
    return converse(requests, answers, handle, torch_case.describe_failure)


# ---- command line ----------------------------------------------------------------------------------------
EPILOG = """\
benchsuite runs this script: `benchsuite --backend cpu,torch` (or cuda,torch) adds the PyTorch rows, each
named stage/torch/variant/problem (on a GPU stage/torch_cuda/...) beside the row it mirrors, to its own
results, measured in rounds with the rows they are compared with, with the PyTorch pairs and the cross pairs.
Each row is checked against a plain reference before it is timed (a wrong result is `incorrect` and never
timed). Timing: CUDA events (on the CPU a steady clock) around the calls benchsuite asks for.

examples:
  benchsuite --backend cpu,torch --quick --filter adamw
  benchsuite --backend cpu,torch --quick --list --format json | benchsuite --torch-inputs /tmp/in > list.json
  scripts/torch-peers --device cpu --listing list.json --list

exit codes: 0 done (benchsuite closed the conversation), 2 bad usage or no PyTorch
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Measure the PyTorch way of trainbench's stages beside the "
                                "rows of a benchsuite listing, as benchsuite asks (--serve).",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listing", metavar="FILE", required=True,
                   help="the rows to measure: a benchsuite --backend ...,torch --list --format json document")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda (default; the listing's cuda rows) or cpu (its cpu rows; no GPU pattern)")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--serve", action="store_true",
                      help=f"answer benchsuite's requests on stdin and stdout ({SERVE_PROTOCOL})")
    mode.add_argument("--list", action="store_true", help="print the rows of the listing and exit")
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
    except UsageError as e:
        return _fail(str(e))
    if args.list:
        for b in benches:
            print(b.name)
        return 0
    # The conversation is benchsuite's: a stop request (Ctrl-C, or a closed terminal's SIGHUP, reaches the whole
    # group) ends it when benchsuite closes it, after the sample in hand; a benchsuite killed outright (kill -9)
    # takes this process with it. What a case prints goes to stderr, not into the conversation.
    from .conversation import die_with_parent
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        from . import case as torch_case
        torch_case.use_device(args.device)
    except (ImportError, OSError) as e:
        return _fail(f"PyTorch is not importable ({e}); the peers need PyTorch and numpy "
                     "(scripts/install-deps --torch, or python3 -m pip install torch numpy)")
    except UsageError as e:
        return _fail(str(e))
    try:
        return serve(benches, sys.stdin, answers)
    except BrokenPipeError:  # benchsuite went away mid-answer: nobody is left to tell
        os._exit(1)

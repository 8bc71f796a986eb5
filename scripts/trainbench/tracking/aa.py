"""A/A check: one build against itself, to measure how often each comparison mode cries wolf on this machine.

Every verdict other than SAME or INCONCLUSIVE between two runs of one unchanged build is a false alarm. The
check runs the build N times as an interleaved A/A comparison (K rounds, ABBA, as `compare --interleave`),
keeps every run in the order it ran, and judges the same runs three ways:

  interleaved   each of the N comparisons, round by round (paired test on the per-round ratios);
  files         each pair of back-to-back runs (first run of a round against the second), as
                `compare A.json B.json` would;
  history       each run against all the runs before it, as `scripts/nightly` would (the first runs form a
                young history: its own line shows how they fare);
  history, --confirm-with
                where the history confirmed a regression, its rows are run again interleaved, the build
                against itself, as `scripts/nightly --confirm-with` would (only when the runs are made, not
                with --input): SLOWER counts the rows whose regression held.

It prints, per mode, how many rows were judged and the share that came out SLOWER or FASTER, and how many
comparisons would have failed (a confirmed regression: exit 1).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

from .constants import BAND_MIN_RUNS
from ..errors import UsageError
from .resultfile import Run, load_run
from .stats import FASTER, SLOWER
from .compare import Analysis, Settings, compare_files, compare_history

MODES = ("interleaved", "files", "history", "history (young)", "history, --confirm-with")


@dataclass
class ModeRate:
    mode: str
    comparisons: int = 0
    rows: int = 0            # rows judged (both sides passed, not disturbed)
    slower: int = 0
    faster: int = 0
    failing: int = 0         # comparisons with a confirmed regression
    examples: List[str] = field(default_factory=list)

    @property
    def rate(self) -> Optional[float]:
        return (self.slower + self.faster) / self.rows if self.rows else None

    def add(self, a: Analysis, where: str) -> None:
        self.comparisons += 1
        self.failing += 1 if a.regressions else 0
        for c in a.comparisons:
            if c.status != "compared":
                continue
            self.rows += 1
            if c.verdict in (SLOWER, FASTER):
                self.slower += c.verdict == SLOWER
                self.faster += c.verdict == FASTER
                if len(self.examples) < 5:
                    self.examples.append(f"{where}: {c.key} {c.verdict} {c.test.ratio - 1:+.1%}")


    def add_confirmed(self, a: Analysis, where: str) -> None:
        """A history checked by `nightly --confirm-with`: only the regressions that held count."""
        self.comparisons += 1
        self.failing += 1 if a.regressions else 0
        self.rows += sum(1 for c in a.comparisons if c.status == "compared")
        for c in a.regressions:
            self.slower += 1
            if len(self.examples) < 5:
                self.examples.append(f"{where}: {c.key} SLOWER {c.test.ratio - 1:+.1%} held")


def analyse(runs: Sequence[Run], rounds: int, settings: Settings,
            confirm: Optional[Callable[[Analysis, str], None]] = None) -> List[ModeRate]:
    """The runs in the order they ran, 2 x `rounds` per interleaved comparison (ABBA: in round r, the
    baseline side ran first when r is even). `confirm(analysis, where)`, when given, checks a history's
    confirmed regressions as `nightly --confirm-with` does (in place); without it that mode is left out."""
    from .interleave import compare_interleaved
    per = 2 * rounds
    if len(runs) < per or len(runs) % per:
        raise UsageError(f"{len(runs)} runs do not make whole comparisons of {rounds} rounds ({per} runs each)")
    out = {m: ModeRate(m) for m in MODES}
    for i in range(0, len(runs), per):
        chunk = runs[i:i + per]
        pairs: List[Tuple[Run, Run]] = []
        for r in range(rounds):
            first, second = chunk[2 * r], chunk[2 * r + 1]
            pairs.append((first, second) if r % 2 == 0 else (second, first))
            out["files"].add(compare_files(first, second, settings), f"runs {i + 2 * r + 1}-{i + 2 * r + 2}")
        out["interleaved"].add(compare_interleaved(pairs, settings), f"comparison {i // per + 1}")
    for j in range(1, len(runs)):
        mode = "history" if j >= BAND_MIN_RUNS else "history (young)"
        a = compare_history(runs[:j], runs[j], settings)
        out[mode].add(a, f"run {j + 1}")
        if confirm is not None and mode == "history":
            if a.regressions:
                confirm(a, f"run {j + 1}")
            out["history, --confirm-with"].add_confirmed(a, f"run {j + 1}")
    return [out[m] for m in MODES if confirm is not None or m != "history, --confirm-with"]


def collect(benchsuite: str, comparisons: int, rounds: int, extra: List[str], folder: str,
            timeout: Optional[float], progress: Callable[[str], None], runner=None) -> List[Run]:
    """Runs `benchsuite` 2 x rounds x comparisons times into `folder` (001.json, ...), in order."""
    if runner is None:
        from .nightly import run_benchsuite as runner
    total = 2 * rounds * comparisons
    runs = []
    for k in range(total):
        path = os.path.join(folder, f"{k + 1:03d}.json")
        progress(f"aa-check: run {k + 1}/{total} (comparison {k // (2 * rounds) + 1}/{comparisons}, "
                 f"round {(k % (2 * rounds)) // 2 + 1}/{rounds})")
        runner(benchsuite, path, None, extra, timeout, capture=True)
        runs.append(load_run(path))
    return runs


def load_folder(folder: str) -> List[Run]:
    """Every *.json of `folder`, in name order (the order collect() wrote them)."""
    if not os.path.isdir(folder):
        raise UsageError(f"--input {folder}: not a directory")
    names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
    if not names:
        raise UsageError(f"--input {folder}: no result files")
    return [load_run(os.path.join(folder, n)) for n in names]


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.1%}"


def render(rates: Sequence[ModeRate], runs: int, rounds: int, args_text: str, fmt: str) -> str:
    if fmt == "json":
        return json.dumps({"runs": runs, "rounds": rounds, "benchsuite_arguments": args_text,
                           "modes": [{"mode": r.mode, "comparisons": r.comparisons, "rows": r.rows,
                                      "slower": r.slower, "faster": r.faster, "false_alarm_rate": r.rate,
                                      "failing_comparisons": r.failing, "examples": r.examples}
                                     for r in rates]}, indent=2) + "\n"
    head = ["mode", "comparisons", "rows judged", "SLOWER", "FASTER", "false alarms", "would fail"]
    body = [[r.mode, str(r.comparisons), str(r.rows), str(r.slower), str(r.faster), _pct(r.rate), str(r.failing)]
            for r in rates]
    intro = (f"A/A: one build against itself, {runs} runs ({rounds} rounds per interleaved comparison); "
             f"benchsuite {args_text}".rstrip())
    if fmt == "markdown":
        lines = [intro, "", "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
        lines += ["| " + " | ".join(b) + " |" for b in body]
        return "\n".join(lines) + "\n"
    widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    lines = [intro, ""] + ["  ".join(x[i].ljust(widths[i]) for i in range(len(head))).rstrip() for x in [head] + body]
    lines.append("")
    lines.append("false alarms: rows SLOWER or FASTER between two measurements of the same build; "
                 "would fail: comparisons with a confirmed regression (exit 1)")
    for r in rates:
        for e in r.examples:
            lines.append(f"  {r.mode}: {e}")
    return "\n".join(lines) + "\n"


def progress_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)

"""Interleaved A/B comparison: two benchsuite builds run alternately on one machine, judged round by round.

Round r runs OLD then NEW when r is even, NEW then OLD when odd (ABBA), each a short benchsuite run with
the same arguments. Per benchmark and round, the ratio NEW median / OLD median; a slow drift of the machine
(another job, the clock, the temperature) that hits both builds within a round cancels in that ratio, and
ABBA cancels a linear trend across a pair of rounds. The verdict is a paired test on the per-round log
ratios (`stats.paired_rounds_test`), with the file-vs-file mode's minimum effect and significance level.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from typing import Callable, List, Optional, Sequence, Tuple

from ..errors import UsageError
from .compare import Analysis, Comparison, Settings, matches_filter, series_point
from .constants import MIN_ROUNDS
from .resultfile import Run, load_run
from .stats import SLOWER, paired_rounds_test

OLD, NEW = "old", "new"


def compare_interleaved(rounds: Sequence[Tuple[Run, Run]], settings: Settings,
                        old_label: str = OLD, new_label: str = NEW) -> Analysis:
    """rounds[r] = (OLD's run, NEW's run) of round r. Each benchmark that passed on both sides in every round
    gets a verdict from `stats.paired_rounds_test`; one that did not pass (or is absent) in some round is listed,
    not judged. A round in which either side's row was disturbed (benchsuite saw other work on the machine
    or a throttled GPU through its retakes) is left out of that benchmark's test; with fewer than two clean
    rounds left it is listed as disturbed. A SLOWER verdict is a confirmed regression."""
    K = len(rounds)
    warnings: List[str] = []
    keys_seen = {r.machine_key for pair in rounds for r in pair}
    if len(keys_seen) > 1:
        warnings.append(f"the runs report different machine keys ({', '.join(sorted(keys_seen))})")
    keys: List[str] = []
    for pair in rounds:
        for run in (pair[1], pair[0]):
            keys += [k for k in run.rows if k not in keys]
    out = []
    for key in keys:
        if not matches_filter(settings, key):
            continue
        rows = [(o.rows.get(key), n.rows.get(key)) for o, n in rounds]
        first = next(r for pair in rows for r in pair if r is not None)
        c = Comparison(key=key, stage=first.stage, backend=first.backend, status="compared",
                       threshold=settings.threshold_for(first.stage),
                       series=[series_point(0, rows[0][0]), series_point(1, rows[0][1])])
        absent = [f"round {r + 1} {side}" for r, pair in enumerate(rows)
                  for side, row in zip((old_label, new_label), pair) if row is None]
        broken = [(r, side, row) for r, pair in enumerate(rows)
                  for side, row in zip((old_label, new_label), pair) if row is not None and not row.passed]
        if broken:
            r, side, row = broken[0]
            c.status, c.disposition = "not-passed", row.disposition
            c.reason = f"round {r + 1} {side}" + (f": {row.reason}" if row.reason else "")
            if len(broken) > 1:
                c.reason += f" (and {len(broken) - 1} more run{'s' if len(broken) > 2 else ''})"
        elif absent:
            c.status = "missing"
            c.notes = [f"not in {', '.join(absent)}"]
        else:
            clean = [(o, n) for o, n in rows if not o.disturbed and not n.disturbed]
            left_out = [f"round {r + 1} {side}" for r, pair in enumerate(rows)
                        for side, row in zip((old_label, new_label), pair) if row.disturbed]
            if len(clean) < MIN_ROUNDS:
                first_bad = next(row for pair in rows for row in pair if row.disturbed)
                c.status = "disturbed"
                c.reason = f"{len(rows) - len(clean)} of {len(rows)} rounds {first_bad.disturbance}"
            else:
                c.test = paired_rounds_test([o.samples for o, _ in clean], [n.samples for _, n in clean],
                                            threshold=c.threshold, alpha=settings.alpha,
                                            min_samples=settings.min_samples)
                c.verdict = c.test.verdict
                c.confirmed = c.verdict == SLOWER
                if left_out:
                    c.notes.append(f"{len(rows) - len(clean)} disturbed round{'s' if len(rows) - len(clean) > 1 else ''}"
                                   f" left out ({', '.join(left_out)})")
                if c.test.reason:
                    c.notes.append(c.test.reason)
        c.disposition = c.disposition or "passed"
        out.append(c)
    old0, new0 = rounds[0]
    return Analysis("interleaved", new0, [old0, new0], out, settings, warnings, rounds=K)


def run_interleaved(old_bin: str, new_bin: str, rounds: int, extra: List[str], settings: Settings,
                    timeout: Optional[float] = None, progress: Callable[[str], None] = None,
                    runner=None) -> Tuple[Analysis, List[str]]:
    """Runs the two builds alternately (ABBA) and compares them. Returns the analysis and the runs whose
    benchsuite exited 1 (an incorrect or failed row). Raises UsageError when a run fails."""
    if runner is None:
        from .nightly import run_benchsuite as runner
    if progress is None:
        def progress(line):
            print(line, file=sys.stderr, flush=True)
    for b in (old_bin, new_bin):
        if not os.path.exists(b):
            raise UsageError(f"benchsuite not found at {b}")
    tmpdir = tempfile.mkdtemp(prefix="trainbench-interleave-")
    pairs: List[Tuple[Run, Run]] = []
    incorrect: List[str] = []
    try:
        for r in range(rounds):
            order = (OLD, NEW) if r % 2 == 0 else (NEW, OLD)
            got = {}
            for side in order:
                binary = old_bin if side == OLD else new_bin
                progress(f"compare: round {r + 1}/{rounds}: {side} {binary}")
                path = os.path.join(tmpdir, f"round{r + 1}_{side}.json")
                rc = runner(binary, path, None, extra, timeout, capture=True)
                if rc:
                    incorrect.append(f"round {r + 1} {side}")
                got[side] = load_run(path)
            pairs.append((got[OLD], got[NEW]))
        a = compare_interleaved(pairs, settings)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    a.builds = (old_bin, new_bin)
    return a, incorrect


def _without_filter(extra: Sequence[str]) -> List[str]:
    out, skip = [], False
    for e in extra:
        if skip:
            skip = False
        elif e == "--filter":
            skip = True
        elif not e.startswith("--filter="):
            out.append(e)
    return out


def confirm_regressions(a: Analysis, old_bin: str, new_bin: str, extra: Sequence[str], settings: Settings,
                        rounds: int, timeout: Optional[float] = None, progress: Callable[[str], None] = None,
                        runner=None) -> Optional[Analysis]:
    """A history's confirmed regressions, checked by an interleaved run of the previous build against this one.

    A history compares tonight's run with runs of other nights, so a slowdown of the machine that lasts as
    long as two runs (a neighbour on a shared host saturating the memory bus for minutes: invisible to
    /proc/stat, and measured here at up to 2x on a memory-bound row) reads as a regression of the code.
    Run alternately with the previous build, such a slowdown hits both builds and cancels. So each row the
    history confirmed is run again, only those rows, both builds interleaved (`rounds` rounds, ABBA), and
    stays a confirmed regression only when that comparison says SLOWER too; otherwise the history's
    verdict is kept, unconfirmed, with what the interleaved run said. Changes `a` in place; returns the
    interleaved analysis (None when there was nothing to check)."""
    suspects = a.regressions
    if not suspects:
        return None
    if rounds < MIN_ROUNDS:
        raise UsageError(f"--confirm-rounds must be at least {MIN_ROUNDS}, got {rounds}")
    names = "|".join(re.escape(c.key) for c in suspects)
    args = _without_filter(extra) + ["--filter", f"^({names})$"]
    check, incorrect = run_interleaved(old_bin, new_bin, rounds, args, settings, timeout, progress, runner)
    seen = {c.key: c for c in check.comparisons}
    for c in suspects:
        o = seen.get(c.key)
        if o is not None and o.status == "compared" and o.verdict == SLOWER:
            c.notes.append(f"confirmed interleaved against the previous build: {o.test.ratio - 1:+.1%} over "
                           f"{check.rounds} rounds (p={o.test.p_value:.2g})")
            continue
        if o is None:
            said = "the row did not run"
        elif o.status != "compared":
            said = f"{o.status}" + (f" ({o.reason})" if o.reason else "")
        else:
            said = f"{o.verdict} {o.test.ratio - 1:+.1%}"
        c.confirmed = False
        c.environment = f"not confirmed interleaved against the previous build ({said})"
        c.notes.append(f"not confirmed: run interleaved with the previous build ({check.rounds} rounds) it is "
                       f"{said}; the history's slowdown was the machine's, not the code's")
    held = sum(1 for c in suspects if c.confirmed)
    a.warnings.append(f"{len(suspects)} regression{'s' if len(suspects) > 1 else ''} of the history checked by an "
                      f"interleaved run against {old_bin} ({check.rounds} rounds): {held} held"
                      + (f"; benchsuite exited 1 in {', '.join(incorrect)}" if incorrect else ""))
    return check

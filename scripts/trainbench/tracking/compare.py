"""Comparing a run with another run or with its machine's history; the rule for a confirmed regression.

Two files: each benchmark that passed in both gets a verdict from `stats.compare_samples`; a SLOWER verdict
is a confirmed regression unless the recorded clocks explain it.

A history (runs of the same machine key, oldest first, then the new run), per benchmark:
  1. the series of per-run medians (runs where the row passed) is cut into segments at change points
     (`changepoint.detect_change_points`, at least `persist` runs on each side);
  2. the latest run is compared with a baseline:
     a. a trailing streak: if the last s >= persist runs (the new one included) are each SLOWER (or each
        FASTER) than the >= persist runs before them in the latest segment, the baseline is those earlier
        runs and the shift began at the first run of the streak (the longest such streak; this finds a
        shift too young or a history too short for a change point);
     b. else, if the latest segment began at a change point at most `settle_runs` runs ago, the baseline
        is the segment before it and the shift began at that change point;
     c. else the baseline is the latest segment's history (the current level) and there is no shift;
  3. a regression is confirmed when the new run is SLOWER than that baseline, so is each of the
     `persist` - 1 runs before it (the slowdown persists: one bad night is never enough), and the
     slowdown does not disappear once the samples are normalised by the recorded clocks.
A shift older than `settle_runs` runs (by change point or streak) is the machine's new level: the
change point stays in the table and the plots, but no longer fails the nightly.

Both modes:
  - a row benchsuite marked disturbed (others held the CPUs, or the GPU throttled, through its retakes)
    is listed, never judged, and a disturbed run of a history is left out of its baseline;
  - whole-run drift: a SLOWER or FASTER row is judged again with its baseline scaled by how much the
    rows of the other stages moved in the same run (their median ratio, from at least
    RUN_DRIFT_MIN_ROWS rows of RUN_DRIFT_MIN_STAGES stages). A machine that is 15% slower tonight slows
    every stage; a change of the code slows the stages it touches. What the drift explains is not a
    regression (a change that slows every stage alike looks the same: compare --interleave tells).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .changepoint import ChangePoint, detect_change_points, segments
from .constants import (BAND_MIN_RUNS, CLOCK_TOLERANCE, DEFAULT_ALPHA, DEFAULT_CP_ALPHA, DEFAULT_MAX_HISTORY,
                        DEFAULT_MIN_SAMPLES, DEFAULT_PERSIST, DEFAULT_SETTLE_RUNS, DEFAULT_THRESHOLD, MAX_BASELINE_RUNS,
                        RUN_DRIFT_MIN_ROWS, RUN_DRIFT_MIN_STAGES)
from ..errors import UsageError
from .resultfile import GPU_BACKENDS, Row, Run
from .stats import FASTER, INCONCLUSIVE, SAME, SLOWER, NightSpread, SampleTest, compare_samples


@dataclass
class Settings:
    threshold: float = DEFAULT_THRESHOLD
    stage_thresholds: Dict[str, float] = field(default_factory=dict)
    alpha: float = DEFAULT_ALPHA
    cp_alpha: float = DEFAULT_CP_ALPHA
    min_samples: int = DEFAULT_MIN_SAMPLES
    persist: int = DEFAULT_PERSIST
    settle_runs: int = DEFAULT_SETTLE_RUNS
    max_history: int = DEFAULT_MAX_HISTORY
    filter: Optional[str] = None

    def threshold_for(self, stage: str) -> float:
        return self.stage_thresholds.get(stage, self.threshold)


@dataclass
class Point:
    """One run of a benchmark's series, for the table and the plots."""
    run_index: int
    disposition: str
    median: Optional[float] = None
    low: Optional[float] = None
    high: Optional[float] = None


@dataclass
class Comparison:
    key: str
    stage: str
    backend: str
    status: str                         # compared | not-passed | disturbed | new | missing
    threshold: float
    verdict: Optional[str] = None       # SAME FASTER SLOWER INCONCLUSIVE, when status is compared
    test: Optional[SampleTest] = None
    confirmed: bool = False
    # SLOWER between two single runs: a change or the machine's run-to-run drift, which two runs cannot
    # tell apart; an interleaved run or a history can (shown as SLOWER?, not a failure by default)
    unconfirmed: bool = False
    environment: str = ""               # why a slowdown is the environment (clock), not the code
    start_index: Optional[int] = None   # run where the current shift began
    change_points: List[Tuple[int, ChangePoint]] = field(default_factory=list)   # (run index, cp)
    baseline_indices: List[int] = field(default_factory=list)
    series: List[Point] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    disposition: str = ""               # of the new row
    reason: str = ""
    bench: Optional["_Bench"] = field(default=None, repr=False)      # what judged it, to judge it again
    bench_baseline: List[int] = field(default_factory=list, repr=False)


@dataclass
class Analysis:
    mode: str                           # files | history | interleaved
    new: Run
    runs: List[Run]                     # baseline run(s) / history (oldest first), then the new run
    comparisons: List[Comparison]
    settings: Settings
    warnings: List[str] = field(default_factory=list)
    rounds: int = 0                     # interleaved: rounds run (ABBA)
    builds: Tuple[str, str] = ("", "")  # interleaved: the OLD and NEW benchsuite binaries
    fail_on_unconfirmed: bool = False   # compare --fail-on-unconfirmed: a SLOWER? fails too

    @property
    def regressions(self) -> List[Comparison]:
        return [c for c in self.comparisons if c.confirmed]

    @property
    def unconfirmed(self) -> List[Comparison]:
        return [c for c in self.comparisons if c.unconfirmed]

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions or (self.fail_on_unconfirmed and self.unconfirmed) else 0


def series_point(i: int, row: Optional[Row]) -> Point:
    if row is None:
        return Point(i, "absent")
    if not row.passed:
        return Point(i, row.disposition)
    if row.disturbed:
        return Point(i, "disturbed")
    s = np.asarray(row.samples)
    raw = row.raw
    lo = raw.get("ci_low_ns") if isinstance(raw.get("ci_low_ns"), (int, float)) else float(np.min(s))
    hi = raw.get("ci_high_ns") if isinstance(raw.get("ci_high_ns"), (int, float)) else float(np.max(s))
    return Point(i, "passed", row.median, float(lo), float(hi))


def _clock_scale(runs: Sequence[Run], rows: Sequence[Row], new: Run, new_row: Row) -> Optional[List[float]]:
    """Per baseline run, the factor that puts its times at the new run's clock; None when not applicable."""
    cn = new.clock_mhz(new_row)
    if cn is None:
        return None
    clocks = [r.clock_mhz(row) for r, row in zip(runs, rows)]
    if any(c is None for c in clocks) or all(abs(c / cn - 1) <= CLOCK_TOLERANCE for c in clocks):
        return None
    return [c / cn for c in clocks]


def _clock_text(row: Row, base_clock: float, new_clock: float) -> str:
    what = "SM clock" if row.backend in GPU_BACKENDS else "CPU clock"
    return f"{what} {base_clock:.0f} -> {new_clock:.0f} MHz"


class _Bench:
    """One benchmark's passed runs, by position in its series."""

    def __init__(self, runs: List[Run], rows: List[Row], settings: Settings, threshold: float, history: bool):
        self.runs, self.rows, self.s, self.t = runs, rows, settings, threshold
        self.history = history
        self.meds = [r.median for r in rows]
        self.samples = [np.asarray(r.samples) for r in rows]
        self.segs: List[range] = []
        self.history_end = len(rows) - 1

    def set_levels(self, segs: Sequence[range], history_end: int) -> None:
        """The levels (segments between change points) of the history's positions below `history_end`."""
        self.segs, self.history_end = list(segs), history_end

    def night_spread(self, base: Sequence[int]) -> Optional[NightSpread]:
        """Night-to-night spread of the log medians around their level's median, over the earlier levels
        and the baseline runs: never the runs after the baseline, whose shift is what is being tested."""
        if not self.segs:
            return None
        keep = set(base) | {q for seg in self.segs[:-1] for q in seg}
        resid: List[float] = []
        for seg in self.segs:
            logs = np.log([self.meds[q] for q in seg if q in keep and q < self.history_end])
            if logs.size:
                resid.extend(logs - np.median(logs))
        return NightSpread.of(resid) if len(resid) >= BAND_MIN_RUNS else None

    def may_differ(self, j: int, base: Sequence[int]) -> bool:
        """Cheap pre-check: run j's median is at least the threshold away from the baseline's."""
        ratio = self.meds[j] / float(np.median([self.meds[q] for q in list(base)[-MAX_BASELINE_RUNS:]]))
        return ratio >= 1 + self.t or ratio <= 1 - self.t

    def test(self, j: int, base: Sequence[int], scale: Optional[List[float]] = None) -> SampleTest:
        base = list(base)[-MAX_BASELINE_RUNS:]
        f = scale[-len(base):] if scale is not None else [1.0] * len(base)
        night = self.night_spread(base)
        samples = np.concatenate([self.samples[q] * f[i] for i, q in enumerate(base)])
        meds = [self.meds[q] * f[i] for i, q in enumerate(base)] if len(base) > 1 else None
        return compare_samples(samples, self.samples[j], threshold=self.t, alpha=self.s.alpha,
                               min_samples=self.s.min_samples, base_run_medians=meds,
                               night=night, history=self.history)

    def environment(self, j: int, base: Sequence[int]) -> str:
        """Non-empty when the slowdown of run j against `base` disappears at equal clocks."""
        base = list(base)[-MAX_BASELINE_RUNS:]
        scale = _clock_scale([self.runs[q] for q in base], [self.rows[q] for q in base],
                             self.runs[j], self.rows[j])
        if scale is None:
            return ""
        if self.test(j, base, scale).verdict == SLOWER:
            return ""
        cn = self.runs[j].clock_mhz(self.rows[j])
        cb = float(np.median([self.runs[q].clock_mhz(self.rows[q]) for q in base]))
        return _clock_text(self.rows[j], cb, cn)


def matches_filter(settings: Settings, key: str) -> bool:
    return settings.filter is None or re.search(settings.filter, key) is not None


HOW_TO_CONFIRM = ("to confirm a SLOWER?: scripts/compare --interleave OLD_BENCHSUITE NEW_BENCHSUITE -- "
                  "BENCHSUITE_ARGS runs both builds alternately on this machine and exits 1 on a SLOWER it "
                  "holds; or store the runs in a history (scripts/nightly) and judge them there with "
                  "scripts/nightly --confirm-with OLD_BENCHSUITE")


def compare_files(base: Run, new: Run, settings: Settings, allow_machine_mismatch: bool = False) -> Analysis:
    warnings = []
    mismatch = base.machine_key != new.machine_key
    if mismatch:
        msg = (f"the runs are from different machines ({base.machine_key} vs {new.machine_key}); "
               "histories never mix machines")
        if not allow_machine_mismatch:
            raise UsageError(msg + " (pass --allow-machine-mismatch to compare them anyway)")
        warnings.append(msg + ": verdicts shown, no regression confirmed")
    out = []
    keys = list(new.rows) + [k for k in base.rows if k not in new.rows]
    for key in keys:
        if not matches_filter(settings, key):
            continue
        nr, br = new.rows.get(key), base.rows.get(key)
        row = nr or br
        c = Comparison(key=key, stage=row.stage, backend=row.backend, status="compared",
                       threshold=settings.threshold_for(row.stage),
                       series=[series_point(0, br), series_point(1, nr)])
        if nr is None:
            c.status, c.notes = "missing", ["not in the new run"]
        elif not nr.passed:
            c.status, c.disposition, c.reason = "not-passed", nr.disposition, nr.reason
        elif nr.disturbed:
            c.status, c.reason = "disturbed", nr.disturbance
        elif br is None or not br.passed:
            c.status = "new"
            c.notes = ["not in the baseline" if br is None else f"baseline row {br.disposition}"]
        elif br.disturbed:
            c.status, c.reason = "disturbed", "baseline " + br.disturbance
        else:
            bench = _Bench([base, new], [br, nr], settings, c.threshold, history=False)
            c.test = bench.test(1, [0])
            c.verdict = c.test.verdict
            c.baseline_indices = [0]
            c.bench, c.bench_baseline = bench, [0]
            if c.verdict == SLOWER:
                c.environment = bench.environment(1, [0])
                c.unconfirmed = not c.environment and not mismatch   # never confirmed by two runs
            if c.test.reason:
                c.notes.append(c.test.reason)
        if nr is not None:
            c.disposition = c.disposition or nr.disposition
        out.append(c)
    _judge_run_drift(out, settings)
    if any(c.status == "compared" for c in out):
        warnings.append("two single runs cannot separate a change from the machine's run-to-run drift "
                        "(on a shared machine 10-20%); the verdicts above allow for a drift of the whole run, "
                        "not for one that hits some stages only, so a SLOWER here is unconfirmed (SLOWER?): "
                        "scripts/compare --interleave OLD NEW runs both builds alternately and can tell")
    if any(c.unconfirmed for c in out):
        warnings.append(HOW_TO_CONFIRM)
    return Analysis("files", new, [base, new], out, settings, warnings)


def _analyse_history(c: Comparison, runs: List[Run], idx: List[int], rows: List[Row], settings: Settings):
    persist = max(int(settings.persist), 1)
    bench = _Bench([runs[i] for i in idx], rows, settings, c.threshold, history=True)
    P = len(rows) - 1
    cps = detect_change_points(bench.meds, c.threshold, settings.cp_alpha, min_size=persist)
    c.change_points = [(idx[cp.index], cp) for cp in cps]
    segs = segments(len(rows), cps)
    bench.set_levels(segs, P)
    latest = segs[-1]
    seg = list(range(latest.start, P))                 # history positions in the latest segment
    recent = bool(cps) and (settings.settle_runs <= 0 or P - latest.start + 1 <= settings.settle_runs)

    baseline, start, test, persists = None, None, None, False
    # a streak needs a baseline of at least `persist` runs too: one night says nothing of the machine's noise
    longest = len(seg) - persist + 1
    if settings.settle_runs > 0:
        longest = min(longest, settings.settle_runs + 1)
    if seg:                                             # a. trailing streak within the latest segment
        for s in range(longest, persist - 1, -1):      # the longest streak that holds
            base = seg[:len(seg) - s + 1]
            if not bench.may_differ(P, base):
                continue
            last = bench.test(P, base)
            if last.verdict in (SLOWER, FASTER) and \
                    all(bench.test(q, base).verdict == last.verdict for q in range(P - s + 1, P)):
                baseline, start, test, persists = base, P - s + 1, last, True
                break
        if start is not None and settings.settle_runs > 0 and P - start + 1 > settings.settle_runs:
            baseline, start, test, persists = None, None, None, False     # settled: the new level
        if baseline is None and not recent:             # c. the current level
            baseline, test = seg, bench.test(P, seg)
    if baseline is None and recent:                     # b. a recent change point
        prev = segs[-2]
        baseline, start = list(prev)[-MAX_BASELINE_RUNS:], latest.start
        test = bench.test(P, baseline)
        persists = (test.verdict in (SLOWER, FASTER) and P - persist + 1 >= latest.start and
                    all(bench.test(q, baseline).verdict == test.verdict for q in range(P - persist + 1, P)))
    if baseline is None:                                # latest segment is the new run alone
        baseline = list(segs[-2])[-MAX_BASELINE_RUNS:]
        test = bench.test(P, baseline)

    c.test, c.verdict = test, test.verdict
    c.bench, c.bench_baseline = bench, list(baseline)
    c.baseline_indices = [idx[q] for q in baseline][-MAX_BASELINE_RUNS:]
    if start is not None:
        c.start_index = idx[start]
    if test.reason:
        c.notes.append(test.reason)
    if c.verdict == SLOWER:
        c.environment = bench.environment(P, baseline)
        if c.environment:
            c.notes.append(f"slowdown explained by the environment ({c.environment}), not the code")
        elif persists:
            c.confirmed = True
        else:
            c.notes.append(f"not confirmed yet: a regression needs {persist} consecutive slower runs")
    for ri, cp in c.change_points:
        if ri != c.start_index:
            word = "slower" if cp.ratio > 1 else "faster"
            c.notes.append(f"level {cp.ratio - 1:+.1%} ({word}) since {runs[ri].label}")


def compare_history(history: Sequence[Run], new: Run, settings: Settings) -> Analysis:
    """The new run against earlier runs of its machine (oldest first)."""
    runs = list(history)[-settings.max_history:] + [new]
    N = len(runs) - 1
    out = []
    keys = list(new.rows) + [k for k in (runs[-2].rows if N else {}) if k not in new.rows]
    for key in keys:
        if not matches_filter(settings, key):
            continue
        nr = new.rows.get(key)
        row = nr or runs[-2].rows[key]
        c = Comparison(key=key, stage=row.stage, backend=row.backend, status="compared",
                       threshold=settings.threshold_for(row.stage),
                       series=[series_point(i, r.rows.get(key)) for i, r in enumerate(runs)])
        passed = [(i, r.rows[key]) for i, r in enumerate(runs[:N])
                  if key in r.rows and r.rows[key].passed and not r.rows[key].disturbed]
        disturbed = sum(1 for r in runs[:N] if key in r.rows and r.rows[key].passed and r.rows[key].disturbed)
        if nr is None:
            c.status, c.notes = "missing", ["not in the new run"]
        elif not nr.passed:
            c.status, c.disposition, c.reason = "not-passed", nr.disposition, nr.reason
        elif nr.disturbed:
            c.status, c.reason = "disturbed", nr.disturbance
        elif not passed:
            c.status, c.notes = "new", ["no earlier passed run on this machine"]
        else:
            _analyse_history(c, runs, [i for i, _ in passed] + [N], [r for _, r in passed] + [nr], settings)
            if disturbed:
                c.notes.append(f"{disturbed} disturbed run{'s' if disturbed > 1 else ''} left out of the history")
        if nr is not None:
            c.disposition = nr.disposition
        out.append(c)
    _judge_run_drift(out, settings)
    return Analysis("history", new, runs, out, settings)


def run_drift(comparisons: Sequence[Comparison], c: Comparison) -> Optional[Tuple[float, int, int]]:
    """How much the new run as a whole moved against its baselines, seen from the stages other than c's on its
    backend: (the median over those stages of each stage's median ratio, rows, stages), or None when too few
    rows tell. One vote a stage, so that a stage with many rows, changed by the code, does not make the drift."""
    by_stage: Dict[str, List[float]] = {}
    for o in comparisons:
        if o is not c and o.status == "compared" and o.test is not None and o.backend == c.backend \
                and o.stage != c.stage and np.isfinite(o.test.ratio):
            by_stage.setdefault(o.stage, []).append(o.test.ratio)
    rows = sum(len(v) for v in by_stage.values())
    if rows < RUN_DRIFT_MIN_ROWS or len(by_stage) < RUN_DRIFT_MIN_STAGES:
        return None
    return float(np.median([np.median(v) for v in by_stage.values()])), rows, len(by_stage)


def _judge_run_drift(comparisons: List[Comparison], settings: Settings) -> None:
    """A SLOWER or FASTER row whose change the whole run's drift explains is judged again with its baseline
    scaled by the drift: SAME when that says so, else INCONCLUSIVE (never the opposite verdict: the drift
    is an estimate), never a confirmed regression; the note says so."""
    moved = {}
    for c in comparisons:
        if c.status == "compared" and c.verdict in (SLOWER, FASTER) and c.environment == "":
            drift = run_drift(comparisons, c)
            if drift is not None and abs(math.log(drift[0])) >= math.log1p(c.threshold) / 2:
                moved[id(c)] = drift
    for c in comparisons:
        if id(c) not in moved:
            continue
        factor, rows, stages = moved[id(c)]
        bench, base = c.bench, c.bench_baseline
        again = bench.test(len(bench.rows) - 1, base, [factor] * len(base))
        seen = f"the whole run moved {factor - 1:+.1%} ({rows} rows of {stages} other stages)"
        if again.verdict == c.verdict:
            c.notes.append(f"{again.ratio - 1:+.1%} beyond the whole run's drift ({factor - 1:+.1%} over {rows} rows "
                           f"of {stages} other stages)")
            continue
        c.environment = seen
        c.notes = [n for n in c.notes if not n.startswith("not confirmed yet")]
        c.verdict, c.confirmed, c.unconfirmed = (SAME if again.verdict == SAME else INCONCLUSIVE), False, False
        c.notes.append(f"{c.test.ratio - 1:+.1%} while {seen}: {c.verdict} once that is allowed for; a change that "
                       "slows every stage alike looks the same (compare --interleave tells them apart)")

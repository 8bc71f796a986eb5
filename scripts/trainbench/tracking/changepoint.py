"""Change points in a history of per-run medians: where a persistent shift of the level began.

A change point at index k splits a segment into L = x[a:k] and R = x[k:b]. A split is a candidate when
  1. both sides hold at least `min_size` runs (default 2: one run alone is never a new level),
  2. the medians differ by at least the threshold: median(R)/median(L) >= 1+t or <= 1-t, and
  3. the shift persists: with the run of each side that most supports it left out, the medians still
     differ by at least t/2 in the same direction (so one outlier night cannot make a level).
The segment has a change point when some candidate is significant: a two-sided Mann-Whitney U test
(exact for small sides) between the runs of L and of R gives p < alpha. It is placed at the candidate
that fits a step best: the least sum of squared deviations of the log values from their side's mean
(the least-squares / CUSUM location; the rank test's p alone favours balanced splits and, with few runs,
a split that takes in the highest baseline night).

Detection is sequential, as the nightly sees the data: the series is scanned left to right, and when
the runs since the current segment's start hold a change point, it is recorded and the new segment
starts there. A refinement pass then re-places each change point between its neighbours using the whole
segments on both sides, and drops any that no longer pass (a false change point in a noisy stretch
would make a short level that later runs look slower than).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
from scipy.stats import mannwhitneyu

from .constants import DEFAULT_CP_ALPHA, DEFAULT_PERSIST, EXACT_MAX_PRODUCT



@dataclass
class ChangePoint:
    index: int          # first index of the new level
    ratio: float        # median after / median before (>1: slower)
    p_value: float


def _drop(side: np.ndarray, which) -> float:
    """Median of a side without its run `which` picks (a side of one run is kept whole)."""
    return float(np.median(np.delete(side, which(side)) if side.size > 1 else side))


def _split(x: np.ndarray, a: int, k: int, b: int, threshold: float) -> Optional[tuple]:
    """(sse, p, k, ratio) for a candidate split, None when it is not one."""
    left, right = x[a:k], x[k:b]
    ratio = float(np.median(right) / np.median(left))
    if ratio >= 1 + threshold:
        if _drop(right, np.argmax) / _drop(left, np.argmin) < 1 + threshold / 2:
            return None
    elif ratio <= 1 - threshold:
        if _drop(right, np.argmin) / _drop(left, np.argmax) > 1 - threshold / 2:
            return None
    else:
        return None
    method = "exact" if left.size * right.size <= EXACT_MAX_PRODUCT else "asymptotic"
    p = float(mannwhitneyu(left, right, alternative="two-sided", method=method).pvalue)
    logs_l, logs_r = np.log(left), np.log(right)
    sse = float(np.sum((logs_l - logs_l.mean()) ** 2) + np.sum((logs_r - logs_r.mean()) ** 2))
    return (sse, p, k, ratio)


def _best_split(x, a, b, threshold, alpha, min_size) -> Optional[ChangePoint]:
    cands = [c for c in (_split(x, a, k, b, threshold) for k in range(a + min_size, b - min_size + 1)) if c]
    significant = [c for c in cands if c[1] < alpha]
    if not significant:
        return None
    best = min(cands)
    return ChangePoint(index=best[2], ratio=best[3], p_value=min(c[1] for c in significant))


def detect_change_points(values: Sequence[float], threshold: float, alpha: float = DEFAULT_CP_ALPHA,
                         min_size: int = DEFAULT_PERSIST) -> List[ChangePoint]:
    """Change points of a series of positive values (per-run median times), in index order."""
    x = np.asarray(values, dtype=float)
    n = x.size
    min_size = max(int(min_size), 1)
    cps: List[ChangePoint] = []
    start, end = 0, 2 * min_size
    while end <= n:
        best = _best_split(x, start, end, threshold, alpha, min_size)
        if best is not None:
            cps.append(best)
            start = best.index
            end = max(end + 1, start + 2 * min_size)
        else:
            end += 1
    for _ in range(10):   # refinement with whole neighbouring segments
        changed = False
        for i in range(len(cps)):
            a = cps[i - 1].index if i > 0 else 0
            b = cps[i + 1].index if i + 1 < len(cps) else n
            best = _best_split(x, a, b, threshold, alpha, min_size)
            if best is None:
                del cps[i]
                changed = True
                break
            changed = changed or best.index != cps[i].index
            cps[i] = best
        if not changed:
            break
    return cps


def segments(n: int, cps: Sequence[ChangePoint]) -> List[range]:
    """The index ranges between change points."""
    bounds = [0] + [c.index for c in cps] + [n]
    return [range(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]

"""Per-benchmark verdict from repetition samples: Mann-Whitney U, effect size from medians, noise band."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
from scipy.stats import mannwhitneyu, norm

from scipy.stats import t as student_t

from .constants import (BAND_MIN_RUNS, BAND_SIGMAS_BY_RUNS, BAND_TAIL, DEFAULT_ALPHA, DEFAULT_MIN_SAMPLES,
                        DEFAULT_THRESHOLD, MAD_TO_SIGMA, ROBUST_MIN_RUNS)

SAME, FASTER, SLOWER, INCONCLUSIVE = "SAME", "FASTER", "SLOWER", "INCONCLUSIVE"
VERDICTS = (SAME, FASTER, SLOWER, INCONCLUSIVE)



@dataclass
class SampleTest:
    verdict: str
    ratio: float                      # new median / baseline median (>1: slower)
    p_value: float                    # two-sided Mann-Whitney U
    ci: Tuple[float, float]           # Hodges-Lehmann interval of the time ratio, level 1 - alpha
    base_median: float
    new_median: float
    n_base: int
    n_new: int
    band: Optional[Tuple[float, float]]   # history noise band of the median, when there is one
    reason: str = ""


def robust_sigma(values: Sequence[float]) -> float:
    """Normal-consistent MAD."""
    v = np.asarray(values, dtype=float)
    if v.size < 2:
        return 0.0
    return float(MAD_TO_SIGMA * np.median(np.abs(v - np.median(v))))


def band_sigmas(runs: int) -> float:
    """How many robust sigmas wide (either side) the band is when the MAD came from `runs` >= ROBUST_MIN_RUNS
    runs (constants.BAND_SIGMAS_BY_RUNS, interpolated in log n); tends to the normal 3 for a long history."""
    ns = sorted(BAND_SIGMAS_BY_RUNS)
    n = max(int(runs), ns[0])
    if n >= ns[-1]:
        return BAND_SIGMAS_BY_RUNS[ns[-1]]
    return float(np.exp(np.interp(math.log(n), np.log(ns), np.log([BAND_SIGMAS_BY_RUNS[k] for k in ns]))))


@dataclass
class NightSpread:
    """How far an unchanged build's per-run median strays from its level: the log medians' deviations from
    their level's median (segments between change points), over `runs` runs."""
    sd: float       # root mean square deviation
    robust: float   # normal-consistent MAD
    runs: int

    @classmethod
    def of(cls, residuals: Sequence[float]) -> "NightSpread":
        r = np.asarray(residuals, dtype=float)
        sd = float(math.sqrt(np.sum(r * r) / max(r.size - 1, 1))) if r.size else 0.0
        return cls(sd, robust_sigma(r), int(r.size))

    def half_width(self, level_runs: int) -> float:
        """Half-width (log units) of the band around the median of a level of `level_runs` runs, so that a
        run of an unchanged build leaves it with chance BAND_TAIL on either side. From ROBUST_MIN_RUNS runs
        on, the calibrated width on the robust sigma: a shift inside a level, too young for a change point,
        does not widen the band that should find it. Below, a Student t prediction interval on the standard
        deviation (a MAD of a few runs is now and then near 0); one wild night widens it, never narrows it.
        The centre's own uncertainty (variance about pi / 2n sigma^2) is taken for the level's run count."""
        n = max(level_runs, 1)
        if self.runs >= ROBUST_MIN_RUNS:
            centre = math.sqrt((1.0 + math.pi / (2.0 * n)) / (1.0 + math.pi / (2.0 * self.runs)))
            return band_sigmas(self.runs) * max(centre, 1.0) * self.robust
        q = float(student_t.ppf(1.0 - BAND_TAIL, max(self.runs - 1, 1)))
        return q * self.sd * math.sqrt(1.0 + math.pi / (2.0 * n))


def noise_band(run_medians: Sequence[float], night: Optional[NightSpread] = None) -> Optional[Tuple[float, float]]:
    """Range in which a run's median is consistent with the night-to-night spread: that of these runs
    (with at least BAND_MIN_RUNS of them) or `night` (from a longer history, all its levels), whichever
    is wider; None when neither is known."""
    logs = np.log(np.asarray(run_medians, dtype=float))
    if logs.size == 0:
        return None
    widths = [NightSpread.of(logs - np.median(logs)).half_width(logs.size)] if logs.size >= BAND_MIN_RUNS else []
    if night is not None and night.runs >= BAND_MIN_RUNS:
        widths.append(night.half_width(logs.size))
    if not widths:
        return None
    centre, w = float(np.median(logs)), max(widths)
    return math.exp(centre - w), math.exp(centre + w)


def ratio_interval(base: np.ndarray, new: np.ndarray, alpha: float) -> Tuple[float, float]:
    """Distribution-free interval for the ratio new/base (Hodges-Lehmann on log times, Mann-Whitney bounds)."""
    d = np.sort((np.log(new)[:, None] - np.log(base)[None, :]).ravel())
    n, m = base.size, new.size
    k = int(math.floor(n * m / 2.0 - norm.ppf(1 - alpha / 2) * math.sqrt(n * m * (n + m + 1) / 12.0)))
    k = min(max(k, 0), (d.size - 1) // 2)
    return math.exp(d[k]), math.exp(d[d.size - 1 - k])


def compare_samples(base_samples: Sequence[float], new_samples: Sequence[float], *,
                    threshold: float = DEFAULT_THRESHOLD, alpha: float = DEFAULT_ALPHA,
                    min_samples: int = DEFAULT_MIN_SAMPLES,
                    base_run_medians: Optional[Sequence[float]] = None,
                    night: Optional[NightSpread] = None, history: bool = False) -> SampleTest:
    """Verdict of `new` against `base`.

    base_samples: the baseline's repetitions (pooled over runs for a history); base_run_medians: the
    baseline runs' medians, when there are several: the effect is measured against their median and a
    run inside their noise band is never FASTER or SLOWER. night: the night-to-night spread of the log
    medians measured over the whole history, which widens the band of a short baseline. history: the
    baseline is earlier runs of a history, whose verdict needs a noise band: the samples of a few runs
    show their own repetitions' noise, not how far a whole run drifts from night to night.

    SLOWER / FASTER: U test p < alpha, and median ratio >= 1 + threshold / <= 1 - threshold, and (with a
    history of >= BAND_MIN_RUNS runs) the new median outside the history's noise band; a history with
    fewer runs (no band yet) gives INCONCLUSIVE instead: a young history is never more easily alarmed
    than an old one.
    SAME: ratio within +-threshold, and the evidence says so: the test is significant (a real but small
    change), or the ratio's interval lies within +-threshold, or the median is inside the noise band.
    INCONCLUSIVE: anything else (too few samples, too noisy to tell).
    """
    base = np.asarray(base_samples, dtype=float)
    new = np.asarray(new_samples, dtype=float)
    meds = list(base_run_medians) if base_run_medians is not None else []
    base_med = float(np.median(meds)) if meds else float(np.median(base))
    new_med = float(np.median(new))
    ratio = new_med / base_med
    if new.size < min_samples or base.size < min_samples:
        return SampleTest(INCONCLUSIVE, ratio, float("nan"), (float("nan"), float("nan")), base_med, new_med,
                          base.size, new.size, None,
                          f"too few samples ({new.size} new, {base.size} baseline; need {min_samples})")
    p = float(mannwhitneyu(base, new, alternative="two-sided").pvalue)
    if not math.isfinite(p):     # all samples identical
        p = 1.0
    ci = ratio_interval(base, new, alpha)
    band = noise_band(meds or [base_med], night) if (meds or history) else None
    in_band = band is not None and band[0] <= new_med <= band[1]
    significant = p < alpha
    lo_t, hi_t = 1.0 - threshold, 1.0 + threshold
    reason = ""
    if significant and (ratio >= hi_t or ratio <= lo_t) and not in_band:
        verdict = SLOWER if ratio > 1 else FASTER
        if history and band is None:
            verdict = INCONCLUSIVE
            reason = (f"{ratio - 1:+.1%}, but a history of {max(len(meds), 1)} run{'s' if len(meds) > 1 else ''} "
                      f"cannot tell a change from night-to-night drift (a noise band needs {BAND_MIN_RUNS}; "
                      "scripts/compare --interleave can)")
    elif lo_t < ratio < hi_t and (significant or (ci[0] >= lo_t and ci[1] <= hi_t) or in_band):
        verdict = SAME
    else:
        verdict = INCONCLUSIVE
        if in_band:
            reason = "within the history's night-to-night noise"
        elif not significant:
            reason = f"not significant (p={p:.2g}) and too noisy to rule out a {threshold:.0%} change"
        else:
            reason = "too noisy to tell"
    return SampleTest(verdict, ratio, p, ci, base_med, new_med, base.size, new.size, band, reason)

"""Per-benchmark verdict from repetition samples: Mann-Whitney U, effect size from medians, noise band."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
from scipy.stats import mannwhitneyu, norm

from .constants import (BAND_MIN_RUNS, BAND_SIGMAS, DEFAULT_ALPHA, DEFAULT_MIN_SAMPLES, DEFAULT_THRESHOLD,
                        MAD_TO_SIGMA)

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


def noise_band(run_medians: Sequence[float], night_sigma: Optional[float] = None,
               sigmas: float = BAND_SIGMAS) -> Optional[Tuple[float, float]]:
    """Range in which a run's median is consistent with the night-to-night spread: that of these runs
    (with at least BAND_MIN_RUNS of them) or `night_sigma` (of log medians, from a longer history),
    whichever is wider; None when neither is known."""
    logs = np.log(np.asarray(run_medians, dtype=float))
    known = [robust_sigma(logs)] if logs.size >= BAND_MIN_RUNS else []
    known += [night_sigma] if night_sigma is not None else []
    if not known or logs.size == 0:
        return None
    centre, s = float(np.median(logs)), max(known)
    return math.exp(centre - sigmas * s), math.exp(centre + sigmas * s)


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
                    night_sigma: Optional[float] = None) -> SampleTest:
    """Verdict of `new` against `base`.

    base_samples: the baseline's repetitions (pooled over runs for a history); base_run_medians: the
    baseline runs' medians, when there are several: the effect is measured against their median and a
    run inside their noise band is never FASTER or SLOWER. night_sigma: the night-to-night spread of the
    log medians measured over the whole history, which widens the band of a short baseline.

    SLOWER / FASTER: U test p < alpha, and median ratio >= 1 + threshold / <= 1 - threshold, and (with a
    history of >= BAND_MIN_RUNS runs) the new median outside the history's noise band.
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
    band = noise_band(meds, night_sigma) if meds else None
    in_band = band is not None and band[0] <= new_med <= band[1]
    significant = p < alpha
    lo_t, hi_t = 1.0 - threshold, 1.0 + threshold
    reason = ""
    if significant and (ratio >= hi_t or ratio <= lo_t) and not in_band:
        verdict = SLOWER if ratio > 1 else FASTER
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

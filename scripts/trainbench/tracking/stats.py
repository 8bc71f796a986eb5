"""The statistics of nightly tracking, on scipy.stats: a benchmark's verdict from repetition samples (Mann-Whitney U,
the effect from medians, the history's noise band) and from interleaved rounds (a paired t test on the per-round
log ratios, the Hodges-Lehmann interval from their Walsh averages). Change points are changepoint.py's."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
from scipy.stats import mannwhitneyu, norm, ttest_1samp
from scipy.stats import t as student_t

from .constants import (BAND_MIN_RUNS, BAND_SIGMAS_BY_RUNS, BAND_TAIL, DEFAULT_ALPHA, DEFAULT_MIN_SAMPLES,
                        DEFAULT_THRESHOLD, MAD_TO_SIGMA, MIN_ROUNDS, ROBUST_MIN_RUNS)

SAME, FASTER, SLOWER, INCONCLUSIVE = "SAME", "FASTER", "SLOWER", "INCONCLUSIVE"


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


def signed_rank_cdf(K: int) -> np.ndarray:
    """P(T <= t), t = 0 .. K(K+1)/2, of the signed-rank statistic T of K values under the null (each sign + or -
    with probability 1/2): counts over the 2^K sign patterns. scipy.stats.wilcoxon(method="exact") computes this
    distribution for its p-value but publishes no quantile of it; the tests hold this one to its p-values."""
    counts = np.zeros(K * (K + 1) // 2 + 1)
    counts[0] = 1.0
    for r in range(1, K + 1):
        counts[r:] = counts[r:] + counts[:-r].copy()
    return np.cumsum(counts) / 2.0 ** K


def walsh_interval(d: Sequence[float], alpha: float) -> Tuple[float, float, float, float]:
    """Hodges-Lehmann estimate of the centre of `d` (median of the Walsh averages (d_i + d_j) / 2, i <= j)
    and its distribution-free interval from the exact signed-rank distribution: the k-th smallest and k-th
    largest Walsh average, k the largest with P(T <= k - 1) <= alpha / 2. Returns (estimate, low, high,
    coverage). With few values the level 1 - alpha cannot be reached (K=4: at most 87.5%): the interval is
    then [min, max] and `coverage` says what it has."""
    d = np.asarray(d, dtype=float)
    K = d.size
    i, j = np.triu_indices(K)
    w = np.sort((d[i] + d[j]) / 2.0)
    est = float(np.median(w))
    cdf = signed_rank_cdf(K)
    k = max(1, int(np.searchsorted(cdf, alpha / 2.0, side="right")))   # P(T <= k-1) <= alpha/2
    k = min(k, (w.size + 1) // 2)
    coverage = 1.0 - 2.0 * float(cdf[k - 1])
    return est, float(w[k - 1]), float(w[w.size - k]), coverage


def paired_rounds_test(old_rounds: Sequence[Sequence[float]], new_rounds: Sequence[Sequence[float]], *,
                       threshold: float = DEFAULT_THRESHOLD, alpha: float = DEFAULT_ALPHA,
                       min_samples: int = DEFAULT_MIN_SAMPLES) -> SampleTest:
    """Verdict of NEW against OLD from per-round samples (old_rounds[r], new_rounds[r]: round r's repetitions).

    Per round, d_r = log(median NEW_r / median OLD_r). The change is the Hodges-Lehmann estimate of the d_r
    (`walsh_interval`), shown as a ratio; its interval comes from the Walsh averages too.

    The test is a one-sample t test of mean(d_r) = 0, i.e. a paired t test on the log ratios. Why not a
    rank test: the signed-rank and the sign test cannot go below p = 2 / 2^K (0.125 at K = 4, 0.0078 only
    from K = 8), so at the compare's alpha of 0.01 they could never find anything in the few rounds a
    pull request can afford. The t test can, and its weak point suits a gate: one wild round inflates the
    spread of the d_r and makes it more conservative (INCONCLUSIVE), never a false SLOWER. The log of a
    ratio of medians of several repetitions is close to normal, which is what the t test needs.

    Rules, as `compare_samples` (same threshold and alpha):
    SLOWER / FASTER: p < alpha and the ratio >= 1 + threshold / <= 1 - threshold.
    SAME: the ratio within +-threshold and either p < alpha (a real but small change) or the Walsh interval
    within +-threshold (with 4 rounds: every round's ratio within it).
    INCONCLUSIVE: anything else, or fewer than 2 rounds, or fewer than min_samples repetitions a side.
    """
    old_rounds = [np.asarray(s, dtype=float) for s in old_rounds]
    new_rounds = [np.asarray(s, dtype=float) for s in new_rounds]
    K = len(old_rounds)
    n_old = int(sum(s.size for s in old_rounds))
    n_new = int(sum(s.size for s in new_rounds))
    old_med = float(np.median(np.concatenate(old_rounds))) if n_old else float("nan")
    new_med = float(np.median(np.concatenate(new_rounds))) if n_new else float("nan")
    d = np.array([math.log(float(np.median(b)) / float(np.median(a))) for a, b in zip(old_rounds, new_rounds)])
    nan2 = (float("nan"), float("nan"))
    if K < MIN_ROUNDS or n_old < min_samples or n_new < min_samples:
        ratio = math.exp(float(np.median(d))) if K else new_med / old_med
        return SampleTest(INCONCLUSIVE, ratio, float("nan"), nan2, old_med, new_med, n_old, n_new, None,
                          f"too few rounds or samples ({K} rounds, {n_new} new, {n_old} baseline samples; "
                          f"need {MIN_ROUNDS} rounds and {min_samples} samples a side)")
    est, lo, hi, _coverage = walsh_interval(d, alpha)
    ratio, ci = math.exp(est), (math.exp(lo), math.exp(hi))
    if float(np.ptp(d)) == 0.0:          # every round the same ratio: no spread to test against
        p = 1.0 if d[0] == 0.0 else 0.0
    else:
        p = float(ttest_1samp(d, 0.0).pvalue)
    lo_t, hi_t = 1.0 - threshold, 1.0 + threshold
    significant = p < alpha
    reason = ""
    if significant and (ratio >= hi_t or ratio <= lo_t):
        verdict = SLOWER if ratio > 1 else FASTER
    elif lo_t < ratio < hi_t and (significant or (ci[0] >= lo_t and ci[1] <= hi_t)):
        verdict = SAME
    else:
        verdict = INCONCLUSIVE
        if not significant:
            reason = (f"not significant over {K} rounds (p={p:.2g}) and too noisy to rule out a "
                      f"{threshold:.0%} change")
        else:
            reason = "too noisy to tell"
    return SampleTest(verdict, ratio, p, ci, old_med, new_med, n_old, n_new, None, reason)


def round_residual_spread(rates: Sequence[Sequence[float]]) -> Tuple[float, int]:
    """The spread that interleaved rounds leave to a comparison: rates[i][r] is finalist i's rate in round r (a
    finalist dropped early has fewer rounds). The log rates are fitted as finalist level + round level (least
    squares over the cells present), and the residuals' standard deviation is returned with its degrees of freedom,
    cells - finalists - rounds + 1: what is left once each finalist's own speed and each round's shared level (the
    machine that round) are taken out. A range over a few rounds grows with their number and with the machine's
    drift between rounds; this does neither. (nan, 0) where no degree of freedom is left."""
    rows = [[math.log(x) for x in row] for row in rates if len(row) >= 2]
    rounds = max((len(row) for row in rows), default=0)
    cells = [(i, r, y) for i, row in enumerate(rows) for r, y in enumerate(row)]
    dof = len(cells) - len(rows) - rounds + 1
    if not rows or dof <= 0:
        return float("nan"), 0
    # One column per finalist, one per round after the first (the first's level is the finalists' own: the model's
    # one free constant), fitted by least squares over the cells present.
    design = np.zeros((len(cells), len(rows) + rounds - 1))
    for k, (i, r, _) in enumerate(cells):
        design[k, i] = 1.0
        if r > 0:
            design[k, len(rows) + r - 1] = 1.0
    logs = np.array([y for _, _, y in cells])
    fit, *_ = np.linalg.lstsq(design, logs, rcond=None)
    residuals = logs - design @ fit
    return math.sqrt(float(residuals @ residuals) / dof), dof

"""The per-benchmark verdict from repetition samples, and change-point detection on per-run medians."""

import math

import numpy as np
import pytest

from trainbench.tracking.changepoint import detect_change_points, segments
from trainbench.tracking.stats import FASTER, INCONCLUSIVE, SAME, SLOWER, compare_samples, round_residual_spread


def samples(seed, n=10, level=1e6, sigma=0.01):
    return level * np.exp(np.random.default_rng(seed).normal(0, sigma, n))


def test_identical_samples_are_same():
    s = samples(1)
    t = compare_samples(s, s)
    assert (t.verdict, t.ratio, t.p_value) == (SAME, 1.0, pytest.approx(1.0))


@pytest.mark.parametrize("factor, verdict", [(1.30, SLOWER), (1.06, SLOWER), (0.70, FASTER), (0.94, FASTER),
                                             (1.03, SAME), (0.98, SAME)])
def test_verdict_by_effect_size(factor, verdict):
    t = compare_samples(samples(1), samples(2) * factor)
    assert t.verdict == verdict


def test_threshold_decides_what_counts():
    assert compare_samples(samples(1), samples(2) * 1.3, threshold=0.4).verdict == SAME
    assert compare_samples(samples(1), samples(2) * 1.03, threshold=0.02).verdict == SLOWER


def test_too_few_samples_is_inconclusive():
    t = compare_samples(samples(1, n=4), samples(2, n=4) * 1.5)
    assert t.verdict == INCONCLUSIVE
    assert t.reason == "too few samples (4 new, 4 baseline; need 5)"
    # 4 against 4 can never reach p < 0.01 (the smallest exact p is 2/70); at alpha 0.05 it can
    assert compare_samples(samples(1, n=4), samples(2, n=4) * 1.5, min_samples=4).verdict == INCONCLUSIVE
    assert compare_samples(samples(1, n=4), samples(2, n=4) * 1.5, min_samples=4, alpha=0.05).verdict == SLOWER


def test_noise_makes_it_inconclusive():
    t = compare_samples(samples(1, sigma=0.3), samples(2, sigma=0.3) * 1.07)
    assert t.verdict == INCONCLUSIVE


def test_a_run_inside_the_history_noise_band_is_never_slower():
    meds = list(1e6 * np.exp(np.random.default_rng(3).normal(0, 0.05, 20)))
    base = np.concatenate([m * np.exp(np.random.default_rng(i).normal(0, 0.005, 10)) for i, m in enumerate(meds)])
    new = samples(9, sigma=0.005) * 1.08 * np.median(meds) / 1e6
    t = compare_samples(base, new, base_run_medians=meds)
    assert t.band is not None and t.band[1] > t.new_median
    assert t.verdict == INCONCLUSIVE
    assert t.reason == "within the history's night-to-night noise"


def series(seed, n, sigma=0.004):
    return list(np.exp(np.random.default_rng(seed).normal(0, sigma, n)))


def stepped(seed, n, at, step):
    return [v * (1 + step if i >= at else 1) for i, v in enumerate(series(seed, n))]


def test_no_change_point_in_a_flat_series():
    for seed in range(10):
        assert detect_change_points(series(seed, 40), 0.05) == []


@pytest.mark.parametrize("at", [2, 7, 15, 25, 28])
@pytest.mark.parametrize("step", [0.08, 0.30, -0.10])
def test_a_step_is_found_where_it_starts(at, step):
    cps = detect_change_points(stepped(at, 30, at, step), 0.05)
    assert [c.index for c in cps] == [at]
    assert cps[0].ratio == pytest.approx(1 + step, abs=0.01)


def test_one_night_alone_is_never_a_change_point():
    for at in (0, 10, 28, 29):
        x = series(at, 30)
        x[at] *= 1.5
        assert detect_change_points(x, 0.05) == [], at
    assert detect_change_points(stepped(4, 30, 29, 0.5), 0.05) == []


def test_a_regression_and_its_fix_are_two_change_points():
    x = [v * (1.2 if 10 <= i < 16 else 1.0) for i, v in enumerate(series(5, 30))]
    cps = detect_change_points(x, 0.05)
    assert [c.index for c in cps] == [10, 16]
    assert [list(r) for r in segments(30, cps)] == [list(range(10)), list(range(10, 16)), list(range(16, 30))]


def test_a_shift_below_the_threshold_is_no_change_point():
    assert detect_change_points(stepped(6, 30, 15, 0.03), 0.05) == []
    assert [c.index for c in detect_change_points(stepped(6, 30, 15, 0.03), 0.02)] == [15]


def test_round_residual_spread_takes_out_each_finalists_speed_and_each_rounds_level():
    speed, level = [1000.0, 1500.0, 2200.0], [1.0, 0.9, 1.1, 0.95]
    exact = [[s * l for l in level] for s in speed]
    spread, dof = round_residual_spread(exact)
    assert spread == pytest.approx(0.0, abs=1e-9) and dof == (3 - 1) * (4 - 1)
    # a finalist dropped after two rounds leaves fewer cells, and still no spread
    spread, dof = round_residual_spread(exact[:2] + [exact[2][:2]])
    assert spread == pytest.approx(0.0, abs=1e-9) and dof == 10 - 3 - 4 + 1


def test_round_residual_spread_recovers_the_noise_that_is_not_shared():
    rng = np.random.default_rng(7)
    finalists, rounds, sigma = 8, 200, 0.02
    level = np.exp(rng.normal(0, 0.10, rounds))  # the machine's drift: shared, taken out
    rates = [[1e4 * (1 + i / 10) * level[r] * math.exp(rng.normal(0, sigma)) for r in range(rounds)]
             for i in range(finalists)]
    spread, dof = round_residual_spread(rates)
    assert dof == (finalists - 1) * (rounds - 1)
    assert spread == pytest.approx(sigma, rel=0.05)


def test_round_residual_spread_needs_a_degree_of_freedom():
    assert round_residual_spread([[1.0, 2.0]])[1] == 0
    assert math.isnan(round_residual_spread([])[0])

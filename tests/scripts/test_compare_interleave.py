"""scripts/compare --interleave: the paired per-round statistics, and runs of the fake and the real benchsuite."""

import json
import os
import subprocess
import tempfile

import numpy as np
import pytest

import synth
from conftest import FAKE_BENCHSUITE, REPO, SCRIPTS, by_name, slower_benchsuite
from trainbench.tracking.compare import Settings
from trainbench.tracking.interleave import compare_interleaved
from trainbench.tracking.resultfile import parse_run
from trainbench.tracking.stats import (FASTER, INCONCLUSIVE, SAME, SLOWER, paired_rounds_test, signed_rank_cdf,
                                      walsh_interval)

PEAK, FUSED, PER_TENSOR, ATTN = synth.names()
# the real benchsuite: $TRAINBENCH_BENCHSUITE, else the build folder ctest's scripts_pytest builds beside
REAL_BENCHSUITE = os.environ.get("TRAINBENCH_BENCHSUITE") or os.path.join(REPO, "build", "benches", "benchsuite")


def drifting_rounds(seed, factor=1.0, rounds=4, reps=5, sigma=0.01, level=1e6):
    """Per-round samples of OLD and NEW (NEW = OLD x factor) on a machine whose speed shifts whole rounds
    by 10-20% (up or down), the same for both builds within a round."""
    rng = np.random.default_rng(seed)
    old, new = [], []
    for _ in range(rounds):
        drift = rng.choice([-1, 1]) * rng.uniform(0.10, 0.20)
        base = level * (1 + drift)
        old.append(base * np.exp(rng.normal(0, sigma, reps)))
        new.append(base * factor * np.exp(rng.normal(0, sigma, reps)))
    return old, new


@pytest.mark.parametrize("seed", range(20))
def test_drift_of_whole_rounds_cancels(seed):
    old, new = drifting_rounds(seed)
    t = paired_rounds_test(old, new)
    assert t.verdict in (SAME, INCONCLUSIVE)
    assert t.verdict == SAME            # 1% noise: every round's ratio is well inside 5%


@pytest.mark.parametrize("seed", range(20))
def test_a_real_10_percent_slowdown_under_the_same_drift_is_slower(seed):
    old, new = drifting_rounds(seed, factor=1.10)
    t = paired_rounds_test(old, new)
    assert t.verdict == SLOWER, t
    assert t.ratio == pytest.approx(1.10, rel=0.02) and t.p_value < 0.01
    assert 1.05 < t.ci[0] <= t.ratio <= t.ci[1] < 1.15   # 4 rounds: [min, max] of the ratios (87.5%)
    assert paired_rounds_test(*drifting_rounds(seed, factor=0.90)).verdict == FASTER


def test_a_change_below_the_threshold_is_never_slower():
    for seed in range(10):
        assert paired_rounds_test(*drifting_rounds(seed, factor=1.03)).verdict == SAME


def test_one_wild_round_makes_it_inconclusive_not_slower():
    old, new = drifting_rounds(1)
    new[2] = new[2] * 1.5
    t = paired_rounds_test(old, new)
    assert t.verdict == INCONCLUSIVE and "not significant over 4 rounds" in t.reason


def test_too_few_rounds_or_samples_are_inconclusive():
    old, new = drifting_rounds(1, factor=1.3, rounds=1)
    assert paired_rounds_test(old, new).verdict == INCONCLUSIVE
    old, new = drifting_rounds(1, factor=1.3, rounds=2, reps=2)
    t = paired_rounds_test(old, new)
    assert t.verdict == INCONCLUSIVE and "need 2 rounds and 5 samples a side" in t.reason


def test_walsh_interval():
    d = [0.1, 0.2, 0.3, 0.4]
    est, lo, hi, cov = walsh_interval(d, 0.01)
    assert est == pytest.approx(0.25)
    assert (lo, hi, cov) == (pytest.approx(0.1), pytest.approx(0.4), pytest.approx(1 - 2 / 16))
    # 10 values at alpha 0.01: P(T <= 3) = 5/1024 <= 0.005 < P(T <= 4): the 4th smallest / largest average
    d = np.arange(10, dtype=float)
    est, lo, hi, cov = walsh_interval(d, 0.01)
    i, j = np.triu_indices(10)
    w = np.sort((d[i] + d[j]) / 2)
    assert (est, lo, hi) == (pytest.approx(4.5), w[3], w[-4]) and cov == pytest.approx(1 - 10 / 1024)



@pytest.mark.parametrize("K", [1, 2, 4, 7, 12])
def test_the_signed_rank_distribution_is_scipys(K):
    """walsh_interval's quantiles come from the signed-rank null distribution that scipy.stats.wilcoxon's exact
    p-value uses: P(T+ <= t) is wilcoxon's one-sided p of values whose positive ranks sum to t."""
    from scipy.stats import wilcoxon
    cdf = signed_rank_cdf(K)
    rng = np.random.default_rng(K)
    for _ in range(30):
        x = np.arange(1, K + 1) * rng.choice([-1, 1], K)
        t_plus = int(np.sum(np.arange(1, K + 1)[x > 0]))
        assert cdf[t_plus] == pytest.approx(wilcoxon(x, method="exact", alternative="less").pvalue, abs=1e-12)
    assert cdf[-1] == pytest.approx(1.0)


def run(seed, **kw):
    return parse_run(synth.make_run(seed, **kw), f"r{seed}.json")


def test_rows_that_did_not_pass_in_some_round_are_listed_not_judged():
    rounds = [(run(1), run(2)),
              (run(3), run(4, dispositions={PEAK: ("incorrect", "max error 0.1")})),
              (run(5, dispositions={FUSED: ("failed", "out of memory")}), run(6))]
    del rounds[2][1].rows[ATTN]
    a = compare_interleaved(rounds, Settings())
    res = {c.key: c for c in a.comparisons}
    assert (res[PEAK].status, res[PEAK].verdict, res[PEAK].disposition) == ("not-passed", None, "incorrect")
    assert res[PEAK].reason == "round 2 new: max error 0.1"
    assert (res[FUSED].status, res[FUSED].reason) == ("not-passed", "round 3 old: out of memory")
    assert (res[ATTN].status, res[ATTN].notes) == ("missing", ["not in round 3 new"])
    assert res[PER_TENSOR].verdict == SAME
    assert a.exit_code == 0 and a.rounds == 3


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for k in [k for k in os.environ if k.startswith("FAKE_BENCH_")]:
        monkeypatch.delenv(k)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def test_a_build_against_itself_is_same_in_abba_order(cli, clean_env, tmp_path, monkeypatch):
    argv_log = tmp_path / "argv.jsonl"
    monkeypatch.setenv("FAKE_BENCH_ARGV", str(argv_log))
    rc, out, err = cli("compare", "--interleave", FAKE_BENCHSUITE, FAKE_BENCHSUITE, "--",
                       "--backend", "cpu", "--quick")
    assert rc == 0, err
    assert "interleaved: 4 rounds (ABBA)" in out
    assert "no confirmed regression (4 SAME, 0 FASTER, 0 SLOWER, 0 INCONCLUSIVE)" in out
    progress = [line for line in err.splitlines() if line.startswith("compare: round")]
    assert [line.split(":")[1].strip() + " " + line.split(":")[2].split()[0] for line in progress] == [
        "round 1/4 old", "round 1/4 new", "round 2/4 new", "round 2/4 old",
        "round 3/4 old", "round 3/4 new", "round 4/4 new", "round 4/4 old"]
    runs = [json.loads(line) for line in argv_log.read_text().splitlines()]
    assert len(runs) == 8 and all(r[0] == "--out" and r[2:] == ["--backend", "cpu", "--quick"] for r in runs)
    assert os.listdir(clean_env) == []          # temporary result files removed


def test_a_slower_build_is_slower_and_exits_1(cli, clean_env, tmp_path):
    new = slower_benchsuite(tmp_path, "peak=1.3")
    rc, out, _ = cli("compare", "--interleave", FAKE_BENCHSUITE, new, "--rounds", "2", "--format", "json",
                     "--", "--backend", "cpu")
    doc = json.loads(out)
    assert rc == 1 and doc["mode"] == "interleaved" and doc["rounds"] == 2
    res = by_name(out)
    assert (res[PEAK]["verdict"], res[PEAK]["confirmed_regression"]) == ("SLOWER", True)
    assert res[PEAK]["ratio"] == pytest.approx(1.3)
    assert {res[k]["verdict"] for k in (FUSED, PER_TENSOR, ATTN)} == {"SAME"}
    rc, out, _ = cli("compare", "--interleave", FAKE_BENCHSUITE, new, "--rounds", "2", "--format", "markdown",
                     "--", "--backend", "cpu")
    assert rc == 1 and out.startswith("### trainbench interleaved A/B, 2 rounds: 1 confirmed regression")


def test_incorrect_rows_are_reported(cli, clean_env, monkeypatch):
    monkeypatch.setenv("FAKE_BENCH_FAIL", "peak")
    rc, out, _ = cli("compare", "--interleave", FAKE_BENCHSUITE, FAKE_BENCHSUITE, "--rounds", "2", "--",
                     "--backend", "cpu")
    assert rc == 0
    line = next(line for line in out.splitlines() if line.startswith(PEAK))
    assert "not compared" in line and "incorrect: round 1 old: max error" in line
    assert "warning: benchsuite exited 1 (a variant incorrect or a benchmark failed) in round 1 old" in out


def test_a_failed_run_stops_with_its_message(cli, clean_env, monkeypatch):
    monkeypatch.setenv("FAKE_BENCH_EXIT", "2")
    rc, out, err = cli("compare", "--interleave", FAKE_BENCHSUITE, FAKE_BENCHSUITE, "--", "--backend", "cpu")
    assert rc == 2 and out == ""
    assert "compare: error: benchsuite rejected its arguments (exit 2): " in err
    assert "benchsuite: error: simulated failure" in err
    assert os.listdir(clean_env) == []


def test_interleave_usage_errors(cli, tmp_path):
    rc, _, err = cli("compare", "--interleave", FAKE_BENCHSUITE, FAKE_BENCHSUITE, "--rounds", "1")
    assert rc == 2 and "--rounds must be at least 2" in err
    rc, _, err = cli("compare", "--interleave", tmp_path / "nope", FAKE_BENCHSUITE)
    assert rc == 2 and f"benchsuite not found at {tmp_path / 'nope'}" in err
    rc, _, err = cli("compare", "a.json", "b.json", "--", "--quick")
    assert rc == 2 and "benchsuite arguments after -- need --interleave" in err


@pytest.mark.skipif(not os.access(REAL_BENCHSUITE, os.X_OK),
                    reason=f"no benchsuite at {REAL_BENCHSUITE} (build it, or set TRAINBENCH_BENCHSUITE)")
def test_real_benchsuite_against_itself():
    # a few seconds on an idle machine; the timeout leaves room for a loaded one
    p = subprocess.run([os.path.join(SCRIPTS, "compare"), "--interleave", REAL_BENCHSUITE, REAL_BENCHSUITE,
                        "--rounds", "2", "--", "--backend", "cpu", "--filter", "peak/cpu/copy",
                        "--axis", "peak.n=4000000", "--repetitions", "3", "--min-time", "0.02"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "interleaved: 2 rounds (ABBA)" in p.stdout
    assert "peak/cpu/copy/n=4000000" in p.stdout
    assert "SLOWER" not in p.stdout.replace("0 SLOWER", "")
    assert p.stderr.count("compare: round ") == 4

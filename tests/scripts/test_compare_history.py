"""scripts/compare against a history: A/A, injected steps, a noisy night, clocks, machine change."""

import json
import os

import pytest

import synth
from conftest import by_name, scaled, write_json
from trainbench.tracking.resultfile import parse_run
from trainbench.tracking.stats import INCONCLUSIVE, SAME
from trainbench.tracking.compare import Settings, compare_history

PEAK, FUSED, PER_TENSOR, ATTN = synth.names()


def runs(nights, seed, **kw):
    """Like synth.history, in memory."""
    out = []
    for i in range(nights):
        f = (1 + kw.get("step", 0.0)) if kw.get("step_at") is not None and i >= kw["step_at"] else 1.0
        f *= (1 + kw.get("outlier", 0.4)) if kw.get("outlier_at") == i else 1.0
        doc = synth.make_run(seed * 1000 + i, i, scale={kw.get("target", "peak"): f},
                             run_sigma=kw.get("run_sigma", synth.RUN_SIGMA),
                             sample_sigma=kw.get("sample_sigma", synth.SAMPLE_SIGMA))
        out.append(parse_run(doc, synth.file_name(doc)))
    return out


def latest(history, settings=None, key=PEAK):
    a = compare_history(history[:-1], history[-1], settings or Settings())
    return a, next(c for c in a.comparisons if c.key == key)


def starts(a, c):
    return [a.runs[i].name for i, _ in c.change_points]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_a_history_is_only_same_or_inconclusive_every_night(seed):
    h = runs(30, seed)
    for night in range(1, 30):
        a = compare_history(h[:night], h[night], Settings())
        assert a.exit_code == 0
        for c in a.comparisons:
            assert c.verdict in (SAME, INCONCLUSIVE), (night, c.key, c.verdict)
            assert c.change_points == [] and not c.confirmed


def test_a_noisy_machine_never_confirms_a_regression_in_a_a():
    for seed in (11, 12, 508):      # 508: two nights 6% above a single first night
        h = runs(30, seed, run_sigma=0.02, sample_sigma=0.03)
        for night in range(1, 30):
            assert compare_history(h[:night], h[night], Settings()).regressions == []


@pytest.mark.parametrize("step, at, threshold", [
    (0.05, 24, "3"), (0.05, 28, "3"),
    (0.08, 24, None), (0.08, 28, None),
    (0.10, 25, None), (0.20, 27, None), (0.30, 28, None), (0.30, 23, None),
])
def test_an_injected_step_is_confirmed_with_its_start(tmp_path, cli, step, at, threshold):
    folder = tmp_path / synth.CPU_KEY
    paths = synth.history(str(folder), 30, seed=int(step * 100) + at, step_at=at, step=step)
    args = ["compare", folder, paths[-1], "--format", "json"] + (["--threshold", f"peak={threshold}"] if threshold else [])
    rc, out, err = cli(*args)
    res = by_name(out)
    assert rc == 1, err
    c = res[PEAK]
    assert (c["verdict"], c["confirmed_regression"]) == ("SLOWER", True)
    assert c["shift_start"] == os.path.basename(paths[at])
    assert [cp["run"] for cp in c["change_points"]] == [os.path.basename(paths[at])]
    assert c["ratio"] == pytest.approx(1 + step, abs=0.02)
    assert all(res[k]["verdict"] == "SAME" and not res[k]["change_points"] for k in (FUSED, PER_TENSOR, ATTN))


def test_a_5_percent_step_against_the_default_5_percent_threshold_is_not_guessed():
    """A step exactly at the threshold is a coin flip; the tests above lower the threshold for it."""
    assert Settings().threshold == 0.05


def test_the_first_slow_night_is_slower_but_not_yet_confirmed(cli, tmp_path):
    folder = tmp_path / synth.CPU_KEY
    paths = synth.history(str(folder), 30, seed=5, step_at=29, step=0.3)
    rc, out, _ = cli("compare", folder, paths[-1], "--format", "json")
    c = by_name(out)[PEAK]
    assert rc == 0
    assert (c["verdict"], c["confirmed_regression"], c["change_points"]) == ("SLOWER", False, [])
    assert c["notes"] == ["not confirmed yet: a regression needs 2 consecutive slower runs"]
    rc, out, _ = cli("compare", folder, paths[-1], "--persist", "1", "--format", "json")
    assert rc == 1 and by_name(out)[PEAK]["shift_start"] == os.path.basename(paths[29])


@pytest.mark.parametrize("night", [5, 15, 27])
def test_a_single_noisy_night_in_the_history_is_not_flagged(night):
    h = runs(30, 40 + night, outlier_at=night, outlier=0.5)
    a, c = latest(h)
    assert (c.verdict, c.confirmed, c.change_points, a.exit_code) == (SAME, False, [], 0)


def test_a_noisy_last_night_is_slower_but_not_a_regression_and_is_gone_the_next_night():
    h = runs(31, 60, outlier_at=29, outlier=0.5)
    a, c = latest(h[:30])
    assert (c.verdict, c.confirmed, a.exit_code) == ("SLOWER", False, 0)
    a, c = latest(h)
    assert (c.verdict, c.confirmed, c.change_points, a.exit_code) == (SAME, False, [], 0)


def test_an_old_step_settles_into_the_new_level():
    h = runs(30, 70, step_at=10, step=0.1)
    a, c = latest(h)
    assert (c.verdict, c.confirmed, a.exit_code) == (SAME, False, 0)
    assert starts(a, c) == [h[10].name]
    assert len(c.notes) == 1 and c.notes[0].startswith("level +")
    assert c.notes[0].endswith("% (slower) since 2026-10-11 03:00 c00000a")
    assert c.change_points[0][1].ratio == pytest.approx(1.1, abs=0.01)
    a, c = latest(h, Settings(settle_runs=0))
    assert (c.verdict, c.confirmed, a.runs[c.start_index].name) == ("SLOWER", True, h[10].name)


def _fixed(h, night, factor):
    for r in h[night:]:
        r.rows[PEAK].samples = [s / factor for s in r.rows[PEAK].samples]
    return h


def test_a_regression_and_its_fix():
    h = _fixed(runs(30, 80, step_at=20, step=0.2), 27, 1.2)     # slower from night 20, fixed on night 27
    a, c = latest(h)
    assert starts(a, c) == [h[20].name]       # 3 fixed nights after 7 slow ones: too few for a change point
    assert (c.verdict, c.confirmed, a.runs[c.start_index].name, a.exit_code) == ("FASTER", False, h[27].name, 0)
    h = _fixed(runs(30, 81, step_at=12, step=0.2), 20, 1.2)     # fixed long ago: two change points
    a, c = latest(h)
    assert starts(a, c) == [h[12].name, h[20].name]
    assert (c.verdict, c.confirmed, c.start_index, a.exit_code) == (SAME, False, None, 0)


def test_a_short_history_confirms_from_the_streak():
    for n in (5, 8):
        h = runs(n + 2, 90 + n, step_at=n, step=0.1)
        a, c = latest(h)
        assert (c.verdict, c.confirmed, a.runs[c.start_index].name) == ("SLOWER", True, h[n].name), n


def test_a_history_younger_than_a_noise_band_never_says_slower():
    """Under 5 runs the samples show the repetitions' noise, not the night-to-night drift: no verdict, so a
    young history is never more easily alarmed than an old one (even a real 10% step waits for the band)."""
    for n in (1, 2, 3, 4):
        h = runs(n + 2, 90 + n, step_at=n, step=0.1)
        a, c = latest(h)
        assert (c.verdict, c.confirmed, a.exit_code) == (INCONCLUSIVE, False, 0), n
        if n == 3:      # (2 against 2 is not even significant; at 4 the first slow night joins the baseline)
            assert "cannot tell a change from night-to-night drift (a noise band needs 5" in " ".join(c.notes), n
    h = runs(3, 91, step_at=1, step=0.1)          # one night of baseline is not enough to confirm:
    a, c = latest(h)                              # against both earlier nights, the new one is between
    assert (c.verdict, c.confirmed, c.start_index) == (INCONCLUSIVE, False, None)


def test_a_long_streak_on_a_short_history_settles_too():
    h = runs(14, 95, step_at=5, step=0.1)       # too few fast runs for a change point: the streak says it
    a, c = latest(h[:12])
    assert (c.verdict, c.confirmed, a.runs[c.start_index].name) == ("SLOWER", True, h[5].name)
    a, c = latest(h)                            # 9 slow runs > --settle-runs 7
    assert (c.verdict, c.confirmed, c.start_index) == (SAME, False, None)


def test_a_clock_drop_across_nights_is_the_environment(cli, tmp_path):
    folder = tmp_path / synth.GPU_KEY
    paths = synth.history(str(folder), 20, seed=6, backend="cuda", target="*", step_at=17, step=1980 / 1500 - 1,
                          clocks={17: 1500, 18: 1500, 19: 1500})
    rc, out, _ = cli("compare", folder, paths[-1], "--format", "json")
    assert rc == 0
    for c in by_name(out).values():
        assert (c["verdict"], c["confirmed_regression"], c["environment"]) == ("SLOWER", False, "SM clock 1980 -> 1500 MHz")
    folder2 = tmp_path / "code"         # the clock dropped, and adamw got slower beyond what the clock explains
    for i in range(20):
        scale = {"*": 1980 / 1500, "adamw": 1.6} if i >= 17 else {}
        synth.write(synth.make_run(6000 + i, i, backend="cuda", scale=scale, clock_mhz=1500 if i >= 17 else None),
                    str(folder2))
    last = sorted(p for p in os.listdir(folder2))[-1]
    rc, out, _ = cli("compare", folder2, folder2 / last, "--format", "json")
    assert rc == 1
    res = by_name(out)
    assert {k for k, c in res.items() if c["confirmed_regression"]} == {k for k in res if k.startswith("adamw/")}
    assert {c["environment"] for k, c in res.items() if not k.startswith("adamw/")} == {"SM clock 1980 -> 1500 MHz"}


def test_rows_that_did_not_pass_are_skipped_in_the_series_and_never_compared(cli, tmp_path):
    folder = tmp_path / synth.CPU_KEY
    for i in range(12):
        disp = {PEAK: ("failed", "timeout")} if i in (3, 4) else {}
        disp.update({FUSED: ("incorrect", "max error 1e-2")} if i == 11 else {})
        synth.write(synth.make_run(100 + i, i, dispositions=disp, scale={"peak": 1.3 if i >= 10 else 1.0}), str(folder))
    last = sorted(os.listdir(folder))[-1]
    rc, out, _ = cli("compare", folder, folder / last, "--format", "json")
    res = by_name(out)
    assert rc == 1
    assert (res[PEAK]["verdict"], res[PEAK]["confirmed_regression"]) == ("SLOWER", True)
    assert (res[FUSED]["status"], res[FUSED]["verdict"], res[FUSED]["disposition"]) == ("not-passed", None, "incorrect")


def test_a_history_of_another_machine_is_refused(cli, tmp_path):
    folder = tmp_path / synth.CPU_KEY
    synth.history(str(folder), 5, seed=7)
    other = write_json(tmp_path / "new.json", scaled(synth.make_run(1, 9, cpu={"cpu_model": "Intel Xeon Platinum 8480+"}), 1.3))
    rc, out, err = cli("compare", folder, other)
    assert rc == 2 and out == ""
    assert f"holds runs of {synth.CPU_KEY}, not of this run's machine intel-xeon-platinum-8480_2c" in err


def test_unreadable_and_foreign_history_files_are_skipped_with_a_warning(cli, tmp_path):
    folder = tmp_path / synth.CPU_KEY
    paths = synth.history(str(folder), 8, seed=8)
    (folder / "20261002T120000Z_broken.json").write_text("{")
    synth.write(synth.make_run(3, 3, backend="cuda"), str(folder), "20261003T120000Z_gpu.json")
    rc, out, _ = cli("compare", folder, paths[-1], "--format", "json")
    doc = json.loads(out)
    assert rc == 0
    assert len(doc["baseline_runs"]) == 7
    assert any("broken.json: not valid JSON" in w for w in doc["warnings"])
    assert any(f"machine {synth.GPU_KEY}, not {synth.CPU_KEY}" in w for w in doc["warnings"])


def test_runs_newer_than_the_compared_one_are_left_out(cli, tmp_path):
    folder = tmp_path / synth.CPU_KEY
    paths = synth.history(str(folder), 10, seed=9)
    rc, out, _ = cli("compare", folder, paths[4], "--format", "json")
    doc = json.loads(out)
    assert rc == 0 and len(doc["baseline_runs"]) == 4
    assert "ignored 5 run(s)" in doc["warnings"][0]


def test_the_console_table_of_a_history(tmp_path, cli):
    folder = tmp_path / synth.CPU_KEY
    paths = synth.history(str(folder), 20, seed=10, step_at=17, step=0.2)
    rc, out, _ = cli("compare", folder, paths[-1])
    assert rc == 1
    assert "history: 19 runs, 2026-10-01 03:00 c000000 .. 2026-10-19 03:00 c000012" in out
    line = next(line for line in out.splitlines() if line.startswith(PEAK))
    assert "SLOWER" in line and "CONFIRMED REGRESSION; since 2026-10-18 03:00 c000011" in line

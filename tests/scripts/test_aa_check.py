"""scripts/aa-check: one build against itself, the false alarms of each comparison mode counted."""

import json
import os

import numpy as np

import synth
from conftest import FAKE_BENCHSUITE, run_script


def drifting_runs(folder, n, seed, drift=0.15):
    """n runs of one unchanged build on a machine whose speed moves the whole run by up to +-drift."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    for k in range(n):
        doc = synth.make_run(seed * 1000 + k, k, scale={"*": float(rng.uniform(1 - drift, 1 + drift))})
        synth.write(doc, str(folder), f"{k + 1:03d}.json")


def modes(out):
    return {m["mode"]: m for m in json.loads(out)["modes"]}


def test_whole_run_drift_raises_no_false_alarm_in_any_mode(cli, tmp_path):
    drifting_runs(tmp_path / "runs", 32, seed=4)           # 4 comparisons of 4 rounds
    rc, out, err = cli("aa-check", "--input", tmp_path / "runs", "--rounds", "4", "--format", "json")
    assert rc == 0, err
    m = modes(out)
    assert (m["interleaved"]["comparisons"], m["files"]["comparisons"]) == (4, 16)
    assert (m["history (young)"]["comparisons"], m["history"]["comparisons"]) == (4, 27)
    for mode in ("interleaved", "history", "history (young)", "files"):
        assert m[mode]["rows"] > 0
        assert m[mode]["slower"] + m[mode]["faster"] == 0, (mode, m[mode]["examples"])
        assert m[mode]["failing_comparisons"] == 0


def test_the_rates_and_max_rate(cli, tmp_path):
    drifting_runs(tmp_path / "runs", 8, seed=5, drift=0.0)
    doc = json.loads((tmp_path / "runs" / "008.json").read_text())
    for row in doc["benchmarks"]:                       # the last run: one stage 40% slower, as a false alarm would be
        if row["stage"] == "attention":
            row["samples_ns"] = [s * 1.4 for s in row["samples_ns"]]
    (tmp_path / "runs" / "008.json").write_text(json.dumps(doc))
    rc, out, _ = cli("aa-check", "--input", tmp_path / "runs", "--rounds", "2", "--format", "json")
    m = modes(out)
    assert rc == 0
    assert (m["files"]["slower"], m["files"]["rows"]) == (1, 16)
    assert m["files"]["examples"][0].startswith("runs 7-8: attention/cpu/fused/seq=256,d_model=768 SLOWER +")
    assert m["history"]["slower"] == 1 and m["history"]["false_alarm_rate"] == 1 / m["history"]["rows"]
    rc, out, err = cli("aa-check", "--input", tmp_path / "runs", "--rounds", "2", "--max-rate", "1")
    assert rc == 1 and "aa-check: above --max-rate: history" in err
    assert "false alarms" in out and "| mode |" not in out


def test_aa_check_runs_the_build_and_keeps_the_runs(tmp_path):
    keep = tmp_path / "kept"
    proc = run_script("aa-check", "--benchsuite", FAKE_BENCHSUITE, "--comparisons", "1", "--rounds", "2",
                      "--keep", keep, "--format", "markdown", "--", "--backend", "cpu", "--quick")
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(keep)) == ["001.json", "002.json", "003.json", "004.json"]
    assert "aa-check: run 4/4 (comparison 1/1, round 2/2)" in proc.stderr
    assert proc.stdout.startswith("A/A: one build against itself, 4 runs (2 rounds per interleaved comparison); "
                                  "benchsuite --repetitions 7 --backend cpu --quick")
    assert "| interleaved | 1 | 4 | 0 | 0 | 0.0% | 0 |" in proc.stdout
    assert "| history, --confirm-with | 0 | 0 | 0 | 0 | - | 0 |" in proc.stdout


def test_aa_check_usage_errors(cli, tmp_path):
    rc, _, err = cli("aa-check", "--rounds", "1", "--input", tmp_path)
    assert rc == 2 and "--rounds must be at least 2" in err
    rc, _, err = cli("aa-check", "--input", tmp_path, "--", "--quick")
    assert rc == 2 and "make no sense with --input" in err
    rc, _, err = cli("aa-check", "--input", tmp_path / "nowhere")
    assert rc == 2 and "not a directory" in err
    drifting_runs(tmp_path / "odd", 3, seed=1)
    rc, _, err = cli("aa-check", "--input", tmp_path / "odd", "--rounds", "2")
    assert rc == 2 and "3 runs do not make whole comparisons of 2 rounds" in err
    rc, _, err = cli("aa-check", "--benchsuite", FAKE_BENCHSUITE, "--", "--out", "x.json")
    assert rc == 2 and "aa-check sets them itself" in err


def test_history_regressions_are_checked_again_as_nightly_confirm_with_would(tmp_path):
    from trainbench.tracking import aa
    from trainbench.tracking.compare import Settings
    folder = tmp_path / "runs"
    drifting_runs(folder, 8, seed=6, drift=0.0)
    for name in ("007.json", "008.json"):              # an episode of two slow runs of one stage
        doc = json.loads((folder / name).read_text())
        for row in doc["benchmarks"]:
            if row["stage"] == "attention":
                row["samples_ns"] = [s * 1.4 for s in row["samples_ns"]]
                row["median_ns"] *= 1.4
        (folder / name).write_text(json.dumps(doc))
    runs = aa.load_folder(str(folder))
    checked = []

    def machine_not_code(a, where):                     # the interleaved check finds both builds alike
        checked.append((where, [c.key for c in a.regressions]))
        for c in a.regressions:
            c.confirmed = False
    rates = {r.mode: r for r in aa.analyse(runs, 2, Settings(), machine_not_code)}
    attention = [n for n in synth.names() if n.startswith("attention/")]
    assert checked == [("run 8", attention)]
    assert rates["history"].failing == 1
    confirmed = rates["history, --confirm-with"]
    assert (confirmed.comparisons, confirmed.failing, confirmed.slower) == (3, 0, 0)
    assert confirmed.rows == rates["history"].rows
    assert "history, --confirm-with" not in {r.mode for r in aa.analyse(runs, 2, Settings())}

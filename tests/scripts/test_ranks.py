"""Several ranks under mpirun on the CPU: the all-reduce stage (MPI_Allreduce across 2 processes,
with bus bandwidth), autotune --ranks 2 (the data-parallel step on every rank) and --predict (its model
against a measured 2-rank run: its arithmetic and that its error is reported, not the error's size, which
depends on the machine's load). Needs the built binaries and Open MPI: ctest's ranks_pytest passes
them in; elsewhere these tests skip."""

import json
import os
import shutil
import subprocess

import pytest

from conftest import assert_gone_within, live_processes

BENCHSUITE = os.environ.get("TRAINBENCH_BENCHSUITE")
AUTOTUNE = os.environ.get("TRAINBENCH_AUTOTUNE")
MPIRUN = shutil.which("mpirun")

pytestmark = pytest.mark.skipif(not (BENCHSUITE and AUTOTUNE and MPIRUN),
                                reason="needs TRAINBENCH_BENCHSUITE, TRAINBENCH_AUTOTUNE and mpirun (ctest ranks_pytest)")


def env():
    e = dict(os.environ)
    if os.geteuid() == 0:  # Open MPI's consent to start ranks as root (a container's user)
        e.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return e


def test_allreduce_stage_on_two_ranks_reports_bus_bandwidth(tmp_path):
    out = tmp_path / "allreduce.json"
    run = subprocess.run([MPIRUN, "-n", "2", BENCHSUITE, "--filter", "allreduce", "--backend", "cpu", "--quick",
                          "--repetitions", "3", "--out", str(out)],
                         env=env(), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["context"]["settings"]["ranks"] == 2
    rows = {r["variant"]: r for r in doc["benchmarks"]}
    assert set(rows) == {"per_tensor", "bucketed", "flat", "link", "serial", "overlap"}
    for variant, row in rows.items():
        assert row["disposition"] == "passed", (variant, row.get("reason"))
        assert row["counters"]["ranks"] == 2, variant
    # Bus bandwidth as nccl-tests: 2(n-1)/n of the buffer per call, 1x with two ranks.
    flat = rows["flat"]
    assert flat["bytes"] == pytest.approx(flat["counters"]["buffer_mb"] * 2**20, rel=1e-9)
    # The link row sets the all-reduce's peak, unless its buffer fits twice in this CPU's last-level cache (a VM may
    # report 480 MiB of L3): then it is no ceiling, the row says "cache", and no peak is kept.
    if rows["link"].get("pct_of_peak_note") == "cache":
        assert "cpu.allreduce" not in doc["context"]["peaks"]
    else:
        assert "cpu.allreduce" in doc["context"]["peaks"]
    assert rows["overlap"]["counters"]["hidden_share"] is not None
    # One process writes the results: rank 1 said nothing (one table, one list of peaks where there is one).
    assert [line.split()[0] for line in run.stdout.splitlines() if line.startswith("benchmark ")] == ["benchmark"]
    assert run.stdout.count("Measured peaks") == (1 if doc["context"]["peaks"] else 0)


def tune(*args, timeout=600):
    # tiny's own global batch (16), pinned: these tests are about the ranks, not its global_range
    run = subprocess.run([AUTOTUNE, "--workload", "tiny", "--gpu", "cpu", "--batch", "16", "--format", "json",
                          "--race-rounds", "0", *args],
                         env=env(), capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)["trainbench_autotune"], run.stderr


def test_autotune_two_ranks_splits_the_global_batch_and_tunes_the_bucket_size(tmp_path):
    t, err = tune("--ranks", "2", "--budget", "45", "--journal", str(tmp_path / "j.jsonl"))
    chosen = t["chosen"]
    assert chosen["ranks"] == 2 and chosen["global_batch"] == 16
    assert chosen["micro_batch"] * chosen["accumulation"] * 2 == 16
    assert "bucket_mb" in chosen["switches"]
    assert t["executor"]["ranks"] == 2
    assert " x 2 ranks" in err


def test_predict_two_ranks_from_one_rank_is_consistent_and_reports_its_error(tmp_path):
    """--predict on 2 ranks, where the ranks are at hand: the prediction's arithmetic and the measured check.

    How close the prediction comes to the measured 2-rank run is not checked here. Both are wall-clock
    times, and on a shared machine they are not measured at the same moment: under `ctest -j2` a test
    running beside the 2-rank step once put the prediction 55% off. A verdict that depends on the
    machine's load is a benchmark, not a test. The accuracy is a reported figure: autotune prints it and
    writes it to `prediction.validation.error`, and the `--predict` table of docs/measured/cpu-vm-allreduce-and-ranks.md gives the values
    measured on an idle machine. What holds under any load is checked: the model's parts add up to its
    prediction, the all-reduce term is the probe's measurement scaled by the ring's traffic, the
    configuration divides the global batch, and the check run was made and its error computed from it."""
    t, err = tune("--ranks", "2", "--predict", "--budget", "45", "--journal", str(tmp_path / "p.jsonl"))
    p = t["prediction"]
    assert p["ranks"] == 2 and p["allreduce_measured"]["ranks"] == 2
    assert "a prediction" in p["note"]
    assert p["samples_per_s"] > 0 and p["compute_seconds"] > 0 and p["allreduce_seconds"] > 0
    # step(N) = compute(G/N samples) + allreduce(N), and samples/s = G / step(N).
    assert p["step_seconds"] == pytest.approx(p["compute_seconds"] + p["allreduce_seconds"], rel=1e-9)
    assert p["samples_per_s"] == pytest.approx(p["global_batch"] / p["step_seconds"], rel=1e-9)
    # allreduce(N) = allreduce(R) x [2(N-1)/N] / [2(R-1)/R]: with N = R = 2, the probe's own time.
    assert p["allreduce_seconds"] == pytest.approx(p["allreduce_measured"]["seconds"], rel=1e-9)
    assert p["config"]["micro_batch"] * p["config"]["accumulation"] * p["ranks"] == p["global_batch"]
    # N <= R: the predicted configuration ran on 2 real ranks, and the error is the prediction's against it.
    v = p["validation"]
    assert v["measured_samples_per_s"] > 0
    assert v["error"] == pytest.approx(p["samples_per_s"] / v["measured_samples_per_s"] - 1, rel=1e-9, abs=1e-12)
    assert "predicted for 2 ranks" in err
    # The figure itself, for the log (ctest --output-on-failure, pytest -s): never a verdict.
    print(f"--predict on 2 ranks: predicted {p['samples_per_s']:.0f} samples/s, measured "
          f"{v['measured_samples_per_s']:.0f}, error {v['error']:+.1%}")


def _descendants(pid):
    """Every live process under pid (mpirun, its ranks, what they started)."""
    children = {}
    for child, (parent, _) in live_processes().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@pytest.mark.parametrize("how", ["sigterm", "kill-9"])
def test_no_rank_outlives_a_stopped_or_killed_tune(tmp_path, how):
    """autotune --ranks 2, stopped by SIGTERM (exit 143, the best so far written) or killed with -9, while a trial
    runs on its two ranks: within 2 s no process of the tune is left, mpirun and both ranks included (each rank
    ends with its parent, mpirun ends with autotune: PR_SET_PDEATHSIG)."""
    import signal
    import time
    journal = tmp_path / "tune.jsonl"
    err = open(tmp_path / "err.txt", "w")
    proc = subprocess.Popen([AUTOTUNE, "--workload", "tiny", "--gpu", "cpu", "--batch", "16", "--ranks", "2",
                             "--switches", "optimizer", "--trial-seconds", "2", "--budget", "900", "--journal",
                             str(journal), "--out", str(tmp_path / "tuned.yaml")],
                            env=env(), stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 300
        ranks = []
        while len(ranks) < 2:   # a trial on both ranks, after one finished (so the tune holds a best so far)
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "err.txt").read_text()
            tree = _descendants(proc.pid)
            ranks = [p for p in tree if _cmdline(p)[:2] == [os.path.realpath(AUTOTUNE), "--trial"]]  # not mpirun
            if not (journal.exists() and journal.read_text()):
                ranks = []
            time.sleep(0.05)
        tree = _descendants(proc.pid)
        proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        code = proc.wait(timeout=60)
        assert_gone_within(2, lambda pid, st: pid in tree, f"{how} of a tune over 2 ranks")
        if how == "sigterm":
            assert code == 143, (tmp_path / "err.txt").read_text()
            assert (tmp_path / "tuned.yaml").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
        err.close()


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:
        return []

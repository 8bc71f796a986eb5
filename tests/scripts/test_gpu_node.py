"""scripts/sanitizer-verdict on compute-sanitizer logs (NCCL's own probe reports filtered, anything else
kept), and scripts/gpu-node's plan on a fake install: steps in order within the minutes given, the ones that
no longer fit skipped and listed, the output packed into at most 8 files. No GPU is needed: the plan's steps
here fail or pass on the fake install, and the test reads what the plan did with them.

fixtures/sanitizer_nccl_probe.log is memcheck on test_allreduce from an H100 (2026-11-26): 4 reports, all
NCCL's kernel-image probe in ncclCommInitRank. The other two are written in compute-sanitizer's format."""

import os
import re
import subprocess
import tarfile

from conftest import FIXTURES, SCRIPTS, run_script


def fixture(name):
    return os.path.join(FIXTURES, name)


def test_nccls_own_probe_reports_are_filtered_and_named():
    r = run_script("sanitizer-verdict", fixture("sanitizer_nccl_probe.log"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "clean (4 reports are NCCL's own" in r.stdout


def test_a_real_report_beside_nccls_fails_and_is_quoted():
    r = run_script("sanitizer-verdict", fixture("sanitizer_invalid_write.log"))
    assert r.returncode == 1
    assert "1 errors (first: Invalid __global__ write of size 4 bytes)" in r.stdout


def test_a_race_fails_and_an_unfinished_log_is_unreadable():
    assert run_script("sanitizer-verdict", fixture("sanitizer_race.log")).returncode == 1
    r = run_script("sanitizer-verdict", fixture("sanitizer_nccl_probe.log"), fixture("synth.py"))
    assert r.returncode == 2 and "no ERROR SUMMARY" in r.stdout


def fake_install(root):
    """An install folder gpu-node accepts: a benchsuite that writes a small result, one passing ctest test."""
    os.makedirs(os.path.join(root, "bin"))
    os.makedirs(os.path.join(root, "tests"))
    bench = os.path.join(root, "bin", "benchsuite")
    with open(bench, "w") as f:
        f.write('#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = --out ] && echo "{}" > "$2"; shift; done\necho quick\n')
    os.chmod(bench, 0o755)
    with open(os.path.join(root, "tests", "CTestTestfile.cmake"), "w") as f:
        f.write("add_test(always_passes true)\n")
    return root


def run_plan(tmp_path, minutes, steps):
    prefix = fake_install(str(tmp_path / "prefix"))
    out = tmp_path / "out"
    env = dict(os.environ, PLAN_STEPS=steps)
    r = subprocess.run([os.path.join(FIXTURES, "..", "..", "..", "scripts", "gpu-node"), prefix, str(out), "plan",
                        "--minutes", str(minutes)], capture_output=True, text=True, env=env, timeout=120)
    return r, out


def test_the_plan_runs_in_order_skips_what_no_longer_fits_and_packs(tmp_path):
    # 1.5 minutes less 30 s for packing leave 60 s: info (at least 15 s) runs; ctest and quick (90 s each)
    # no longer fit and are listed; the order of the list is kept.
    r, out = run_plan(tmp_path, 1.5, "info ctest quick")
    files = sorted(os.listdir(out))
    assert files == ["logs.tar.gz", "results.tar.gz", "summary.txt"] or files == ["logs.tar.gz", "summary.txt"], files
    summary = (out / "summary.txt").read_text()
    assert "ctest: skipped" in summary and "needs 90s" in summary
    assert "quick: skipped" in summary
    assert summary.index("info\t") < summary.index("skipped:")
    with tarfile.open(out / "logs.tar.gz") as t:
        assert "info.log" in t.getnames()
    assert "plan done, 0 step(s) failed" in r.stdout and r.returncode == 0, r.stdout + r.stderr


def test_a_plan_with_time_runs_every_step_and_keeps_their_results(tmp_path):
    r, out = run_plan(tmp_path, 4, "ctest quick")
    summary = (out / "summary.txt").read_text()
    assert "ctest\t0\t" in summary and "quick\t0\t" in summary, summary
    assert r.returncode == 0, r.stdout + r.stderr
    with tarfile.open(out / "results.tar.gz") as t:
        assert "quick.json" in t.getnames()
    assert len(os.listdir(out)) <= 8


def test_bad_minutes_are_refused(tmp_path):
    prefix = fake_install(str(tmp_path / "prefix"))
    r = subprocess.run([os.path.join(FIXTURES, "..", "..", "..", "scripts", "gpu-node"), prefix, str(tmp_path / "o"),
                        "plan", "--minutes", "soon"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--minutes takes a number" in r.stderr


def test_the_usage_names_every_step_and_the_plan_knows_each_ones_minimum():
    # The usage is the header comment: a step added to the case statement but not there (or not to the
    # plan's minimum times) is one a user of the node cannot find, or one the plan gives a guessed minimum.
    r = run_script("gpu-node")
    assert r.returncode == 2
    with open(os.path.join(SCRIPTS, "gpu-node")) as f:
        text = f.read()
    steps = re.findall(r"^    ([a-z0-9-]+)\)", text, re.M)
    assert "entry-gpt2" in steps and "ctest" in steps, steps
    minimums = re.search(r"declare -A least=\((.*?)\)\n", text, re.S).group(1)
    for step in steps:
        assert re.search(rf"^#   {re.escape(step)}\b", r.stderr, re.M), f"{step} is not in gpu-node's usage"
    for step in ("entry-gpt2", "torch-tune", "twin"):
        assert f"[{step}]=" in minimums, f"the plan has no minimum for {step}"

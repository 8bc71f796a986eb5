"""scripts/nightly end to end with a fake benchsuite, in a temporary results/ folder; scripts/report."""

import json
import os
import re
import signal
import stat
import subprocess
import tempfile
import time

import pytest

import synth
from conftest import FAKE_BENCHSUITE, SCRIPTS, run_script, slower_benchsuite, write_json

PEAK = synth.names()[0]


@pytest.fixture
def nightly(cli, tmp_path, monkeypatch):
    """nightly(night, *args, **env): one nightly run with the fake benchsuite into tmp_path/results."""
    for k in [k for k in os.environ if k.startswith("FAKE_BENCH_") or k == "GITHUB_STEP_SUMMARY"]:
        monkeypatch.delenv(k)
    argv_log = tmp_path / "argv.log"

    def run(night, *args, benchsuite=FAKE_BENCHSUITE, extra=("--backend", "cpu"), **env):
        with monkeypatch.context() as m:
            m.setenv("FAKE_BENCH_NIGHT", str(night))
            m.setenv("FAKE_BENCH_ARGV", str(argv_log))
            for k, v in env.items():
                m.setenv(f"FAKE_BENCH_{k.upper()}", str(v))
            return cli("nightly", "--benchsuite", benchsuite, "--results-dir", tmp_path / "results",
                       *args, "--", *extra)
    run.results = tmp_path / "results"
    run.argv_log = argv_log
    return run


def stored(results, key=synth.CPU_KEY):
    folder = results / key
    return sorted(p for p in os.listdir(folder) if p.endswith(".json")) if folder.is_dir() else []


def test_nights_are_stored_compared_and_a_persisting_regression_fails(nightly):
    for night in range(5):
        rc, out, err = nightly(night, "--no-report")
        assert rc == 0, err
    assert stored(nightly.results) == [f"2026100{d + 1}T030000Z_c00000{d}.json" for d in range(5)]
    args = [json.loads(line) for line in nightly.argv_log.read_text().splitlines()]
    assert args[0][:2] == ["--repetitions", "10"] and args[0][2] == "--out" and args[0][4:] == ["--backend", "cpu"]

    rc, out, _ = nightly(5, "--no-report", scale="peak=1.3")      # first slow night: not yet
    assert rc == 0
    assert "not confirmed yet: a regression needs 2 consecutive slower runs" in out
    rc, out, _ = nightly(6, scale="peak=1.3")                     # second: confirmed, with the report
    assert rc == 1
    line = next(line for line in out.splitlines() if line.startswith(PEAK))
    assert "SLOWER" in line and "CONFIRMED REGRESSION; since 2026-10-06 03:00 c000005" in line
    report = nightly.results / synth.CPU_KEY / "report"
    assert sorted(os.listdir(report)) == ["adamw.png", "attention.png", "index.html", "peak.png"]
    page = (report / "index.html").read_text()
    assert "1 confirmed regression" in page and "<img src='peak.png'" in page
    assert len(stored(nightly.results)) == 7


def test_a_machine_change_starts_a_new_history_and_is_no_regression(nightly):
    for night in range(3):
        assert nightly(night, "--no-report")[0] == 0
    rc, out, err = nightly(3, "--no-report", scale="*=1.3", cpu="Intel Xeon Platinum 8480+")
    assert rc == 0
    assert "nightly: first run on machine intel-xeon-platinum-8480_2c: a new history starts here" in err
    assert len(stored(nightly.results)) == 3
    assert stored(nightly.results, "intel-xeon-platinum-8480_2c") == ["20261004T030000Z_c000003.json"]
    assert out.count(" new ") >= 4            # every benchmark: no earlier passed run on this machine


def test_confirm_with_clears_a_slowdown_of_the_machine(nightly):
    # Two slow nights of an unchanged build: the history confirms a regression; both builds run
    # interleaved on the (still slow) machine agree, so it is the machine's and nothing fails.
    for night in range(5):
        assert nightly(night, "--no-report")[0] == 0
    assert nightly(5, "--no-report", scale="peak=1.3")[0] == 0
    before = len(nightly.argv_log.read_text().splitlines())
    rc, out, err = nightly(6, "--no-report", "--confirm-with", FAKE_BENCHSUITE, "--confirm-rounds", "2",
                           "--repetitions", "8", scale="peak=1.3")
    assert rc == 0, out + err
    line = next(line for line in out.splitlines() if line.startswith(PEAK))
    assert "SLOWER" in line and "CONFIRMED REGRESSION" not in line
    assert "not confirmed: run interleaved with the previous build (2 rounds) it is SAME +0.0%" in line
    assert "1 regression of the history checked by an interleaved run against" in out + err
    assert "nightly: compare: round 2/2: old" in err
    runs = [json.loads(line) for line in nightly.argv_log.read_text().splitlines()][before:]
    assert len(runs) == 1 + 4                                  # the night, then 2 rounds of both builds
    assert all(r[r.index("--repetitions") + 1] == "8" for r in runs)
    assert all(r[-4:] == ["--backend", "cpu", "--filter", "^(" + re.escape(PEAK) + ")$"] for r in runs[1:])
    assert len(stored(nightly.results)) == 7                   # the checking runs are not stored


def test_confirm_with_keeps_a_real_regression(nightly, tmp_path):
    for night in range(5):
        assert nightly(night, "--no-report")[0] == 0
    new = slower_benchsuite(tmp_path, "peak=1.3")
    assert nightly(5, "--no-report", benchsuite=new)[0] == 0
    rc, out, err = nightly(6, "--no-report", "--confirm-with", FAKE_BENCHSUITE, "--confirm-rounds", "2",
                           benchsuite=new)
    assert rc == 1, out + err
    line = next(line for line in out.splitlines() if line.startswith(PEAK))
    assert "CONFIRMED REGRESSION" in line and "confirmed interleaved against the previous build: +30.0%" in line
    assert "1 held" in out + err


def test_confirm_with_usage_errors(nightly, tmp_path):
    rc, _, err = nightly(0, "--no-report", "--confirm-with", tmp_path / "nope")
    assert rc == 2 and f"--confirm-with {tmp_path / 'nope'}: not an executable benchsuite" in err
    rc, _, err = nightly(0, "--no-report", "--confirm-with", FAKE_BENCHSUITE, "--confirm-rounds", "1")
    assert rc == 2 and "--confirm-rounds must be at least 2" in err
    assert stored(nightly.results) == []                       # refused before anything ran


def test_an_incorrect_variant_is_stored_shown_and_exits_3(nightly):
    nightly(0, "--no-report")
    rc, out, err = nightly(1, "--no-report", fail="adamw")
    assert rc == 3
    assert "nightly: 2 benchmark(s) incorrect or failed" in err
    assert len(stored(nightly.results)) == 2
    line = next(line for line in out.splitlines() if line.startswith("adamw/cpu/fused"))
    assert "not compared" in line and "incorrect: max error 3e-2 > tolerance 1e-3 (no timing)" in line


@pytest.mark.parametrize("env, message", [
    ({"exit": 2}, "nightly: error: benchsuite rejected its arguments (exit 2): "),
    ({"exit": 3}, "nightly: error: benchsuite failed (exit 3): "),
    ({"garbage": 1}, "nightly: error: "),
])
def test_a_broken_benchsuite_run_is_bad_input_and_stores_nothing(nightly, env, message):
    rc, out, err = nightly(0, "--no-report", **env)
    assert rc == 2
    errors = [line for line in err.splitlines() if line.startswith("nightly: error: ")]
    assert len(errors) == 1 and errors[0].startswith(message)
    assert stored(nightly.results) == []
    if "garbage" in env:
        assert "result.json: not valid JSON" in err
        os.remove(re.search(r"kept at (\S+\.json)", err).group(1))   # kept for a look; not this test's to leave


def test_bad_benchsuite_arguments_and_missing_binary(nightly, tmp_path):
    rc, _, err = nightly(0, "--no-report", extra=("--backend", "tpu"))
    assert rc == 2 and "rejected its arguments" in err
    rc, _, err = nightly(0, "--no-report", benchsuite=tmp_path / "nope")
    assert rc == 2
    assert err.splitlines()[-1] == (f"nightly: error: benchsuite not found at {tmp_path / 'nope'}: "
                                    "build it (cmake --build build) or pass --benchsuite")


def test_input_mode_and_step_summary(cli, tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    results = tmp_path / "results"
    for night in range(3):
        src = write_json(tmp_path / f"r{night}.json", synth.make_run(night, night, backend="cuda"))
        rc, out, _ = cli("nightly", "--input", src, "--results-dir", results, "--no-report")
        assert rc == 0
    assert stored(results, synth.GPU_KEY) == [f"2026100{d + 1}T030000Z_c00000{d}.json" for d in range(3)]
    assert summary.read_text().count("### trainbench nightly: no confirmed regression") == 3
    rc, _, err = cli("nightly", "--input", src, "--results-dir", results, "--", "--quick")
    assert rc == 2 and "make no sense with --input" in err


def test_the_real_executables(tmp_path):
    for name in ("nightly", "compare", "report"):
        p = run_script(name, "--help")
        assert p.returncode == 0
        assert "examples:" in p.stdout and "exit codes: 0 " in p.stdout
    p = run_script("nightly", "--benchsuite", FAKE_BENCHSUITE, "--results-dir", tmp_path / "results",
                   "--report-dir", tmp_path / "report", "--", "--backend", "cuda", env={"FAKE_BENCH_NIGHT": "0"})
    assert p.returncode == 0, p.stderr
    assert stored(tmp_path / "results", synth.GPU_KEY) == ["20261001T030000Z_c000000.json"]
    assert sorted(os.listdir(tmp_path / "report")) == ["adamw.png", "attention.png", "index.html", "peak.png"]


def test_report_draws_a_history(cli, tmp_path):
    folder = tmp_path / synth.GPU_KEY
    synth.history(str(folder), 12, seed=3, backend="cuda", target="adamw", step_at=9, step=0.2)
    rc, out, err = cli("report", folder, "--out", tmp_path / "rep")
    assert rc == 0, err
    assert sorted(os.listdir(tmp_path / "rep")) == ["adamw.png", "attention.png", "index.html", "peak.png"]
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "trainbench nightly: 2 confirmed regressions" in page
    assert page.count("<tr class='reg'>") == 2
    assert (tmp_path / "rep" / "adamw.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rc, _, err = cli("report", tmp_path / "empty-does-not-exist")
    assert rc == 2 and "not a directory" in err
    (tmp_path / "empty").mkdir()
    rc, _, err = cli("report", tmp_path / "empty")
    assert rc == 2 and "no readable result files" in err


def test_report_plot_titles_keep_the_variant_and_fit():
    from trainbench.tracking.plots import TITLE_WIDTH, plot_title
    key = "adamw/cpu/per_tensor/params=29900000,tensors=200,dtype=fp32"
    lines = plot_title(key)
    assert lines[0] == "adamw/cpu/per_tensor"          # cut from the left before: "...tensor/params=..."
    assert "".join(lines[1:]) == "params=29900000,tensors=200,dtype=fp32"
    assert all(len(line) <= TITLE_WIDTH for line in lines)
    long_key = "collate/cpu/prefetch/" + ",".join(f"axis{i}=value{i}" for i in range(20))
    lines = plot_title(long_key)
    assert lines[0] == "collate/cpu/prefetch" and len(lines) <= 3
    assert all(len(line) <= TITLE_WIDTH for line in lines)
    assert lines[1].startswith("axis0=value0") and lines[-1].endswith("axis19=value19")   # the middle gives way
    assert any("..." in line for line in lines[1:])


def test_report_ticks_tell_two_runs_of_one_day_apart():
    import datetime as dt
    from trainbench.tracking.plots import tick_labels
    utc = dt.timezone.utc
    days = [dt.datetime(2026, 11, 25, 3, 0, tzinfo=utc), dt.datetime(2026, 11, 26, 3, 0, tzinfo=utc)]
    assert tick_labels(days) == ["11-25", "11-26"]
    same_day = days + [dt.datetime(2026, 11, 26, 14, 30, tzinfo=utc)]
    labels = tick_labels(same_day)
    assert len(set(labels)) == 3 and labels[2] == "11-26\n14:30"
    twice = [days[0], days[0]]
    assert len(set(tick_labels(twice))) == 2
    assert tick_labels([None, days[0]])[0] == "0"


def test_report_says_one_earlier_run_in_the_singular(cli, tmp_path):
    folder = tmp_path / synth.GPU_KEY
    synth.history(str(folder), 2, seed=3, backend="cuda")
    rc, _, err = cli("report", folder, "--out", tmp_path / "rep")
    assert rc == 0, err
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "1 earlier run," in page and "1 earlier runs" not in page


def _kept_file(error_line):
    m = re.search(r"kept at (\S+) \(not stored in the history", error_line)
    return m.group(1) if m else None


def test_a_timeout_stops_benchsuite_gently_and_keeps_what_it_measured(nightly):
    rc, _, err = nightly(0, "--no-report", "--timeout", "1", hang=1)
    assert rc == 2
    errors = [line for line in err.splitlines() if line.startswith("nightly: error: ")]
    assert len(errors) == 1 and errors[0].startswith("nightly: error: benchsuite ran past --timeout 1 s: ")
    kept = _kept_file(errors[0])
    assert kept and os.path.isfile(kept), errors[0]
    with open(kept) as f:
        assert len(json.load(f)["benchmarks"]) == len(synth.names())
    os.remove(kept)
    assert stored(nightly.results) == []   # a partial run is no point of the history


def test_a_benchsuite_that_ignores_the_interrupt_is_killed_after_the_grace(nightly, monkeypatch):
    from trainbench.tracking import nightly as nightly_module
    monkeypatch.setattr(nightly_module, "STOP_GRACE_S", 0.5)
    rc, _, err = nightly(0, "--no-report", "--timeout", "1", hang="ignore")
    assert rc == 2
    assert "benchsuite ran past --timeout 1 s: " in err and "kept at" not in err
    assert stored(nightly.results) == []


def test_a_benchsuite_stopped_by_sigterm_is_interrupted_and_what_it_wrote_is_kept(nightly):
    """benchsuite exits 143 after SIGTERM (130 after Ctrl-C): either is an interrupted run, not a crash."""
    rc, _, err = nightly(0, "--no-report", hang="sigterm")
    assert rc == 2
    errors = [line for line in err.splitlines() if line.startswith("nightly: error: ")]
    assert len(errors) == 1 and errors[0].startswith("nightly: error: benchsuite was interrupted: "), err
    kept = _kept_file(errors[0])
    assert kept and os.path.isfile(kept), errors[0]
    os.remove(kept)
    assert stored(nightly.results) == []


def test_sigterm_to_nightly_keeps_what_benchsuite_measured(tmp_path):
    """A CI job's time limit: SIGTERM to nightly stops benchsuite as Ctrl-C does; nothing measured is lost."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_BENCH_")}
    env["FAKE_BENCH_HANG"] = "1"
    proc = subprocess.Popen([os.path.join(SCRIPTS, "nightly"), "--benchsuite", FAKE_BENCHSUITE, "--results-dir",
                             str(tmp_path / "results"), "--no-report", "--", "--backend", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 30
    line = ""
    while "fake benchsuite:" not in line and time.monotonic() < deadline:   # benchsuite is running
        line = proc.stderr.readline()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    errors = [ln for ln in err.splitlines() if ln.startswith("nightly: error: ")]
    assert len(errors) == 1 and errors[0].startswith("nightly: error: interrupted while benchsuite ran: "), err
    kept = _kept_file(errors[0])
    assert kept and os.path.isfile(kept), errors[0]
    os.remove(kept)
    assert stored(tmp_path / "results") == []


def test_the_same_result_given_twice_is_stored_once(cli, tmp_path):
    results = tmp_path / "results"
    first = write_json(tmp_path / "r0.json", synth.make_run(0, 0))
    assert cli("nightly", "--input", first, "--results-dir", results, "--no-report")[0] == 0
    again = tmp_path / "copy_of_r0.json"                       # the same bytes under another name
    again.write_bytes(open(first, "rb").read())
    rc, _, err = cli("nightly", "--input", again, "--results-dir", results, "--no-report")
    assert rc == 0, err
    kept = results / synth.CPU_KEY / "20261001T030000Z_c000000.json"
    assert f"nightly: already stored as {kept}; not stored again" in err
    assert stored(results) == ["20261001T030000Z_c000000.json"]
    later = write_json(tmp_path / "r1.json", synth.make_run(1, 1))
    rc, out, err = cli("nightly", "--input", later, "--results-dir", results, "--no-report", "--format", "json")
    assert rc == 0, err
    assert json.loads(out)["baseline_runs"] == [str(kept)]     # counted once in the comparisons that follow


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664)], ids=["umask022", "umask002"])
def test_a_stored_result_gets_the_mode_a_plain_create_gets(cli, tmp_path, umask, mode):
    src = write_json(tmp_path / "r0.json", synth.make_run(0, 0))
    before = os.umask(umask)
    try:
        rc, _, err = cli("nightly", "--input", src, "--results-dir", tmp_path / "results", "--no-report")
    finally:
        os.umask(before)
    assert rc == 0, err
    path = tmp_path / "results" / synth.CPU_KEY / "20261001T030000Z_c000000.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == mode


@pytest.mark.parametrize("knob, old_name", [("hang", "trainbench-partial-result-{pid}.json"),
                                            ("garbage", "trainbench-bad-result-{pid}.json")])
def test_a_kept_file_never_follows_a_symlink_planted_at_its_name(nightly, tmp_path, monkeypatch, knob, old_name):
    """The copy kept for the user once had a name anyone could predict from nightly's pid, in a folder anyone
    can write to: a symlink planted there had nightly overwrite the file it points to. nightly runs in this
    process here, so its pid is known: links are planted at the old names for it and its neighbours."""
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"a file of the user running nightly\n")
    planted = set()
    for pid in range(os.getpid() - 5, os.getpid() + 6):
        link = shared_tmp / old_name.format(pid=pid)
        link.symlink_to(victim)
        planted.add(link.name)
    rc, _, err = nightly(0, "--no-report", **{knob: "sigterm" if knob == "hang" else 1})
    assert rc == 2
    assert victim.read_bytes() == b"a file of the user running nightly\n"
    m = re.search(r"kept at (\S+\.json)", err)
    assert m, err
    kept = m.group(1)
    assert os.path.dirname(kept) == str(shared_tmp) and os.path.basename(kept) not in planted
    assert not os.path.islink(kept) and os.path.getsize(kept) > 0
    assert stat.S_IMODE(os.stat(kept).st_mode) == 0o600            # the user's own, in a shared folder
    assert set(os.listdir(shared_tmp)) == planted | {os.path.basename(kept)}   # nightly's own folder removed

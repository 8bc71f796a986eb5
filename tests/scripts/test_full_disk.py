"""Every writer under a full disk: autotune's journal and its tuned file (--out), benchsuite's result file (--out), the
nightly store, the report and the two pages. Each runs as a user runs it (the built program, the script), under one of
two disks:

- a file-size limit (RLIMIT_FSIZE, as `ulimit -f` or a batch job sets it): a write past it fails with EFBIG, "File too
  large". Only the limit is set in the child, SIGXFSZ is left as it is: Python ignores that signal from its start, and
  autotune and benchsuite ignore it first thing (runtime/files.h), so that a limit is said like a full disk instead of
  killing the program unsaid (a test here would see a child killed by SIGXFSZ and fail);
- a full small filesystem (a 64 KiB tmpfs filled to its last page), where root can mount one: ENOSPC, "No space left on
  device", as a real full disk says it. Where the mount fails (not root, no CAP_SYS_ADMIN in a container), those tests
  skip and say why.

What each must do: one line naming the file and the reason, a non-zero exit, no traceback, the earlier file at that path
intact and no temporary file left beside it. What was measured is not lost: a tune whose journal or tuned file cannot
be written prints its configuration on stdout, benchsuite still prints its table."""

import errno
import json
import os
import resource
import subprocess
import sys

import pytest

import synth
from conftest import FIXTURES, SCRIPTS, built_tool

AUTOTUNE = built_tool("TRAINBENCH_AUTOTUNE", "tuner", "autotune")
BENCHSUITE = built_tool("TRAINBENCH_BENCHSUITE", "benches", "benchsuite")
TMPFS_SIZE = "64k"
RUN_TIMEOUT_S = 120   # a tune of a few seconds, or a script, on a loaded 2-core machine
EARLIER = "the earlier file, which a failed write must leave as it was\n"
REASONS = {"fsize": os.strerror(errno.EFBIG), "tmpfs": os.strerror(errno.ENOSPC)}


class FullDisk:
    """A folder `path` where writes fail: under `fsize`, past `limit` bytes a file (the child's RLIMIT_FSIZE); under
    `tmpfs`, once fill() has taken its last page. Files the test puts there before fill() (the earlier ones) are
    written by the test itself, without the limit."""

    def __init__(self, kind, path):
        self.kind, self.path, self.reason = kind, path, REASONS[kind]
        path.mkdir()

    def fill(self):
        """tmpfs: a filler file takes every page left (the earlier files keep theirs)."""
        if self.kind != "tmpfs":
            return
        fd = os.open(self.path / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
        finally:
            os.close(fd)

    def run(self, argv, limit, env=None):
        """argv in a child whose files may not pass `limit` bytes (fsize; tmpfs, or None: no limit), stdout and
        stderr as text through pipes, which no limit applies to."""
        def limited():
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                              env=dict(os.environ, **(env or {})),
                              preexec_fn=limited if self.kind == "fsize" and limit is not None else None)

    def names(self):
        """What the folder holds, the filler left out."""
        return sorted(n for n in os.listdir(self.path) if n != "filler")


@pytest.fixture(params=["fsize", "tmpfs"])
def disk(request, tmp_path):
    full = FullDisk(request.param, tmp_path / "disk")
    if request.param == "tmpfs":
        try:
            mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(full.path)],
                                     capture_output=True, text=True, timeout=30)
            why = (mounted.stderr or mounted.stdout).strip() or f"exit {mounted.returncode}"
        except (OSError, subprocess.TimeoutExpired) as e:   # no mount program
            mounted, why = None, str(e)
        if mounted is None or mounted.returncode != 0:
            pytest.skip(f"no full small filesystem here: mount -t tmpfs failed ({why}); "
                        "the file-size limit's test of this writer ran")
    yield full
    if request.param == "tmpfs":
        subprocess.run(["umount", str(full.path)], check=False)
        if os.path.ismount(full.path):
            subprocess.run(["umount", "-l", str(full.path)], check=False)


def assert_said_once(p, path, reason, prog):
    """A non-zero exit and one line of stderr naming `path` with `reason`; no traceback."""
    assert p.returncode > 0, f"{prog} exited {p.returncode} (a negative code: killed by that signal)\n{p.stderr}"
    assert "Traceback" not in p.stderr, p.stderr
    lines = [line for line in p.stderr.splitlines() if reason in line]
    assert len(lines) == 1 and str(path) in lines[0] and lines[0].startswith(prog + ": "), p.stderr
    return lines[0]


def put_earlier(path):
    path.write_text(EARLIER)
    return path


@pytest.fixture
def tune_env(tmp_path):
    """autotune's cache (the BLAS kernels' notice, default journals) apart from the user's."""
    return {"XDG_CACHE_HOME": str(tmp_path / "cache")}


needs_autotune = pytest.mark.skipif(AUTOTUNE is None, reason="autotune is not built")
TINY_TUNE = ["--workload", "tiny", "--gpu", "cpu"]


@needs_autotune
def test_a_tune_whose_journal_cannot_be_appended_stops_and_prints_its_best_on_stdout(disk, tmp_path, tune_env):
    journal = disk.path / "tune.autotune.jsonl"
    earlier = b""
    if disk.kind == "fsize":
        # A limit counts the bytes already there: an earlier tune's lines, which --resume goes on from, and which a
        # line that does not fit must leave whole (its part written is cut off again). On a full tmpfs the journal's
        # last page would still have room for the next line, so there the journal starts empty.
        first = disk.run([AUTOTUNE, *TINY_TUNE, "--budget", "3", "--journal", journal], limit=None,
                         env=tune_env)
        assert first.returncode == 0, first.stderr
        earlier = journal.read_bytes()
        assert earlier.endswith(b"\n")
    disk.fill()
    p = disk.run([AUTOTUNE, *TINY_TUNE, "--budget", "5", "--journal", journal] + (["--resume"] if earlier else []),
                 limit=len(earlier) + 300, env=tune_env)   # 300 bytes: part of a trial's line (about 550)
    line = assert_said_once(p, journal, disk.reason, "autotune")
    kept = earlier.count(b"\n")
    assert f"cannot write the journal {journal}: {disk.reason}" in line
    assert f"the journal keeps {kept} finished trials" in line, line
    assert p.returncode == 1
    assert journal.read_bytes() == earlier, "the journal lost a line or kept part of one"
    assert all(json.loads(text)["result"] for text in earlier.decode().splitlines())
    # the best so far on stdout: the tuned document, whole, with the trial that could not be journaled counted
    assert "trainbench_autotune:" in p.stdout and "\n  chosen:\n" in p.stdout, p.stdout
    assert "interrupted: true" in p.stdout
    assert "written to stdout" in p.stderr.splitlines()[-1], p.stderr
    assert disk.names() == [journal.name]


@needs_autotune
def test_a_tuned_file_that_cannot_be_written_goes_to_stdout_and_the_earlier_one_stays(disk, tmp_path, tune_env):
    out = put_earlier(disk.path / "tuned.yaml")
    disk.fill()
    # The journal is elsewhere on a full tmpfs; under the limit it is written too, well within it: a search of a
    # fixed few candidates (the optimizer at one micro-batch: 4 trials, about 2.1 KB of journal whatever the machine's
    # speed; a search by time on a fast machine ran 8 trials, 4.4 KB), and the tuned YAML about 4 KB.
    journal = (tmp_path if disk.kind == "tmpfs" else disk.path) / "tuned.autotune.jsonl"
    p = disk.run([AUTOTUNE, *TINY_TUNE, "--budget", "3", "--batch", "8", "--micro-batch", "8", "--switches", "optimizer",
                  "--journal", journal, "--out", out], limit=3072, env=tune_env)
    line = assert_said_once(p, out, disk.reason, "autotune")
    assert line == f"autotune: cannot write {out}: {disk.reason}; the configuration follows on stdout instead"
    assert p.returncode == 1
    assert "trainbench_autotune:" in p.stdout and "\n  chosen:\n" in p.stdout, p.stdout
    assert out.read_text() == EARLIER
    assert disk.names() == sorted(["tuned.yaml"] + ([journal.name] if disk.kind == "fsize" else []))


@pytest.mark.skipif(BENCHSUITE is None, reason="benchsuite is not built")
def test_a_result_file_that_cannot_be_written_leaves_the_earlier_one_and_the_table_is_printed(disk, tmp_path):
    out = put_earlier(disk.path / "result.json")
    disk.fill()
    p = disk.run([BENCHSUITE, "--backend", "cpu", "--filter", "peak/cpu/triad/", "--axis", "peak.n=1000", "--quick",
                  "--repetitions", "2", "--out", out], limit=2048,   # its result file is about 5 KB
                 env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    line = assert_said_once(p, out, disk.reason, "benchsuite")
    assert line.startswith(f"benchsuite: cannot write {out}: {disk.reason}")
    assert p.returncode == 2
    assert "peak/cpu/triad/n=1000" in p.stdout, "the table of what was measured is not on stdout"
    assert out.read_text() == EARLIER
    assert disk.names() == ["result.json"]


def run_script_on(disk, name, *args, limit):
    return disk.run([sys.executable, os.path.join(SCRIPTS, name), *args], limit=limit)


@pytest.mark.python_only
def test_the_nightly_store_that_cannot_write_keeps_the_history_as_it_was(disk, tmp_path):
    results = disk.path / "results"
    earlier = synth.write(synth.make_run(0, 0, backend="cuda"), str(results / synth.GPU_KEY))
    with open(earlier) as f:
        earlier_text = f.read()
    new = tmp_path / "new.json"
    new.write_text(json.dumps(synth.make_run(1, 1, backend="cuda")))
    disk.fill()
    p = run_script_on(disk, "nightly", "--input", new, "--results-dir", results, "--no-report",
                      limit=1024)   # a result file is about 4 KB
    target = results / synth.GPU_KEY / synth.file_name(synth.make_run(1, 1, backend="cuda"))
    line = assert_said_once(p, target, disk.reason, "nightly")
    assert line == f"nightly: error: {target}: {disk.reason}"
    assert p.returncode == 2
    with open(earlier) as f:
        assert f.read() == earlier_text
    assert os.listdir(results / synth.GPU_KEY) == [os.path.basename(earlier)], "a temporary file was left behind"


@pytest.mark.python_only
def test_a_report_that_cannot_be_written_leaves_the_earlier_report(disk, tmp_path):
    history = tmp_path / synth.GPU_KEY
    synth.history(str(history), 3, seed=3, backend="cuda")
    report = disk.path / "report"
    report.mkdir()
    earlier = {name: put_earlier(report / name) for name in ("adamw.png", "attention.png", "index.html", "peak.png")}
    disk.fill()
    p = run_script_on(disk, "report", history, "--out", report, limit=4096)   # a plot is about 30 KB
    line = assert_said_once(p, report, disk.reason, "report")
    assert line.startswith(f"report: error: {report}{os.sep}") and line.endswith(f".png: {disk.reason}"), line
    assert p.returncode == 2
    assert all(path.read_text() == EARLIER for path in earlier.values())
    assert sorted(os.listdir(report)) == sorted(earlier), "a temporary file was left behind"


@pytest.mark.python_only
@pytest.mark.parametrize("page", ["tune-page", "run-page"])
def test_a_page_that_cannot_be_written_leaves_the_earlier_page(disk, page):
    out = put_earlier(disk.path / "page.html")
    disk.fill()
    inputs = ([os.path.join(FIXTURES, "tune_page_tiny.json"), "--journal", os.path.join(FIXTURES, "tune_page_tiny.jsonl")]
              if page == "tune-page" else [os.path.join(FIXTURES, "run_page_cpu_quick.json")])
    p = run_script_on(disk, page, *inputs, "--out", out, limit=4096)   # a page is 100 KB and more
    line = assert_said_once(p, out, disk.reason, page)
    assert line == f"{page}: error: {out}: cannot write the page ({disk.reason})"
    assert p.returncode == 2
    assert out.read_text() == EARLIER
    assert disk.names() == ["page.html"]

"""Shared helpers for the tests of scripts/ (nightly tracking, the PyTorch side). scripts/ (the trainbench
package) and fixtures/ (synth) are on the path by pytest.ini's pythonpath."""

import copy
import glob
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SCRIPTS = os.path.join(REPO, "scripts")
FIXTURES = os.path.join(HERE, "fixtures")
FAKE_BENCHSUITE = os.path.join(FIXTURES, "fake_benchsuite")


@pytest.fixture
def cli(capsys):
    """Runs scripts/<name>'s main in-process: returns (exit code, stdout, stderr)."""
    from trainbench.tracking import cli as cli_module

    def run(name, *args):
        try:
            rc = getattr(cli_module, f"{name.replace('-', '_')}_main")([str(a) for a in args])
        except SystemExit as e:   # argparse
            rc = e.code
        out = capsys.readouterr()
        return rc, out.out, out.err
    return run


_python_only_test = []  # the running test's name when it is marked python_only


@pytest.fixture(autouse=True)
def _python_only_runs_no_built_program(request):
    """A test marked python_only is left out of CI's sanitizer stage: one that asks for a built program is wrong."""
    marked = request.node.get_closest_marker("python_only") is not None
    if marked:
        _python_only_test.append(request.node.name)
    yield
    if marked:
        _python_only_test.pop()


def built_tool(env_name, *relative):
    """A built trainbench tool: $env_name, else the newest build*/<relative> of this checkout; None when
    neither exists."""
    assert not _python_only_test, f"{_python_only_test[-1]} is marked python_only but runs a built program"
    path = os.environ.get(env_name)
    if path:
        return path if os.access(path, os.X_OK) else None
    built = [p for p in glob.glob(os.path.join(REPO, "build*", *relative)) if os.access(p, os.X_OK)]
    return max(built, key=os.path.getmtime) if built else None


def run_script(name, *args, env=None):
    """Runs the real executable scripts/<name>: returns the CompletedProcess."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([os.path.join(SCRIPTS, name)] + [str(a) for a in args], capture_output=True,
                          text=True, env=full_env, timeout=60)


def slower_benchsuite(tmp_path, scale):
    """A fake benchsuite whose times are scaled whatever its environment says: a build with a change."""
    path = tmp_path / "slower_benchsuite"
    path.write_text(f"#!/bin/sh\nFAKE_BENCH_SCALE='{scale}' exec '{FAKE_BENCHSUITE}' \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def scaled(doc, factor, names=None, clock_mhz=None):
    """A copy of a result document with the samples of `names` (default all) times `factor`."""
    doc = copy.deepcopy(doc)
    for row in doc["benchmarks"]:
        if row.get("samples_ns") and (names is None or row["name"] in names or row["stage"] in names):
            row["samples_ns"] = [s * factor for s in row["samples_ns"]]
            for k in ("real_time", "cpu_time", "median_ns", "ci_low_ns", "ci_high_ns"):
                row[k] *= factor
    if clock_mhz is not None:
        if doc["context"]["devices"]:
            doc["context"]["devices"][0]["sm_clock_mhz"] = clock_mhz
        else:
            doc["context"]["mhz_per_cpu"] = clock_mhz
    return doc


def write_json(path, doc):
    with open(path, "w") as f:
        json.dump(doc, f)
    return str(path)


def by_name(json_text):
    """benchmark -> its comparison, from `--format json` output."""
    return {c["benchmark"]: c for c in json.loads(json_text)["comparisons"]}


TORCH_STEP = os.path.join(SCRIPTS, "torch-step")


class TorchWorker:
    """scripts/torch-step --serve as autotune starts it (tuner/worker.cpp), over pipes: its hello, then one answer
    per request (ops open, time, counters, close)."""

    def __init__(self, start, timeout=300, launcher=()):
        """`launcher`: the interpreter's arguments before the script (an entry's ranks: -m torch.distributed.run ...)."""
        self.proc = subprocess.Popen([sys.executable, *launcher, TORCH_STEP, "--serve", json.dumps(start)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.hello = self._answer(timeout)

    def _answer(self, timeout):
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout)
            raise AssertionError(f"the worker ended (exit {self.proc.returncode}): {self.proc.stderr.read()}")
        return json.loads(line)

    def request(self, op, timeout=300, **fields):
        self.proc.stdin.write(json.dumps(dict(fields, op=op)) + "\n")
        self.proc.stdin.flush()
        return self._answer(timeout)

    def close(self):
        self.proc.stdin.close()
        return self.proc.wait(60)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def live_processes():
    """pid -> (parent pid, process group) of every live process (zombies are gone for this purpose)."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    text = f.read()
            except OSError:
                continue
            fields = text[text.rindex(")") + 2:].split()   # after the command's name, which may hold spaces
            if fields[0] != "Z":
                found[int(name)] = (int(fields[1]), int(fields[2]))
    return found


def assert_gone_within(seconds, matches, what):
    """Waits up to `seconds` until no live process matches (pid, (ppid, pgrp)) -> bool; kills what is left and
    fails, naming it."""
    import signal
    import time
    deadline = time.monotonic() + seconds
    while True:
        left = [pid for pid, st in live_processes().items() if matches(pid, st)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"{len(left)} processes outlived it ({what})"

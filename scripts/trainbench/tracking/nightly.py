"""Running benchsuite for the nightly and storing its result."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from typing import List, Optional

from .atomic import keep_copy
from ..errors import UsageError

BENCHSUITE_INCORRECT = 1     # benchsuite: a variant was incorrect or a benchmark failed (the file is written)
BENCHSUITE_USAGE = 2
# It stopped early (130: Ctrl-C, SIGINT; 143: SIGTERM) and wrote the rows measured before.
BENCHSUITE_INTERRUPTED = (130, 143)
# After --timeout, benchsuite is asked to stop as Ctrl-C does (it ends the row it is in after the call
# in flight and writes the rows measured so far); past this grace it is killed.
STOP_GRACE_S = 60.0


def _keep_partial(out_path: str) -> str:
    """Copies what an interrupted benchsuite wrote where the caller's clean-up will not remove it.
    Returns '; the rows it measured before are kept at PATH ...' or ''."""
    if not os.path.isfile(out_path):
        return ""
    kept = keep_copy(out_path, "trainbench-partial-result-")
    return (f"; the rows it measured before are kept at {kept} (not stored in the history; "
            f"`nightly --input {shlex.quote(kept)}` stores them)")


def _stop_and_keep(proc: subprocess.Popen, out_path: str) -> str:
    """Interrupts benchsuite as Ctrl-C does, waits for it to write what it measured, and keeps that."""
    try:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
    return _keep_partial(out_path)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def run_benchsuite(benchsuite: str, out_path: str, repetitions: Optional[int], extra: List[str],
                   timeout: Optional[float] = None, capture: bool = False) -> int:
    """Runs benchsuite (its output goes to our stderr); returns its exit code (0 or 1). Raises UsageError when
    it cannot run, rejects its arguments, crashes, or writes no result file. repetitions None: not passed.
    capture: its output is kept, not shown, and its tail is added to the error message when it fails."""
    cmd = [benchsuite] + (["--repetitions", str(repetitions)] if repetitions is not None else []) \
        + ["--out", out_path] + list(extra)
    shown = " ".join(shlex.quote(c) for c in cmd)
    if not os.path.exists(benchsuite):
        raise UsageError(f"benchsuite not found at {benchsuite}: build it (cmake --build build) or pass --benchsuite")
    try:   # benchsuite's console output goes to our stderr: stdout is for the verdicts
        sink = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        sink = None
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE if capture else sink,
                                stderr=subprocess.STDOUT if capture else None)
    except PermissionError:
        raise UsageError(f"benchsuite at {benchsuite} is not executable") from None
    except OSError as e:
        raise UsageError(f"cannot run {shown}: {e.strerror or e}") from None
    # A CI job's time limit ends it with SIGTERM: handled as Ctrl-C, so the rows measured are kept.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise UsageError(f"benchsuite ran past --timeout {timeout:g} s: {shown}{_stop_and_keep(proc, out_path)}") \
            from None
    except KeyboardInterrupt:   # Ctrl-C (benchsuite got it too) or SIGTERM: keep what it measured
        raise UsageError(f"interrupted while benchsuite ran: {shown}{_stop_and_keep(proc, out_path)}") from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    rc = proc.returncode
    said = ""
    if capture and output:
        tail = output.decode("utf-8", "replace").strip().splitlines()[-10:]
        said = "".join("\n  " + line for line in tail)
    if rc == BENCHSUITE_USAGE:
        raise UsageError(f"benchsuite rejected its arguments (exit 2): {shown}{said}")
    if rc in BENCHSUITE_INTERRUPTED:
        raise UsageError(f"benchsuite was interrupted: {shown}{_keep_partial(out_path)}")
    if rc not in (0, BENCHSUITE_INCORRECT):
        why = f"signal {-rc}" if rc < 0 else f"exit {rc}"
        raise UsageError(f"benchsuite failed ({why}): {shown}{said}")
    if not os.path.isfile(out_path):
        raise UsageError(f"benchsuite exited {rc} but wrote no result file: {shown}")
    return rc

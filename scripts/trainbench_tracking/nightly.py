"""Running benchsuite for the nightly and storing its result."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from typing import List, Optional

from .errors import UsageError

BENCHSUITE_INCORRECT = 1     # benchsuite: a variant was incorrect or a benchmark failed (the file is written)
BENCHSUITE_USAGE = 2


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
        if capture:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        else:
            proc = subprocess.run(cmd, stdout=sink, timeout=timeout)
    except PermissionError:
        raise UsageError(f"benchsuite at {benchsuite} is not executable") from None
    except OSError as e:
        raise UsageError(f"cannot run {shown}: {e.strerror or e}") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"benchsuite ran past --timeout {timeout:g} s: {shown}") from None
    rc = proc.returncode
    said = ""
    if capture and proc.stdout:
        tail = proc.stdout.decode("utf-8", "replace").strip().splitlines()[-10:]
        said = "".join("\n  " + line for line in tail)
    if rc == BENCHSUITE_USAGE:
        raise UsageError(f"benchsuite rejected its arguments (exit 2): {shown}{said}")
    if rc not in (0, BENCHSUITE_INCORRECT):
        why = f"signal {-rc}" if rc < 0 else f"exit {rc}"
        raise UsageError(f"benchsuite failed ({why}): {shown}{said}")
    if not os.path.isfile(out_path):
        raise UsageError(f"benchsuite exited {rc} but wrote no result file: {shown}")
    return rc

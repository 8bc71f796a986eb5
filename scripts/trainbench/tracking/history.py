"""results/<machine-key>/: loading a machine's history and storing a new run into it."""

from __future__ import annotations

import glob
import os
from datetime import datetime, timezone
from typing import List, Optional, Tuple

from .atomic import write_atomically
from .resultfile import ResultFileError, Run, load_run, stored_name

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def sort_key(run: Run):
    return (run.date or _EPOCH, run.name)


def load_history(directory: str, machine_key: Optional[str] = None, exclude: Optional[Run] = None
                 ) -> Tuple[List[Run], List[str]]:
    """The runs stored in `directory` (its *.json files), oldest first, and warnings for what was skipped.

    A history file that cannot be read or is from another machine is skipped with a warning: the new run
    is what is being judged. `exclude` (the new run) is left out, and so are runs dated after it.
    """
    if not os.path.isdir(directory):
        raise ResultFileError(f"{directory}: not a directory")
    runs, warnings = [], []
    newer = 0
    skip = os.path.realpath(exclude.path) if exclude is not None else None
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        if skip is not None and os.path.realpath(path) == skip:
            continue
        try:
            run = load_run(path)
        except ResultFileError as e:
            warnings.append(f"skipped {e}")
            continue
        if machine_key is not None and run.machine_key != machine_key:
            warnings.append(f"skipped {path}: machine {run.machine_key}, not {machine_key}")
            continue
        if exclude is not None and run.data == exclude.data:
            continue
        if exclude is not None and exclude.date and run.date and run.date > exclude.date:
            newer += 1
            continue
        runs.append(run)
    if newer:
        warnings.append(f"ignored {newer} run(s) in {directory} dated after the compared run")
    runs.sort(key=sort_key)
    return runs, warnings


def machine_keys_in(directory: str) -> List[str]:
    """The machine keys of the readable runs in a folder (to explain a mismatch)."""
    keys = set()
    for path in glob.glob(os.path.join(directory, "*.json")):
        try:
            keys.add(load_run(path).machine_key)
        except ResultFileError:
            pass
    return sorted(keys)


def stored_copy(folder: str, content: bytes) -> Optional[str]:
    """The file of `folder` that holds exactly `content` (the same result given to nightly again), or None."""
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        try:
            if os.path.getsize(path) != len(content):
                continue
            with open(path, "rb") as f:
                if f.read() == content:
                    return path
        except OSError:   # removed meanwhile or unreadable: not a copy this run can count on
            continue
    return None


def store_run(source_path: str, run: Run, results_dir: str) -> Tuple[str, bool]:
    """Copy a validated result file to results_dir/<machine-key>/<UTC timestamp>_<commit>.json, atomically
    (temporary file in the same folder, then rename); never overwrites. A result already stored there (the
    same bytes) is not stored twice: a history that counted it twice would take one night for two.
    Returns the stored path and whether it was stored now (False: the path of the earlier copy)."""
    folder = os.path.join(results_dir, run.machine_key)
    os.makedirs(folder, exist_ok=True)
    with open(source_path, "rb") as f:
        content = f.read()
    earlier = stored_copy(folder, content)
    if earlier is not None:
        return earlier, False
    name = stored_name(run)
    stem = name[:-len(".json")]
    ts, commit = stem.split("_", 1)
    target = os.path.join(folder, name)
    n = 1
    while os.path.exists(target):
        target = os.path.join(folder, f"{ts}-{n}_{commit}.json")
        n += 1
    write_atomically(target, content)
    return target, True

"""Files written whole or not at all: a reader (a nightly comparing with history, benchsuite reading the
PyTorch rows' samples) never sees half of one. And copies kept in the temporary folder for the user to look
at, under names no other user can have planted a symlink at."""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import tempfile

# Exclusive create: fails on any existing name, a planted symlink included (O_EXCL never follows one).
_CREATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
_NAME_TRIES = 100


def _create_beside(folder: str, prefix: str):
    """A new file `folder/<prefix><random>.tmp` with the mode a plain create gets (0o666 less the umask, or
    the folder's default ACL), unlike tempfile.mkstemp's 0600: a stored result must be readable by the
    group as the other results are. Returns (fd, path)."""
    for _ in range(_NAME_TRIES):
        path = os.path.join(folder, f"{prefix}{secrets.token_hex(6)}.tmp")
        try:
            return os.open(path, _CREATE_NEW, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {folder} after {_NAME_TRIES} tries")


def write_atomically(path: str, data: bytes) -> None:
    """A temporary file beside `path`, flushed to disk, then renamed over it; removed if anything fails. An OSError
    (a full disk: ENOSPC; a file-size limit: EFBIG) names `path`, not the temporary file nor nothing, so that the
    caller's one line says which file was not written."""
    try:
        fd, tmp = _create_beside(os.path.dirname(os.path.abspath(path)), "." + os.path.basename(path) + ".")
    except OSError as e:
        raise _naming(e, path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise _naming(e, path) from None
        raise


def _naming(error: OSError, path: str) -> OSError:
    """`error` as the OSError of writing `path` (its errno and reason kept)."""
    if error.errno is None:   # one made with a message only (no free temporary name)
        return OSError(errno.EEXIST, str(error), path)
    return OSError(error.errno, error.strerror, path)


def keep_copy(source: str, prefix: str) -> str:
    """Copies `source` to a new file of the temporary folder, `<prefix><random>.json` (created exclusively,
    private to the user), which outlives the caller's clean-up; returns its path."""
    fd, kept = tempfile.mkstemp(prefix=prefix, suffix=".json")
    try:
        with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
            shutil.copyfileobj(src, out)
    except BaseException:
        os.unlink(kept)
        raise
    return kept

"""Writes that matter go through here: temp file in the same folder, fsync, rename.

A temp file is locked while it is written, until its rename: one found unlocked was left
by a process killed mid-write, and `remove_orphans` may delete it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any

from compressor_2.common.errors import ConfigError, RunError
from compressor_2.common.file_kinds import file_kind

# `_temp_file`'s names: mkstemp puts 8 characters of this alphabet between prefix and suffix.
TEMP_NAME = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")


def _temp_file(path: Path) -> tuple[int, str]:
    """An open temp file next to `path`, `.{name}.{8 random characters}.tmp`, locked."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    # Where locks are not supported the file is simply never taken for an orphan.
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd, tmp


def remove_orphans(directory: Path) -> list[Path]:
    """Deletes the temp files killed writers left in `directory` (not below it) and returns
    them: files with a temp file's name that no process holds locked. A file another
    process is writing (an `evaluate` report, say) is locked, and kept."""
    if not directory.is_dir():
        return []
    removed = []
    for path in sorted(directory.iterdir()):
        if not TEMP_NAME.fullmatch(path.name) or path.is_symlink() or not path.is_file():
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path.unlink()
            removed.append(path)
        except OSError:
            continue  # in use, or gone already
        finally:
            os.close(fd)
    return removed


def why_unwritable(directory: Path) -> str | None:
    """Creates and removes one temp file in `directory`, as a write does, or, while it does
    not exist yet, in the nearest folder above it that does (where it would be made): nothing
    is left behind, not even the directory, for a command refused later. None when that
    worked, else why the writes that matter could not be made there (phrased to follow the
    directory's name)."""
    existing = directory
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return "is not a directory (a file stands there or above it)"
    try:
        fd, tmp = _temp_file(existing / "probe")
        os.unlink(tmp)
        os.close(fd)
    except OSError as exc:
        return f"cannot be written ({exc.strerror})"
    return None


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Writes `data` to `path` (a new path or a regular file) through a temp file and a rename.
    Anything else at `path` is refused: the rename would replace a device node, a FIFO or
    a symbolic link (not what it points to) with a regular file."""
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = stat.S_IFREG
    if not stat.S_ISREG(mode):
        raise ConfigError(f"'{path}' is {file_kind(mode)}, not a regular file: it is not written over; move it away "
                          "or write elsewhere")
    try:
        _write_and_rename(path, data)
    except OSError as exc:
        # A full disk's ENOSPC names no file by itself: the one line must.
        raise RunError(f"'{path}' cannot be written: {exc.strerror or exc}") from None


def _write_and_rename(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_file(path)
    try:
        # mkstemp makes 0600 files; give the usual umask-based mode so that, e.g., an SGLang
        # server running as another user can read token_clusters.npy.
        os.fchmod(fd, 0o666 & ~_UMASK)
        # Kept open (and so locked) until the rename.
        with os.fdopen(fd, "wb", closefd=False) as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    # The rename itself must survive a crash too.
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Read once at import: os.umask can only be read by setting it, which races with threads.
_UMASK = _read_umask()


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")

"""Writes that matter go through here: temp file in the same folder, fsync, rename."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def _temp_file(path: Path) -> tuple[int, str]:
    """An open temp file next to `path`: `.{name}.{8 random characters}.tmp`."""
    return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")


def why_unwritable(directory: Path) -> str | None:
    """Makes `directory` and creates and removes one temp file there, as a write does; None
    when that worked, else why the writes that matter could not be made there (phrased to
    follow the directory's name)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = _temp_file(directory / "probe")
        os.close(fd)
        os.unlink(tmp)
    except (FileExistsError, NotADirectoryError):
        return "is not a directory (a file stands there or above it)"
    except OSError as exc:
        return f"cannot be written ({exc.strerror})"
    return None


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_file(path)
    try:
        # mkstemp makes 0600 files; give the usual umask-based mode so that, e.g., an SGLang
        # server running as another user can read token_clusters.npy.
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
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

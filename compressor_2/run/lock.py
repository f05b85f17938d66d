"""One `evolve` per run directory: the archive has one writer, and two runs writing the
same state file would corrupt each other's resume.

The lock is held on the directory itself, not on a file in it: `rm run.lock` during a run
once let a second `evolve` in. run.lock only names the holder's pid (and marks the
directory as a run's for the other commands)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from compressor_2.errors import RunError

LOCK_FILE = "run.lock"


@contextlib.contextmanager
def run_lock(directory: Path) -> Iterator[None]:
    """Holds an exclusive lock on `directory` or refuses at once. The kernel drops the
    lock when the process dies, however it dies, so a killed run never blocks a rerun."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunError(f"'{directory}' is in use by another evolve (pid {_holder(directory)}): wait for it to finish "
                       "or stop it, or choose another CONFIG_OUTPUT_DIR") from None
    try:
        (directory / LOCK_FILE).write_text(f"{os.getpid()}\n", encoding="utf-8")
        yield
    finally:
        os.close(fd)


def _holder(directory: Path) -> str:
    try:
        return (directory / LOCK_FILE).read_text(encoding="utf-8", errors="replace").strip()[:32] or "unknown"
    except OSError:
        return f"unknown: {LOCK_FILE} was removed"

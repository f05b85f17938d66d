"""One `evolve` per run directory: the archive has one writer, and two runs writing the
same state file would corrupt each other's resume."""

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
    path = directory / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunError(f"'{directory}' is in use by another evolve (pid {holder}): wait for it to finish "
                       "or stop it, or choose another CONFIG_OUTPUT_DIR") from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)

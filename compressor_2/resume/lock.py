"""One `evolve` per run directory: the archive has one writer, and two runs writing the
same state file would corrupt each other's resume.

The lock is held on the directory itself, not on a file in it: `rm run.lock` during a run
once let a second `evolve` in. run.lock only names the holder's pid (and marks the
directory as a run's for the other commands). It is opened without following a link and
without blocking, and written only when it is a regular file: a FIFO there once held
`evolve` for ever.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from compressor_2.common import ConfigError, RunError, file_kind

RUN_LOCK_FILE = "run.lock"
_PID_CHARS = 32  # of run.lock read back for a message
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@contextlib.contextmanager
def run_lock(directory: Path) -> Iterator[None]:
    """Holds an exclusive lock on `directory` or refuses at once. The kernel drops the
    lock when the process dies, however it dies, so a killed run never blocks a rerun."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = _locked(directory)
    try:
        _write_pid(directory / RUN_LOCK_FILE)
        yield
    finally:
        os.close(fd)


def check_not_in_use(directory: Path) -> None:
    """Refuses at once, before the checks that take seconds, a run directory another evolve
    holds; takes nothing and makes nothing (`run_lock` takes the lock once they passed)."""
    if directory.is_dir():
        os.close(_locked(directory))


def _locked(directory: Path) -> int:
    """An open descriptor of `directory` holding its exclusive lock; RunError naming the
    holder when another process holds it."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunError(f"'{directory}' is in use by another evolve (pid {_holder(directory)}): wait for it to finish "
                       "or stop it, or choose another CONFIG_OUTPUT_DIR") from None
    return fd


def check_lock_file(path: Path) -> None:
    """run.lock is absent or a regular file; anything else is refused in one line."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise ConfigError(f"'{path}' is {file_kind(mode)}, not a regular file: remove it (it only names the pid "
                          "of the evolve holding the run directory, whose lock is on the directory itself)")


def _write_pid(path: Path) -> None:
    check_lock_file(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | _OPEN_FLAGS, 0o644)
    except OSError as exc:  # made a FIFO, a link or a directory since the check
        raise ConfigError(f"'{path}' cannot be opened as a regular file ({exc.strerror}): remove it") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"'{path}' is {file_kind(os.fstat(fd).st_mode)}, not a regular file: remove it")
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    finally:
        os.close(fd)


def _holder(directory: Path) -> str:
    """The pid run.lock names, read without blocking on whatever stands there."""
    try:
        fd = os.open(directory / RUN_LOCK_FILE, os.O_RDONLY | _OPEN_FLAGS)
    except FileNotFoundError:
        return f"unknown: {RUN_LOCK_FILE} was removed"
    except OSError:
        return f"unknown: {RUN_LOCK_FILE} cannot be read"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return f"unknown: {RUN_LOCK_FILE} is not a regular file"
        text = os.read(fd, _PID_CHARS).decode("utf-8", errors="replace").strip()
    finally:
        os.close(fd)
    return text or "unknown"

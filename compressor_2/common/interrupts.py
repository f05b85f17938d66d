"""Ctrl+C and SIGTERM stop a command once: the first raises KeyboardInterrupt (a run then
saves its state and stops its servers), and every later one is ignored, so that a second
Ctrl+C cuts short neither that save, nor the clean-up, nor the interpreter's exit, and
never prints a traceback."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Iterator, Sequence

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_ARRIVED = threading.Event()  # in the outermost `stop_on_first_signal` block


def _stop(signum: int, frame: object) -> None:
    del signum, frame
    _ARRIVED.set()
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt


def stopping() -> bool:
    """Whether a stop signal has arrived: an error raised after it is its consequence (a
    KeyboardInterrupt that lands in a module's import comes out as an ImportError)."""
    return _ARRIVED.is_set()


def _main_thread() -> bool:
    # Signal handlers can only be set, and only run, there.
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def stop_on_first_signal(restore: bool = True) -> Iterator[None]:
    """Inside the block the first SIGINT or SIGTERM raises KeyboardInterrupt and the later
    ones are ignored; a signal ignored on entry (Ctrl+C, for a background job) stays ignored.
    Nested in another such block it changes nothing. On the way out the previous handlers
    come back, unless `restore` is False and a signal arrived: the process is then exiting
    (the CLI), and a late Ctrl+C would meet Python's own handler during the exit."""
    if not _main_thread() or _stop in map(signal.getsignal, SIGNALS):
        yield
        return
    _ARRIVED.clear()
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    # None: a handler set outside Python, which could not be put back.
    armed = [sig for sig, handler in previous.items() if handler not in (signal.SIG_IGN, None)]
    for sig in armed:
        signal.signal(sig, _stop)
    try:
        yield
    finally:
        if restore or not stopping():
            for sig in armed:
                signal.signal(sig, previous[sig])


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    """A Ctrl+C must not cut a final save short, whatever started it."""
    if not _main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


async def gather_or_cancel(tasks: Sequence[asyncio.Task[None]]) -> None:
    """Awaits every task; one failure (or Ctrl+C) cancels the rest and waits for them, so
    nothing stays in flight behind a call that ended."""
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise

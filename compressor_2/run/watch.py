"""While a reflector call waits, what the run is waiting for: a hanging endpoint is never a
silent run."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from compressor_2.common import say
from compressor_2.reflector import Outstanding, Reflector

WAIT_NOTICE = 5.0  # seconds a reflector call waits before a line says so
WAIT_REPEAT = 30.0  # and then again every this many seconds while the run still waits
WAIT_POLL = 1.0


def waiting_line(reflector: Reflector, waiting: Sequence[Outstanding], now: float) -> str:
    oldest = min(waiting, key=lambda call: call.since)
    bound = (f"; a call gives up after {reflector.timeout:g} s (CONFIG_REFLECTOR_TIMEOUT)"
             if reflector.timeout is not None else "")
    return (f"waiting {now - oldest.since:.0f} s for the reflector ({reflector.where}): {len(waiting)} call(s) in "
            f"flight, the oldest a {oldest.what}{bound}")


class CallWatch:
    """While the block runs, a thread of its own says what the run waits for once a
    reflector call has waited WAIT_NOTICE seconds, and again every WAIT_REPEAT seconds: a
    hanging endpoint is never a silent run. The thread ends with the block."""

    def __init__(self, reflector: Reflector) -> None:
        self.reflector = reflector
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="reflector-watch", daemon=True)

    def __enter__(self) -> CallWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        said: float | None = None
        while not self._done.wait(WAIT_POLL):
            waiting, now = self.reflector.outstanding(), time.monotonic()
            if not waiting:
                said = None
            elif (now - min(call.since for call in waiting) >= WAIT_NOTICE
                  and (said is None or now - said >= WAIT_REPEAT)):
                say(waiting_line(self.reflector, waiting, now))
                said = now

"""What the user sees while evolve runs: a bar over answers being generated, one line per
generation, and, while a reflector call waits, what the run is waiting for."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from tqdm import tqdm

from compressor_2.data.example import Example
from compressor_2.fitness import Evaluation, Evaluator
from compressor_2.reflector.base import Outstanding, Reflector

WAIT_NOTICE = 5.0  # seconds a reflector call waits before a line says so
WAIT_REPEAT = 30.0  # and then again every this many seconds while the run still waits
WAIT_POLL = 1.0


@contextmanager
def answers_bar(total: int, label: str) -> Iterator[tqdm]:
    """`total` is an upper bound: genomes served from the cache generate nothing."""
    bar = tqdm(total=total, desc=label, unit="answer", leave=False, dynamic_ncols=True)
    try:
        yield bar
    finally:
        bar.close()


def evaluate_with_bar(evaluator: Evaluator, genomes: Sequence[Sequence[float]], examples: Sequence[Example],
                      label: str) -> list[Evaluation]:
    """All `genomes` on `examples` in one engine call, with a bar."""
    with answers_bar(len(genomes) * len(examples), label) as bar:
        return evaluator.evaluate(genomes, bar.update, examples)


@contextmanager
def timed(seconds: dict[str, float], stage: str) -> Iterator[None]:
    """Adds the block's wall time to `seconds[stage]`."""
    started = time.perf_counter()
    try:
        yield
    finally:
        seconds[stage] = round(seconds.get(stage, 0.0) + time.perf_counter() - started, 3)


def say(line: str) -> None:
    """Prints above any progress bar."""
    tqdm.write(line)


def plural(noun: str) -> str:
    """"generation" -> "generations", "batch" -> "batches"."""
    return noun + ("es" if noun.endswith(("s", "sh", "ch", "x", "z")) else "s")


def ordinal(generation: int, ngen: int) -> str:
    """Generations are 0-based, as in file names and history.json: "2 (3 of 6)"."""
    return f"{generation} ({generation + 1} of {ngen})"


def generation_line(generation: int, ngen: int, stats: dict[str, Any], work: dict[str, Any],
                    elapsed: float) -> str:
    return (f"gen {ordinal(generation, ngen)}: best {stats['best_fitness']:.4f}  "
            f"mean {stats['mean_fitness']:.4f}  tokens {stats['mean_tokens']:.1f}  "
            f"correct {100 * stats['correctness']:.0f}%  best ever {stats['best_ever_fitness']:.4f}  "
            f"evals {work['evaluations_run']} (+{work['cache_hits']} cached)  "
            f"reflector {work['reflector_calls']} calls  elapsed {elapsed:.0f}s")


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

"""What a command shows while it works, for every module to use: one line above any
progress bar (`say`), a bar over answers being generated, the words for counts, and how
long each stage of a step took."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm import tqdm


def say(line: str) -> None:
    """Prints above any progress bar."""
    tqdm.write(line)


@contextmanager
def answers_bar(total: int, label: str) -> Iterator[tqdm]:
    """`total` is an upper bound: genomes served from the cache generate nothing."""
    bar = tqdm(total=total, desc=label, unit="answer", leave=False, dynamic_ncols=True)
    try:
        yield bar
    finally:
        bar.close()


def plural(noun: str) -> str:
    """"generation" -> "generations", "batch" -> "batches"."""
    return noun + ("es" if noun.endswith(("s", "sh", "ch", "x", "z")) else "s")


def ordinal(step: int, steps: int) -> str:
    """Steps are 0-based, as in file names and history.json: "2 (3 of 6)"."""
    return f"{step} ({step + 1} of {steps})"


@contextmanager
def timed(seconds: dict[str, float], stage: str) -> Iterator[None]:
    """Adds the block's wall time to `seconds[stage]`."""
    started = time.perf_counter()
    try:
        yield
    finally:
        seconds[stage] = round(seconds.get(stage, 0.0) + time.perf_counter() - started, 3)

"""Operators more than one strategy uses, as small pure functions: the fitness-weighted
crossover of two genomes (the GA's mate, the archive's crossover generator) and the
scratchpad's appended summary (every full-vector proposal)."""

from __future__ import annotations

from collections.abc import Sequence

from compressor_2.deltas import clamp
from compressor_2.reflector import keep_recent


def weighted_average(a: Sequence[float], b: Sequence[float], fitness_a: float,
                     fitness_b: float) -> list[float]:
    """child[c] = (f_a * a[c] + f_b * b[c]) / (f_a + f_b); the plain mean when both are 0.
    Fitness is never negative, so the child lies between its bounded parents; the clamp
    only takes back the last bit rounding can add (30 and 30 can average 30.000000000000004)."""
    total = fitness_a + fitness_b
    if total == 0:
        return [clamp((x + y) / 2) for x, y in zip(a, b, strict=True)]
    return [clamp((fitness_a * x + fitness_b * y) / total) for x, y in zip(a, b, strict=True)]


def append_summary(scratchpad: str, summary: str) -> str:
    """The driver appends the reflector's summary to the evolving summary,
    which keeps its most recent notes (reflector/limits.py)."""
    return keep_recent("\n".join(part for part in (scratchpad.strip(), summary.strip()) if part))

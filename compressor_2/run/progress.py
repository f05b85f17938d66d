"""What the user sees while evolve runs: a bar over answers being generated, and one line
per generation."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tqdm import tqdm


@contextmanager
def answers_bar(total: int, label: str) -> Iterator[tqdm]:
    """`total` is an upper bound: genomes served from the cache generate nothing."""
    bar = tqdm(total=total, desc=label, unit="answer", leave=False, dynamic_ncols=True)
    try:
        yield bar
    finally:
        bar.close()


def say(line: str) -> None:
    """Prints above any progress bar."""
    tqdm.write(line)


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

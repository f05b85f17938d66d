"""history.json: one entry per generation g, describing the population entering g (what
selection saw) and the work g did; the last entry is the final population, and holds
`stop_reason` once the run has stopped (all generations ran, or a budget was reached).

Entry i is generation (or iteration) i for every strategy, and the plots read the same
fields from all of them; a resumed run checks both, and that every number is finite,
before any work."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from compressor_2.common.atomic import atomic_write_json
from compressor_2.common.errors import ConfigError
from compressor_2.resume import fields
from compressor_2.resume.fields import FieldError

HISTORY_FILE = "history.json"
PLOTTED = ("best_fitness", "mean_fitness", "best_ever_fitness", "mean_tokens", "best_mean_tokens")


@dataclass
class Work:
    """What one generation did; counts the seed's §1 quantities."""

    evaluations_run: int = 0  # genomes generated and judged
    cache_hits: int = 0  # genomes served from the cache
    metric_calls: int = 0  # fresh (genome, example) answers: what CONFIG_MAX_METRIC_CALLS counts
    parents: int = 0
    children: int = 0
    crossovers: int = 0
    clones: int = 0
    mutations: int = 0  # mutations that changed a child (evaluated a second time)
    mutations_skipped: int = 0  # MUTPB fired but both reflector attempts were invalid
    reflector_calls: int = 0
    reflector_prompt_tokens: int = 0
    reflector_completion_tokens: int = 0
    seconds: float = 0.0
    selection: dict[str, Any] | None = None  # CONFIG_SELECTION="llm": the selector's choice


def population_stats(generation: int, population: Sequence[Any], best_ever: float) -> dict[str, Any]:
    fitness = [ind.fitness.values[0] for ind in population]
    best = population[max(range(len(population)), key=fitness.__getitem__)]
    return {
        "generation": generation,
        "best_fitness": max(fitness),
        "mean_fitness": sum(fitness) / len(fitness),
        "min_fitness": min(fitness),
        "mean_tokens": sum(ind.evaluation.mean_tokens for ind in population) / len(population),
        "correctness": sum(ind.evaluation.correctness for ind in population) / len(population),
        "best_mean_tokens": best.evaluation.mean_tokens,
        "best_correctness": best.evaluation.correctness,
        "best_ever_fitness": best_ever,
    }


def entry(stats: dict[str, Any], work: Work) -> dict[str, Any]:
    done = asdict(work)
    if done["selection"] is None:
        del done["selection"]
    return {**stats, **done}


def load_history(path: Path, before: int | None) -> list[dict[str, Any]]:
    """The entries of generations < `before` (a resumed run rewrites the rest); None: all."""
    if not path.exists():
        return []
    hint = "move it away to continue without it"
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"'{path}' cannot be read ({exc}); {hint}") from None
    try:
        _check(entries)
    except FieldError as exc:
        raise ConfigError(f"'{path}': {exc}; {hint}") from None
    if before is None:
        return entries
    if len(entries) < before:
        raise ConfigError(f"'{path}' ends before generation {before}, where the run resumes; {hint}")
    return entries[:before]


def _check(entries: Any) -> None:
    if not isinstance(entries, list):
        raise FieldError(f"holds {fields.shown(entries)}, not a list of generation entries")
    for i, item in enumerate(entries):
        if not isinstance(item, dict):
            raise FieldError(f"entry {i} is {fields.shown(item)}, not an object")
        where = f"entry {i}: "
        if fields.integer(item, "generation", where) != i:
            raise FieldError(f"{where}generation is {item['generation']}, not {i} (entries run 0, 1, 2, ...)")
        for key in PLOTTED:
            fields.number(item, key, where)
        for key, found in item.items():
            if isinstance(found, float) and not math.isfinite(found):
                raise FieldError(f"{where}{key} is {found!r}, not a finite number")


def save_history(path: Path, entries: Sequence[dict[str, Any]]) -> None:
    atomic_write_json(path, list(entries))

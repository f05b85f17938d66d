"""history.json: one entry per step (the GA's: the population entering generation g, what
selection saw, and the work g did; its last entry is the final population), the last one
holding `stop_reason` once the run has stopped (all steps ran, or a budget was reached);
and a strategy's own step log, its entries as JSON lines (the archive strategy's
snapshots.jsonl), appended to after every step.

Entry i is step i for every strategy, and the plots read the same fields from all of
them, made by one function (`step_entry`) from what the step scored; a resumed run checks
both, and that every number is finite, before any work."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NotRequired, Protocol, TypedDict, cast

import numpy as np

from compressor_2.common import ConfigError, atomic_write_json, atomic_write_text
from compressor_2.resume import fields
from compressor_2.resume.fields import FieldError

HISTORY_FILE = "history.json"
PLOTTED = ("best_fitness", "mean_fitness", "best_ever_fitness", "mean_tokens", "best_mean_tokens")


class StepEntry(TypedDict):
    """One step's entry of history.json, as a step returns it (`Report.entries`) and the
    driver writes it (a plain JSON object on disk): the fields every plot reads, made by
    `step_entry` from what the step scored; those only some strategies write; and
    `stop_reason`, on the last entry once the run has stopped. A strategy may add fields
    of its own (the GA's `Work`, the archive's census, GEPA's proposal), written after
    these as they are."""

    generation: int
    best_fitness: float
    mean_fitness: float
    mean_tokens: float
    best_mean_tokens: float
    best_ever_fitness: float | None
    min_fitness: NotRequired[float]
    correctness: NotRequired[float]
    best_correctness: NotRequired[float]
    p10: NotRequired[float]
    p50: NotRequired[float]
    p90: NotRequired[float]
    metric_calls: NotRequired[int]
    seconds: NotRequired[float]
    stop_reason: NotRequired[str]


@dataclass
class Work:
    """What one generation did, counted: evaluations, answers, operators, reflector calls."""

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


class Scored(Protocol):
    """What a step scored of one genome: an `Evaluation`, or a `Score`."""

    @property
    def fitness(self) -> float: ...

    @property
    def mean_tokens(self) -> float: ...

    @property
    def correctness(self) -> float: ...


@dataclass(frozen=True)
class Score:
    fitness: float
    mean_tokens: float
    correctness: float


def step_entry(step: int, scored: Sequence[Scored], best_ever: float | None,
               percentiles: bool = False) -> StepEntry:
    """The fields every plot reads of step `step`, from what it scored (a population, a batch,
    a pool, an archive): the best fitness (the first of equals is the best), the mean and
    the least, the mean tokens and correctness, the best one's tokens and correctness, and
    the best ever; with `percentiles`, the fitness's p10, p50 and p90 (a progress plot's)."""
    fitness = [s.fitness for s in scored]
    best = scored[max(range(len(scored)), key=fitness.__getitem__)]
    entry: StepEntry = {
        "generation": step,
        "best_fitness": max(fitness),
        "mean_fitness": sum(fitness) / len(fitness),
        "min_fitness": min(fitness),
        "mean_tokens": sum(s.mean_tokens for s in scored) / len(scored),
        "correctness": sum(s.correctness for s in scored) / len(scored),
        "best_mean_tokens": best.mean_tokens,
        "best_correctness": best.correctness,
        "best_ever_fitness": best_ever,
    }
    if percentiles:
        entry["p10"], entry["p50"], entry["p90"] = (float(np.percentile(fitness, q)) for q in (10, 50, 90))
    return entry


def work_entry(stats: StepEntry, work: Work) -> StepEntry:
    """A GA generation's entry: the fields of the population it saw, and the work it did."""
    done = asdict(work)
    if done["selection"] is None:
        del done["selection"]
    return cast(StepEntry, {**stats, **done})


def load_history(path: Path, before: int | None) -> list[StepEntry]:
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


def save_history(path: Path, entries: Sequence[StepEntry]) -> None:
    atomic_write_json(path, list(entries))


def append_log(path: Path, entries: Sequence[StepEntry]) -> None:
    """A step's entries, one JSON line each, at the end of the step log `path`."""
    with path.open("a", encoding="utf-8") as handle:
        handle.writelines(json.dumps(entry) + "\n" for entry in entries)


def truncate_log(path: Path, before: int) -> None:
    """The step log without the lines of steps from `before` on, which a resume replays."""
    if path.exists():
        kept = [line for step, line in log_lines(path) if step < before]
        atomic_write_text(path, "".join(line + "\n" for line in kept))


def log_lines(path: Path) -> list[tuple[int, str]]:
    """(step, line) of every line of the step log `path`; a line that cannot be read is
    refused, naming it (a resume reads it with the state, before it writes anything)."""
    if not path.exists():
        return []
    lines = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            step = fields.integer(entry, "generation") if isinstance(entry, dict) else None
        except (ValueError, FieldError) as exc:
            raise ConfigError(f"'{path}' line {number}: {exc}; remove the line, or move the run directory away "
                              "to start a fresh run") from None
        if step is None:
            raise ConfigError(f"'{path}' line {number} is not a JSON object; remove the line, or move the run "
                              "directory away to start a fresh run")
        lines.append((step, line))
    return lines

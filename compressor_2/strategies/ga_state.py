"""evolution_state.json (seed 000 §2): everything a rerun needs to continue the run.

Keys: generation (the next one to run), population [{candidate_id, deltas,
scratchpad}], best_individual {candidate_id, deltas, scratchpad} (null before anything
was evaluated), best_fitness, rr_idx, rng: the `random` and numpy global RNG states, so
a resumed run draws exactly what an uninterrupted one would have (GEPA forgets its RNG
on resume), and last_candidate_id: the archive's newest candidate when the state was
taken; a resume forgets the candidates made after it, so the replayed generation gives
them the same ids again. The answers themselves live in the run archive.

The file is read field by field (types, finite numbers, a best fitness within the
fitness's bounds) and then checked against the archive, before any work: a hand-edited
state is refused with one line naming the file and the field, never trusted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any


from compressor_2.atomic import atomic_write_json
from compressor_2.errors import ConfigError
from compressor_2.run import fields
from compressor_2.run.fields import FieldError
from compressor_2.run.state import FRESH_START_HINT, Member, check_rng
from compressor_2.deltas import validate_deltas

if TYPE_CHECKING:
    from compressor_2.archive.database import RunArchive

STATE_FILE = "evolution_state.json"


@dataclass(frozen=True)
class EvolutionState:
    generation: int
    population: tuple[Member, ...]
    best_individual: Member | None
    best_fitness: float | None
    rr_idx: int
    rng: dict[str, Any]
    last_candidate_id: int


def _member_json(member: Member) -> dict[str, Any]:
    return {"candidate_id": member.candidate_id, "deltas": member.deltas, "scratchpad": member.scratchpad}


def save_state(path: Path, state: EvolutionState) -> None:
    atomic_write_json(path, {
        "generation": state.generation,
        "population": [_member_json(m) for m in state.population],
        "best_individual": _member_json(state.best_individual) if state.best_individual else None,
        "best_fitness": state.best_fitness,
        "rr_idx": state.rr_idx,
        "rng": state.rng,
        "last_candidate_id": state.last_candidate_id,
    })


def load_state(path: Path, cluster_ids: Sequence[str], population_size: int,
               max_fitness: float) -> EvolutionState | None:
    """The saved state, or None when there is none (a fresh run). A state that cannot be
    used is a ConfigError: silently starting afresh would throw a run away. `max_fitness`
    (lambda_s + lambda_c: both fitness terms lie in [0, 1]) bounds the best fitness."""
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"'{path}' cannot be read ({exc}); {FRESH_START_HINT}") from None
    if isinstance(raw, dict) and "rr_idx" in raw and "last_candidate_id" not in raw:
        raise ConfigError(f"'{path}' was written by a compressor_2 without the run archive (no candidate "
                          "ids): finish that run with the version that started it, or move the directory "
                          "away (or choose another CONFIG_OUTPUT_DIR) to start a fresh run")
    try:
        state = _parse(raw, path, cluster_ids, max_fitness)
    except FieldError as exc:
        raise ConfigError(f"'{path}': {exc}; {FRESH_START_HINT}") from None
    except ConfigError as exc:
        raise ConfigError(f"{exc} (the clusters changed since this run started); {FRESH_START_HINT}") from None
    if len(state.population) != population_size:
        raise ConfigError(f"'{path}' holds {len(state.population)} individuals but "
                          f"CONFIG_POPULATION_SIZE={population_size}; {FRESH_START_HINT}")
    return state


def _parse(raw: Any, path: Path, cluster_ids: Sequence[str], max_fitness: float) -> EvolutionState:
    """Raises FieldError for a field of the wrong kind, ConfigError for deltas over other
    clusters."""
    if not isinstance(raw, dict):
        raise FieldError(f"holds {fields.shown(raw)}, not a JSON object")

    def member(obj: Any, where: str) -> Member:
        if not isinstance(obj, dict):
            raise FieldError(f"{where} is {fields.shown(obj)}, not an object")
        scratchpad = fields.typed(obj, "scratchpad", str, "a string", f"{where}.")
        cid = fields.integer(obj, "candidate_id", f"{where}.", minimum=1)
        deltas = fields.typed(obj, "deltas", dict, "an object {cluster id: delta}", f"{where}.")
        for cluster in deltas:
            fields.number(deltas, cluster, f"{where}.deltas.")
        return Member(validate_deltas(deltas, cluster_ids, f"'{path}' {where}"), scratchpad, cid)

    generation = fields.integer(raw, "generation")
    rr_idx = fields.integer(raw, "rr_idx")
    if rr_idx >= len(cluster_ids):
        raise FieldError(f"rr_idx is {rr_idx}, not in [0, {len(cluster_ids)})")
    last = fields.integer(raw, "last_candidate_id")
    population = tuple(member(m, f"population[{i}]")
                       for i, m in enumerate(fields.typed(raw, "population", list, "a list")))
    best = fields.value(raw, "best_individual")
    best_fitness = (None if fields.value(raw, "best_fitness") is None
                    else fields.number(raw, "best_fitness", low=0.0, high=max_fitness))
    if (best is None) != (best_fitness is None):
        raise FieldError("best_individual and best_fitness must both be set or both be null")
    check_rng(raw)
    return EvolutionState(generation, population, member(best, "best_individual") if best is not None else None,
                          best_fitness, rr_idx, raw["rng"], last)


def check_against_archive(state: EvolutionState, path: Path, archive: RunArchive, deterministic: bool) -> None:
    """The state must describe the run its archive holds: its population are candidates the
    archive holds with the same deltas, and its best fitness is the one the archive recorded
    for the best individual. Called before the resume's rollback, while the archive still
    holds what the state refers to. Only a `deterministic` run (greedy decoding, answers
    reused) gives a genome one fitness; and the best may be a candidate a rollback already
    forgot, or one a replay made again differently: those are not compared."""
    newest = archive.last_candidate_id()
    if state.last_candidate_id > newest:
        raise ConfigError(f"'{path}': last_candidate_id is {state.last_candidate_id} but the newest candidate "
                          f"of '{archive.path}' is {newest}; {FRESH_START_HINT}")
    for i, member in enumerate(state.population):
        candidate = archive.candidate(member.candidate_id)
        if candidate is None or candidate.deltas != member.deltas:
            held = "does not hold it" if candidate is None else "holds it with other deltas"
            raise ConfigError(f"'{path}': population[{i}] is candidate {member.candidate_id}, but "
                              f"'{archive.path}' {held}; {FRESH_START_HINT}")
    best, recorded = state.best_individual, None
    if best is not None and deterministic:
        candidate = archive.candidate(best.candidate_id)
        if candidate is not None and candidate.deltas == best.deltas:
            recorded = candidate.fitness
    if recorded is not None and state.best_fitness is not None and not math.isclose(
            recorded, state.best_fitness, rel_tol=1e-9, abs_tol=1e-12):
        raise ConfigError(f"'{path}': best_fitness is {state.best_fitness!r}, but '{archive.path}' records "
                          f"{recorded!r} for the best individual (candidate {best.candidate_id}); "
                          f"{FRESH_START_HINT}")

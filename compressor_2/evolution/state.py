"""evolution_state.json (seed 000 §2): everything a rerun needs to continue the run.

Keys: generation (the next one to run), population [{candidate_id, deltas,
scratchpad}], best_individual {candidate_id, deltas, scratchpad} (null before anything
was evaluated), best_fitness, rr_idx, rng: the `random` and numpy global RNG states, so
a resumed run draws exactly what an uninterrupted one would have (GEPA forgets its RNG
on resume), and last_candidate_id: the archive's newest candidate when the state was
taken; a resume forgets the candidates made after it, so the replayed generation gives
them the same ids again. The answers themselves live in the run archive.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compressor_2.atomic import atomic_write_json
from compressor_2.errors import ConfigError
from compressor_2.steering.deltas import Deltas, validate_deltas

STATE_FILE = "evolution_state.json"


@dataclass(frozen=True)
class Member:
    deltas: Deltas
    scratchpad: str
    candidate_id: int


@dataclass(frozen=True)
class EvolutionState:
    generation: int
    population: tuple[Member, ...]
    best_individual: Member | None
    best_fitness: float | None
    rr_idx: int
    rng: dict[str, Any]
    last_candidate_id: int


def seed_rng(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)


def capture_rng() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {"random": [version, list(internal), gauss],
            "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]}


def restore_rng(rng: dict[str, Any], into: tuple[Any, Any] = (random, np.random)) -> None:
    """Sets the global RNGs, or the (random.Random, np.random.RandomState) pair `into`."""
    version, internal, gauss = rng["random"]
    into[0].setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = rng["numpy"]
    into[1].set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


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


def load_state(path: Path, cluster_ids: Sequence[str], population_size: int) -> EvolutionState | None:
    """The saved state, or None when there is none (a fresh run). A state that cannot be
    used is a ConfigError: silently starting afresh would throw a run away."""
    if not path.exists():
        return None
    hint = "move it away (or choose another CONFIG_OUTPUT_DIR) to start a fresh run"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"'{path}' cannot be read ({exc}); {hint}") from None
    if isinstance(raw, dict) and "rr_idx" in raw and "last_candidate_id" not in raw:
        raise ConfigError(f"'{path}' was written by a compressor_2 without the run archive (no candidate "
                          "ids): finish that run with the version that started it, or move the directory "
                          "away (or choose another CONFIG_OUTPUT_DIR) to start a fresh run")
    try:
        state = _parse(raw, path, cluster_ids)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"'{path}' is malformed ({type(exc).__name__}: {exc}); {hint}") from None
    except ConfigError as exc:
        raise ConfigError(f"{exc} (the clusters changed since this run started); {hint}") from None
    if len(state.population) != population_size:
        raise ConfigError(f"'{path}' holds {len(state.population)} individuals but "
                          f"CONFIG_POPULATION_SIZE={population_size}; {hint}")
    return state


def _parse(raw: dict[str, Any], path: Path, cluster_ids: Sequence[str]) -> EvolutionState:
    def member(obj: dict[str, Any], where: str) -> Member:
        scratchpad = obj["scratchpad"]
        if not isinstance(scratchpad, str):
            raise TypeError(f"{where}.scratchpad is not a string")
        cid = obj["candidate_id"]
        if isinstance(cid, bool) or not isinstance(cid, int) or cid < 1:
            raise ValueError(f"{where}.candidate_id is {cid!r}")
        return Member(validate_deltas(obj["deltas"], cluster_ids, f"'{path}' {where}"), scratchpad, cid)

    generation, rr_idx, last = raw["generation"], raw["rr_idx"], raw["last_candidate_id"]
    if isinstance(last, bool) or not isinstance(last, int) or last < 0:
        raise ValueError(f"last_candidate_id is {last!r}")
    if not isinstance(generation, int) or generation < 0:
        raise ValueError(f"generation is {generation!r}")
    if not isinstance(rr_idx, int) or not 0 <= rr_idx < len(cluster_ids):
        raise ValueError(f"rr_idx is {rr_idx!r}, not in [0, {len(cluster_ids)})")
    population = tuple(member(m, f"population[{i}]") for i, m in enumerate(raw["population"]))
    best = raw["best_individual"]
    best_fitness = raw["best_fitness"]
    if (best is None) != (best_fitness is None):
        raise ValueError("best_individual and best_fitness must both be set or both be null")
    rng = raw["rng"]
    restore_rng(rng, into=(random.Random(), np.random.RandomState()))  # well-formed?
    return EvolutionState(generation, population,
                          member(best, "best_individual") if best is not None else None,
                          float(best_fitness) if best_fitness is not None else None, rr_idx, rng, last)


def capture_rng_of(rng: random.Random) -> dict[str, Any]:
    """A strategy's own RNG in `restore_rng`'s format (its numpy part is the global one)."""
    version, internal, gauss = rng.getstate()
    return {**capture_rng(), "random": [version, list(internal), gauss]}


def load_strategy_state(path: Path, keys: Sequence[str]) -> dict[str, Any] | None:
    """A strategy's state file (JSON with `rng`, an integer `iteration` and
    `last_candidate_id`, and `keys`), or None for a fresh run. One that cannot be used is
    a ConfigError, never a silent fresh start."""
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        restore_rng(state["rng"], into=(random.Random(), np.random.RandomState()))
        missing = [key for key in keys if key not in state]
        if missing:
            raise KeyError(", ".join(missing))
        if not isinstance(state["iteration"], int) or not isinstance(state["last_candidate_id"], int):
            raise ValueError("iteration and last_candidate_id must be integers")
        return state
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"'{path}' cannot be read ({type(exc).__name__}: {exc}); move it away (or choose "
                          "another CONFIG_OUTPUT_DIR) to start a fresh run") from None

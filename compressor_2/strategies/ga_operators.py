"""The GA's own arithmetic and choices as small pure functions (seed 000 §1, §2): the
round robin over mutation targets, the pairing of parents and the selections by name.

Selection draws from the global `random` module (DEAP's selectors do); the loop seeds it
and saves its state, so a resumed run draws what an uninterrupted one would have.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from deap import tools

from compressor_2.config import Config
from compressor_2.errors import ConfigError

T = TypeVar("T")


@dataclass
class RRState:
    """The driver's round-robin over mutation targets; `rr_idx` is persisted."""

    cluster_ids: list[str]
    rr_idx: int = 0


def next_target(rr: RRState) -> str:
    """The current target cluster; advances the cycle."""
    target = rr.cluster_ids[rr.rr_idx]
    rr.rr_idx = (rr.rr_idx + 1) % len(rr.cluster_ids)
    return target


def pairs(parents: Sequence[T]) -> list[tuple[T, T]]:
    """2N selected parents -> N (A, B) pairs, in selection order."""
    if len(parents) % 2:
        raise ValueError(f"{len(parents)} parents cannot be paired")
    return [(parents[i], parents[i + 1]) for i in range(0, len(parents), 2)]


class Selection(Protocol):
    def select(self, population: Sequence[T], k: int) -> list[T]:
        """`k` parents, drawn with replacement; references, not copies."""
        ...


@dataclass(frozen=True)
class Tournament:
    size: int

    def select(self, population: Sequence[T], k: int) -> list[T]:
        return tools.selTournament(population, k, tournsize=self.size)


@dataclass(frozen=True)
class Truncation:
    top_k: int

    def select(self, population: Sequence[T], k: int) -> list[T]:
        """The top-k by fitness form the pool; parents are drawn from it with replacement."""
        return tools.selRandom(tools.selBest(population, self.top_k), k)


@dataclass(frozen=True)
class Uniform:
    """Seed 002's parents: the members the selector chose, drawn uniformly with replacement."""

    def select(self, population: Sequence[T], k: int) -> list[T]:
        return tools.selRandom(population, k)


def _size(symbol: str, value: int | None, population_size: int) -> int:
    """Seed 000 §2: a tournament size or truncation top-k lies in [2, population]."""
    if value is None or not 2 <= value <= population_size:
        raise ConfigError(f"{symbol}={value} must be in [2, population] = [2, {population_size}]")
    return value


SELECTIONS: dict[str, Callable[[Config], Selection]] = {
    "tournament": lambda c: Tournament(_size("CONFIG_TOURNAMENT_SIZE", c.tournament_size, c.population_size)),
    "truncation": lambda c: Truncation(_size("CONFIG_TRUNCATION_TOP_K", c.truncation_top_k, c.population_size)),
    "llm": lambda c: Uniform(),
}


def make_selection(config: Config) -> Selection:
    if config.selection not in SELECTIONS:
        raise ConfigError(f"CONFIG_SELECTION={config.selection!r} is unknown; use one of {', '.join(SELECTIONS)}")
    return SELECTIONS[config.selection](config)


def make_fallback(config: Config) -> Selection | None:
    """CONFIG_SELECTION_FALLBACK's selection, for when the selector's reply is invalid twice."""
    if config.selection != "llm" or config.selection_fallback is None:
        return None
    return make_selection(replace(config, selection=config.selection_fallback))

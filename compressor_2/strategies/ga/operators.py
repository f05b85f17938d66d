"""The GA's own arithmetic and choices as small pure functions: the
round robin over mutation targets, the pairing of parents, its options and the selections
they name.

Selection draws from the global `random` module (DEAP's selectors do); the loop seeds it
and saves its state, so a resumed run draws what an uninterrupted one would have.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from deap import tools

T = TypeVar("T")


@dataclass(frozen=True)
class GaOptions:
    """The GA's options (CONFIG_POPULATION_SIZE, CONFIG_NGEN, ...)."""

    population_size: int
    ngen: int
    cxpb: float
    mutpb: float
    elitism_size: int
    selection: str
    selection_fallback: str | None  # with selection "llm"
    tournament_size: int | None  # with a selection that draws by tournament
    truncation_top_k: int | None  # with a selection that draws by truncation
    mutation_scope: str


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
    """LLM selection's parents: the members the selector chose, drawn uniformly with replacement."""

    def select(self, population: Sequence[T], k: int) -> list[T]:
        return tools.selRandom(population, k)


SELECTIONS: dict[str, Callable[[GaOptions], Selection]] = {
    "tournament": lambda o: Tournament(o.tournament_size or 0),
    "truncation": lambda o: Truncation(o.truncation_top_k or 0),
    "llm": lambda o: Uniform(),
}


def make_selection(options: GaOptions) -> Selection:
    """CONFIG_SELECTION's selection, with the sizes `ga_options` checked."""
    return SELECTIONS[options.selection](options)


def make_fallback(options: GaOptions) -> Selection | None:
    """CONFIG_SELECTION_FALLBACK's selection, for when the selector's reply is invalid twice."""
    if options.selection != "llm" or options.selection_fallback is None:
        return None
    return make_selection(replace(options, selection=options.selection_fallback))

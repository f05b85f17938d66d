"""The genetic algorithm's options (seed 000 §2), parsed and checked once: they have no
defaults, so a config that leaves one at its sentinel (-1 or "") is refused; a tournament
size or truncation top-k lies in [2, population], and is set only when a selection draws
by it."""

from __future__ import annotations

from dataclasses import dataclass

from compressor_2.config.kconfig import Reader, require

SELECTIONS = ("tournament", "truncation", "llm")
FALLBACK_SELECTIONS = ("tournament", "truncation")
MUTATION_SCOPES = ("cluster", "vector")
MAX_POPULATION = 100_000
MAX_STEPS = 1_000_000  # generations (Kconfig's ranges bound the other strategies' step counts)
SENTINELS = ("POPULATION_SIZE", "NGEN", "CXPB", "MUTPB", "ELITISM_SIZE", "SELECTION")


@dataclass(frozen=True)
class GaOptions:
    """Seed 000's options (CONFIG_POPULATION_SIZE, CONFIG_NGEN, ...)."""

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


def ga_options(r: Reader) -> GaOptions:
    population = r.integer("POPULATION_SIZE", 2, MAX_POPULATION)
    ngen = r.integer("NGEN", 1, MAX_STEPS)
    elitism = r.integer("ELITISM_SIZE")
    require(0 <= elitism < population,
            f"CONFIG_ELITISM_SIZE={elitism} must satisfy 0 <= elitism < population ({population})")
    cxpb, mutpb = r.number("CXPB", 0, 1), r.number("MUTPB", 0, 1)
    selection = r.string("SELECTION").strip()
    require(selection in SELECTIONS, f"CONFIG_SELECTION={selection!r} is unknown; use one of {', '.join(SELECTIONS)}")
    fallback = _fallback(r) if selection == "llm" else None
    drawn = {selection, fallback}
    sizes = {"TOURNAMENT_SIZE": "tournament", "TRUNCATION_TOP_K": "truncation"}
    used = {name: _selection_size(r, name, population) for name, kind in sizes.items() if kind in drawn}
    for name, kind in sizes.items():
        # A size no selection reads is a sign that the selection is not the one meant.
        require(name in used or r.integer(name) == -1,
                f"CONFIG_{name}={r.integer(name)} is set but no selection draws by {kind} "
                f"(CONFIG_SELECTION={selection!r}"
                f"{f', CONFIG_SELECTION_FALLBACK={fallback!r}' if fallback else ''}): set it to -1 (unset)")
    scope = r.string("MUTATION_SCOPE").strip()
    require(scope in MUTATION_SCOPES,
            f"CONFIG_MUTATION_SCOPE={scope!r} is unknown; use one of {', '.join(MUTATION_SCOPES)}")
    return GaOptions(population, ngen, cxpb, mutpb, elitism, selection, fallback, used.get("TOURNAMENT_SIZE"),
                     used.get("TRUNCATION_TOP_K"), scope)


def _fallback(r: Reader) -> str:
    fallback = r.string("SELECTION_FALLBACK").strip()
    require(fallback != "", 'CONFIG_SELECTION_FALLBACK is not set but CONFIG_SELECTION="llm" needs it '
            f"(one of {', '.join(FALLBACK_SELECTIONS)})")
    require(fallback in FALLBACK_SELECTIONS, f"CONFIG_SELECTION_FALLBACK={fallback!r} is unknown; use one of "
            f"{', '.join(FALLBACK_SELECTIONS)}")
    return fallback


def _selection_size(r: Reader, name: str, population: int) -> int:
    value = r.integer(name)
    require(value != -1, f"CONFIG_{name} is not set (still at its sentinel -1) but CONFIG_SELECTION "
            "(or CONFIG_SELECTION_FALLBACK) needs it")
    require(2 <= value <= population, f"CONFIG_{name}={value} must be in [2, population] = [2, {population}]")
    return value

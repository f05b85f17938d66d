"""The numeric baselines' options (CONFIG_RANDOM_*, CONFIG_CMAES_*), parsed and checked."""

from __future__ import annotations

from dataclasses import dataclass

from compressor_2.config.kconfig import MAX_LOGITS, Reader, require

DISTRIBUTIONS = ("normal", "uniform")
# CMA-ES divides by the step size and squares it: below this its covariance update loses
# every digit.
MIN_SIGMA = 1e-6


@dataclass(frozen=True)
class RandomOptions:
    """Random search's options (CONFIG_RANDOM_*)."""

    distribution: str
    scale: float
    batch_size: int
    batches: int


@dataclass(frozen=True)
class CmaesOptions:
    """CMA-ES's options (CONFIG_CMAES_*)."""

    sigma: float
    population: int  # 0: DEAP's default
    generations: int


def random_options(r: Reader) -> RandomOptions:
    distribution = r.string("RANDOM_DISTRIBUTION").strip()
    require(distribution in DISTRIBUTIONS, f"CONFIG_RANDOM_DISTRIBUTION={distribution!r} is unknown; use one of "
             f"{', '.join(DISTRIBUTIONS)}")
    scale = r.number("RANDOM_SCALE", 0, MAX_LOGITS, above=True)
    return RandomOptions(distribution, scale, r.integer("RANDOM_BATCH_SIZE"), r.integer("RANDOM_BATCHES"))


def cmaes_options(r: Reader) -> CmaesOptions:
    sigma = r.number("CMAES_SIGMA", MIN_SIGMA, MAX_LOGITS)
    population = r.integer("CMAES_POPULATION")
    require(population == 0 or population >= 2, f"CONFIG_CMAES_POPULATION={population} must be 0 (DEAP's "
             "default) or at least 2: CMA-ES updates from the better half")
    return CmaesOptions(sigma, population, r.integer("CMAES_GENERATIONS"))

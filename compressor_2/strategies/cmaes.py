"""`CONFIG_STRATEGY="cmaes"`: CMA-ES over the delta vector, with DEAP's `deap.cma.Strategy`.

The search distribution starts at the initial deltas with step size CONFIG_CMAES_SIGMA.
Each generation draws CONFIG_CMAES_POPULATION vectors (0: DEAP's 4 + 3 ln N), evaluates
them in one engine call and updates the mean, step size and covariance from the best
half; those vectors are the next generation's parents in the archive. The strategy's
arrays go into the state file after every generation, so a rerun resumes exactly.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np
from deap import cma

from compressor_2.clusters.roles import cluster_count
from compressor_2.config import MAX_LOGITS, Config, Reader, require
from compressor_2.deltas import clamp_rows, to_list
from compressor_2.resume import STEPS, FieldError, Option, RunFiles, compared, fields
from compressor_2.run import Cost, Run
from compressor_2.strategies import options_of
from compressor_2.strategies.individual import new_individual
from compressor_2.strategies.search import Search

FILES = RunFiles("cmaes_state.json")
# What `deap.cma.Strategy.update` changes; the rest follows from the dimension and lambda,
# and the eigendecomposition from C.
_ARRAYS = ("centroid", "pc", "ps", "C")
# The step size adapts, so a saved one may lie far outside CONFIG_CMAES_SIGMA's range; beyond
# these the squares and reciprocals of the draws overflow.
SIGMA_RANGE = (sys.float_info.min, 1e100)
# CMA-ES divides by the step size and squares it: below this its covariance update loses
# every digit.
MIN_SIGMA = 1e-6
IDENTITY = (*compared("CMAES_", "sigma", "population"), Option("CMAES_GENERATIONS", attrgetter("generations"), STEPS))


@dataclass(frozen=True)
class CmaesOptions:
    """CMA-ES's options (CONFIG_CMAES_*)."""

    sigma: float
    population: int  # 0: DEAP's default
    generations: int


def read_options(r: Reader) -> CmaesOptions:
    sigma = r.number("CMAES_SIGMA", MIN_SIGMA, MAX_LOGITS)
    population = r.integer("CMAES_POPULATION")
    require(population == 0 or population >= 2, f"CONFIG_CMAES_POPULATION={population} must be 0 (DEAP's "
             "default) or at least 2: CMA-ES updates from the better half")
    return CmaesOptions(sigma, population, r.integer("CMAES_GENERATIONS"))


def estimate(config: Config, n_examples: int) -> Cost:
    dimension = cluster_count(config) * config.delta_phases  # every cluster, per phase
    return Cost("generation", n_examples, population_size(options_of(config, "cmaes"), dimension) * n_examples, 0.0)


def make(run: Run) -> Search:
    options = options_of(run.config, "cmaes")
    centre = to_list(run.initial)
    strategy = cma.Strategy(centroid=centre, sigma=options.sigma, lambda_=population_size(options, len(centre)))
    # Its state names the step a generation, as it runs them; a file of an earlier compressor_2,
    # which called it an iteration, still resumes.
    return Search(run, CmaesSampler(strategy), "cmaes", options.generations, FILES, "generation",
                  "CONFIG_CMAES_GENERATIONS", step_key="generation", older_step_keys=("iteration",))


def population_size(options: CmaesOptions, dimension: int) -> int:
    return options.population or int(4 + 3 * np.log(dimension))


@dataclass
class CmaesSampler:
    strategy: cma.Strategy

    def ask(self) -> list[list[float]]:
        return clamp_rows(self.strategy.generate(new_individual))

    def tell(self, batch: Sequence[Sequence[float]], fitness: Sequence[float]) -> list[int]:
        population = [new_individual(genome) for genome in batch]
        for ind, value in zip(population, fitness):
            ind.fitness.values = (value,)
        ranked = sorted(range(len(population)), key=lambda i: -fitness[i])  # update sorts the same way
        self.strategy.update(population)
        return ranked[: self.strategy.mu]

    def state(self) -> dict[str, Any]:
        s = self.strategy
        return {**{name: np.asarray(getattr(s, name)).tolist() for name in _ARRAYS},
                "sigma": float(s.sigma), "update_count": s.update_count}

    def read(self, state: Mapping[str, Any]) -> dict[str, Any]:
        n = len(self.strategy.centroid)
        arrays = {name: _array(state, name, (n, n) if name == "C" else (n,)) for name in _ARRAYS}
        checked = {"sigma": fields.number(state, "sigma", "sampler.", *SIGMA_RANGE),
                   "update_count": fields.integer(state, "update_count", "sampler.")}
        _decomposition(arrays["C"])  # refuses a C that is no covariance
        return {**{name: array.tolist() for name, array in arrays.items()}, **checked}

    def restore(self, state: Mapping[str, Any]) -> None:
        s = self.strategy
        for name in _ARRAYS:
            setattr(s, name, np.asarray(state[name], dtype=float))
        s.sigma, s.update_count = state["sigma"], state["update_count"]
        s.cond, s.diagD, s.B = _decomposition(s.C)
        s.BD = s.B * s.diagD


def _decomposition(c: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(cond, diagD, B) exactly as `deap.cma.Strategy.update` computes them from C: restored
    from the file, B and BD would have another memory layout, and the products drawn from
    them would differ in the last bits from an uninterrupted run's."""
    if not np.allclose(c, c.T):
        raise FieldError("sampler.C is not symmetric, so not a covariance matrix")
    diag, basis = np.linalg.eigh(c)
    if diag.min() <= 0:
        raise FieldError("sampler.C is not positive definite, so not a covariance matrix")
    order = np.argsort(diag)
    return diag[order[-1]] / diag[order[0]], diag[order] ** 0.5, basis[:, order]


def _array(state: Mapping[str, Any], name: str, shape: tuple[int, ...]) -> np.ndarray:
    """`state[name]` as a float array of `shape`, every entry finite."""
    found = fields.value(state, name, "sampler.")
    try:
        array = np.asarray(found, dtype=float)
    except (TypeError, ValueError, OverflowError):
        array = None
    if array is None or array.shape != shape or not np.isfinite(array).all():
        raise FieldError(f"sampler.{name} is {fields.shown(found)}, not {' x '.join(map(str, shape))} finite numbers")
    return array


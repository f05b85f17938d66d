"""`CONFIG_STRATEGY="random"`: random search, the baseline every other strategy must beat.

Each step draws a batch of i.i.d. delta vectors around the initial deltas: every delta
is the initial one plus a normal (standard deviation CONFIG_RANDOM_SCALE) or uniform
(on +/- CONFIG_RANDOM_SCALE) draw. Nothing is learnt from the fitness; the loop, the
archive, the budgets and resume are those of `search.py` and the run's driver.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from compressor_2.config import MAX_LOGITS, Config, Reader, require
from compressor_2.deltas import clamp_rows, to_list
from compressor_2.resume import STEPS, Option, RunFiles, compared
from compressor_2.run import Cost, Run
from compressor_2.strategies import options_of
from compressor_2.strategies.search import Search

FILES = RunFiles("random_state.json")
DISTRIBUTIONS = ("normal", "uniform")
IDENTITY = (*compared("RANDOM_", "distribution", "scale", "batch_size"),
            Option("RANDOM_BATCHES", attrgetter("batches"), STEPS))


@dataclass(frozen=True)
class RandomOptions:
    """Random search's options (CONFIG_RANDOM_*)."""

    distribution: str
    scale: float
    batch_size: int
    batches: int


def read_options(r: Reader) -> RandomOptions:
    distribution = r.string("RANDOM_DISTRIBUTION").strip()
    require(distribution in DISTRIBUTIONS, f"CONFIG_RANDOM_DISTRIBUTION={distribution!r} is unknown; use one of "
             f"{', '.join(DISTRIBUTIONS)}")
    scale = r.number("RANDOM_SCALE", 0, MAX_LOGITS, above=True)
    return RandomOptions(distribution, scale, r.integer("RANDOM_BATCH_SIZE"), r.integer("RANDOM_BATCHES"))


def estimate(config: Config, n_examples: int) -> Cost:
    return Cost("batch", n_examples, options_of(config, "random").batch_size * n_examples, 0.0)


def make(run: Run) -> Search:
    options = options_of(run.config, "random")
    centre = to_list(run.initial)
    sampler = RandomSampler(centre, options.distribution, options.scale, options.batch_size)
    return Search(run, sampler, "random", options.batches, FILES, "batch", "CONFIG_RANDOM_BATCHES")


@dataclass
class RandomSampler:
    centre: list[float]
    distribution: str  # "normal" or "uniform"
    scale: float
    batch_size: int

    def ask(self) -> list[list[float]]:
        shape = (self.batch_size, len(self.centre))
        if self.distribution == "uniform":
            noise = np.random.uniform(-self.scale, self.scale, shape)
        else:
            noise = np.random.normal(0.0, self.scale, shape)
        return clamp_rows((np.asarray(self.centre) + noise).tolist())

    def tell(self, batch: Sequence[Sequence[float]], fitness: Sequence[float]) -> list[int]:
        return []  # every draw is independent of what came before

    def state(self) -> dict[str, Any]:
        return {}

    def read(self, state: Mapping[str, Any]) -> dict[str, Any]:
        del state
        return {}  # every draw is independent of what came before

    def restore(self, state: Mapping[str, Any]) -> None:
        del state


"""A new individual, as the GA and CMA-ES both draw them: DEAP's `creator.Individual`, a list
of deltas in canonical cluster order with three attributes: `scratchpad` (the lineage's
notes), `evaluation` (its training answers, or None while its fitness is invalid) and
`candidate_id` (its id in the run archive; None until the archive has it). They live on
the individual because deepcopy keeps instance attributes but drops extras stored on the
fitness object.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from deap import base, creator

if not hasattr(creator, "FitnessMax"):
    creator.create("FitnessMax", base.Fitness, weights=(1.0,))
if not hasattr(creator, "Individual"):
    creator.create("Individual", list, fitness=creator.FitnessMax)

Individual = Any  # creator.Individual: a list subclass made at runtime


def new_individual(deltas: Sequence[float], scratchpad: str = "", candidate_id: int | None = None) -> Individual:
    ind = creator.Individual(float(x) for x in deltas)
    ind.scratchpad = scratchpad
    ind.evaluation = None
    ind.candidate_id = candidate_id
    return ind

"""The GA's toolbox over DEAP individuals (`strategies/individual.py`, shared with CMA-ES).

An individual is a list of deltas in canonical cluster order with three attributes:
`scratchpad` (the lineage's notes), `evaluation` (its training answers, or None while
its fitness is invalid) and `candidate_id` (its id in the run archive; None until the
archive has it). They live on the individual because deepcopy keeps instance attributes
but drops extras stored on the fitness object.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future

from deap import base

from compressor_2.deltas import to_dict
from compressor_2.fitness import Evaluation, Evaluator
from compressor_2.reflector import MergeRequest, MutationRequest, MutationResult, Reflector, VectorRequest, VectorResult
from compressor_2.strategies.ga.operators import RRState, Selection, next_target
from compressor_2.strategies.individual import Individual, new_individual
from compressor_2.strategies.operators import append_summary, weighted_average


def initial_population(initial: Sequence[float], size: int) -> list[Individual]:
    """The initial deltas cloned `size` times, with empty scratchpads."""
    template = new_individual(initial)
    return [copy.deepcopy(template) for _ in range(size)]


def invalidate(ind: Individual) -> None:
    """Whenever a genome is created or changed, its fitness goes, and so does
    its archive id: the new genome becomes a candidate of its own once evaluated."""
    del ind.fitness.values
    ind.evaluation = None
    ind.candidate_id = None


def fitness(ind: Individual) -> float:
    return ind.fitness.values[0]


def evaluate(evaluator: Evaluator, individuals: Sequence[Individual],
             progress: Callable[[int], None] | None = None) -> list[Evaluation]:
    """All `individuals` in one `Evaluator.evaluate` call (one engine call); sets fitness."""
    evaluations = evaluator.evaluate([tuple(ind) for ind in individuals], progress)
    for ind, evaluation in zip(individuals, evaluations):
        ind.fitness.values = (evaluation.fitness,)
        ind.evaluation = evaluation
    return evaluations


def mate(a: Individual, b: Individual, *, reflector: Reflector, generation: int, child: int,
         parents: tuple[int, int]) -> Individual:
    """Crossover: ONE child, the fitness-weighted average of A and B, with the scratchpad
    the reflector merges from theirs."""
    offspring = copy.deepcopy(a)
    offspring[:] = weighted_average(a, b, fitness(a), fitness(b))
    merged = reflector.merge(MergeRequest(generation, child, parents, a.scratchpad, fitness(a),
                                          b.scratchpad, fitness(b), (a.candidate_id, b.candidate_id)))
    offspring.scratchpad = merged.scratchpad
    invalidate(offspring)
    return offspring


def make_mutate(rr_state: RRState, reflector: Reflector, cluster_ids: Sequence[str],
                pool: Executor) -> Callable[..., Future[MutationResult]]:
    """Mutation: the mutate closure over the driver's `rr_state`.

    Calling it draws the round-robin target at once, so calling it in offspring order
    fixes the targets in that order; the reflector call then runs in `pool` (up to
    CONFIG_REFLECTOR_CONCURRENCY at a time) and changes the individual in place.
    """
    ids = list(cluster_ids)

    def mutate(ind: Individual, *, generation: int, child: int) -> Future[MutationResult]:
        target = next_target(rr_state)
        request = MutationRequest(generation, child, target, to_dict(ind, ids), ind.scratchpad,
                                  fitness(ind), ind.evaluation.records, ind.candidate_id)
        return pool.submit(_apply_mutation, ind, ids.index(target), request, reflector)

    return mutate


def _apply_mutation(ind: Individual, k: int, request: MutationRequest,
                    reflector: Reflector) -> MutationResult:
    result = reflector.mutate(request)
    if result.delta is not None:
        ind[k] = result.delta
        ind.scratchpad = result.scratchpad
        invalidate(ind)
    return result


def make_vector_mutate(reflector: Reflector, cluster_ids: Sequence[str],
                       pool: Executor) -> Callable[..., Future[VectorResult]]:
    """Full-vector mutation inside the GA: the reflector proposes every delta at once; its summary
    is appended to the scratchpad. Runs in `pool` and changes the individual in place."""
    ids = list(cluster_ids)

    def mutate(ind: Individual, *, generation: int, child: int) -> Future[VectorResult]:
        request = VectorRequest(generation, child, to_dict(ind, ids), ind.scratchpad, fitness(ind),
                                ind.evaluation.records, ind.candidate_id)
        return pool.submit(_apply_vector, ind, request, reflector)

    return mutate


def _apply_vector(ind: Individual, request: VectorRequest, reflector: Reflector) -> VectorResult:
    result = reflector.mutate_vector(request)
    if result.deltas is not None:
        ind[:] = [result.deltas[cid] for cid in request.deltas]
        ind.scratchpad = append_summary(ind.scratchpad, result.summary)
        invalidate(ind)
    return result


def make_toolbox(evaluator: Evaluator, reflector: Reflector, selection: Selection, fallback: Selection | None,
                 rr_state: RRState, cluster_ids: Sequence[str], pool: Executor, scope: str) -> base.Toolbox:
    """Register mutate only after `rr_state.rr_idx` holds the resumed value, so that a
    resumed run's mutation targets continue the cycle where it stopped. `fallback`
    selects when the LLM selection's reply was invalid twice; `scope` is
    CONFIG_MUTATION_SCOPE."""
    toolbox = base.Toolbox()
    toolbox.register("clone", copy.deepcopy)
    toolbox.register("evaluate", evaluate, evaluator)
    toolbox.register("select", selection.select)
    if fallback is not None:
        toolbox.register("fallback", fallback.select)
    toolbox.register("mate", mate, reflector=reflector)
    toolbox.register("mutate", make_mutate(rr_state, reflector, cluster_ids, pool) if scope == "cluster"
                     else make_vector_mutate(reflector, cluster_ids, pool))
    return toolbox

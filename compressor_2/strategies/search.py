"""Numeric search without a reflector: the steps the "random" and "cmaes" strategies share.

A sampler proposes a batch of delta vectors; step t, top to bottom:
  1. ask the sampler for a batch;
  2. evaluate the whole batch in one engine call;
  3. archive every vector as a candidate (its parents: the vectors that shaped the
     sampler's batch), and keep the best ever;
  4. tell the sampler the batch's fitness.
The start evaluates the initial deltas (step -1), so the best ever starts at the
unsteered answers as every strategy's does. The state (the sampler's own and the parents
of its next batch; the run's driver adds the step, the global RNGs the samplers draw
from and the archive's newest candidate) is written after every step; a rerun resumes
it, replaying an interrupted step from the archive's answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from compressor_2.archive import SEED_STEP, Spot
from compressor_2.common import plural, say
from compressor_2.deltas import to_dict, to_list
from compressor_2.fitness import Evaluation
from compressor_2.resume import (
    GLOBAL_RNGS,
    RunFiles,
    StateFormat,
    StepEntry,
    candidate_ids,
    fields,
    held_list,
    seed_rng,
    state_json,
    step_entry,
)
from compressor_2.run import NewCandidate, Report, Run, Strategy

if TYPE_CHECKING:
    from compressor_2.archive import RunArchive


class Sampler(Protocol):
    """Proposes batches; draws only from the global `random` and numpy RNGs, which the
    state saves, so a resumed run proposes what an uninterrupted one would have."""

    def ask(self) -> list[list[float]]: ...

    def tell(self, batch: Sequence[Sequence[float]], fitness: Sequence[float]) -> list[int]:
        """Learns from the evaluated batch; returns the positions of the vectors that
        shape the next batch (its candidates' parents)."""
        ...

    def state(self) -> dict[str, Any]: ...

    def read(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """A saved `state()` checked field by field, as `restore` takes it: a field it cannot
        use raises FieldError naming it (`sampler.NAME`)."""
        ...

    def restore(self, state: Mapping[str, Any]) -> None:
        """Takes up what `state()` wrote or `read` checked."""
        ...


@dataclass
class SearchState:
    sampler: dict[str, Any]
    parents: list[int]  # the candidates that shaped the next batch


class Search(Strategy):
    """A sampler's steps; the run's driver runs the loop."""

    proposer, progress_plot = "the sampler", None

    def __init__(self, run: Run, sampler: Sampler, name: str, steps: int, files: RunFiles, step_name: str,
                 steps_symbol: str, step_key: str = "iteration", older_step_keys: tuple[str, ...] = ()) -> None:
        self.run, self.sampler, self.name = run, sampler, name
        self.steps, self.step_name, self.steps_symbol = steps, step_name, steps_symbol
        self.parents: tuple[int, ...] = ()
        self.state_format = StateFormat(files, step_key, ("random", "numpy"), self.read, state_json,
                                        check_parents, older_step_keys=older_step_keys)

    def rngs(self) -> Mapping[str, Any]:
        return GLOBAL_RNGS

    def read(self, raw: Mapping[str, Any]) -> SearchState:
        return SearchState(self.sampler.read(fields.typed(raw, "sampler", dict, "an object")),
                           candidate_ids(raw, "parents"))

    def start(self) -> None:
        [(_, seed)] = self.assess([to_list(self.run.initial)], SEED_STEP, "initial deltas")
        seed_rng(self.run.config.seed)
        say(f"{self.name}: {self.steps} {plural(self.step_name)} on {len(self.run.examples)} training examples, "
            f"seeded by the initial deltas (fitness {seed.fitness:.4f})")

    def restore(self, own: SearchState, t: int) -> None:
        del t
        self.sampler.restore(own.sampler)
        self.parents = tuple(own.parents)

    def own_state(self) -> SearchState:
        return SearchState(self.sampler.state(), list(self.parents))

    def step(self, t: int) -> Report:
        batch = self.sampler.ask()                                                          # 1.
        assessed = self.assess(batch, t, f"{self.step_name} {t}")                            # 2., 3.
        shaping = self.sampler.tell(batch, [e.fitness for _, e in assessed])                 # 4.
        self.parents = tuple(assessed[i][0] for i in shaping)
        entry = self.entry(t, [e for _, e in assessed])
        return Report([entry], f"{self.step_name} {t}: batch best {entry['best_fitness']:.4f}  best ever "
                               f"{self.run.best.fitness:.4f}  metric calls {entry['metric_calls']}  elapsed "
                               f"{entry['seconds']:.0f}s")

    def assess(self, batch: Sequence[Sequence[float]], step: int, label: str) -> list[tuple[int, Evaluation]]:
        """The batch evaluated in one engine call, archived and placed: (candidate id, evaluation)s."""
        evaluations = self.run.evaluate(batch, label)
        operator = "initial" if step == SEED_STEP else self.name
        added = self.run.admit(step, [NewCandidate(to_dict(genome, self.run.cluster_ids), "", operator, self.parents,
                                                   step, e, spot=Spot(step + 1, "cand", i))
                                      for i, (genome, e) in enumerate(zip(batch, evaluations))])
        return [(c.id or 0, e) for c, e in zip(added, evaluations)]

    def entry(self, t: int, assessed: Sequence[Evaluation]) -> StepEntry:
        return {**step_entry(t, assessed, self.run.best.fitness), "metric_calls": self.run.archive.metric_calls(),
                "seconds": round(self.run.budget.seconds(), 3)}


def check_parents(own: SearchState, archive: RunArchive, last: int) -> None:
    held_list(own.parents, "parents", archive, last, assessed=True)

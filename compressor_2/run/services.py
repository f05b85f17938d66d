"""What every strategy is handed: `Run`, the run's shared services (the archive, the
evaluator whose answers it caches, the reflector, the pool of reflector calls and the
run's other thread pools, the budget, the best-ever tracker), and the three calls through
which a strategy's steps touch the run: `evaluate` (through the budget's gate while a step
runs), `admit` (what a step made becomes candidates of the archive, placed, and offered to
the best-ever, in one call) and `assess` (a candidate's fitness once it is known)."""

from __future__ import annotations

import functools
import shlex
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from compressor_2.archive import Candidate, Placement, RunArchive, Spot
from compressor_2.clusters.tokens import AnswerTokens
from compressor_2.config import Config
from compressor_2.data import Example
from compressor_2.deltas import Deltas
from compressor_2.fitness import Evaluation, Evaluator, evaluate_with_bar
from compressor_2.outputs import refresh_outputs
from compressor_2.reflector import Reflector
from compressor_2.resume import Member
from compressor_2.run.best import BestEver
from compressor_2.run.budget import Budget
from compressor_2.run.workers import Workers


@dataclass(frozen=True)
class NewCandidate:
    """A genome a step made, to become a candidate: its fitness is its evaluation's (GEPA
    passes its aggregate valset score there), and it is offered to the best-ever when it is
    kept with one. `generation` is the step column the candidate is recorded in."""

    deltas: Mapping[str, float]  # canonical order of the genome's ids (`Run.cluster_ids`)
    scratchpad: str
    operator: str
    parents: tuple[int, ...]
    generation: int
    evaluation: Evaluation | None = None
    status: str = "evaluated"  # or "rejected"
    note: str = ""  # why it was rejected
    spot: Spot | None = None  # where it stands in the tree


@dataclass
class Run:
    """What every strategy is given."""

    config: Config
    # The genome's ids, canonical order: the cluster ids; with CONFIG_DELTA_PHASES > 1 one
    # "phase:cluster" id per pair, phase-major (compressor_2/deltas.py).
    cluster_ids: list[str]
    examples: tuple[Example, ...]  # the training pool
    archive: RunArchive
    evaluator: Evaluator
    reflector: Reflector
    pool: Executor  # reflector calls in flight at once: CONFIG_REFLECTOR_CONCURRENCY
    budget: Budget
    best: BestEver
    workers: Workers  # every thread pool of the run (`pool` is one of them)
    answer_tokens: AnswerTokens  # answers retokenised through the cluster map, shared with the local reflector
    initial: Deltas  # CONFIG_INITIAL_DELTAS_PATH, as preflight read it: where every strategy starts
    heldout: tuple[Example, ...] = ()  # CONFIG_HOLDOUT_*: checked when the run stops, never searched on

    @property
    def out(self) -> Path:
        return self.config.output_dir

    def evaluate(self, genomes: Sequence[Sequence[float]], label: str,
                 examples: Sequence[Example] | None = None) -> list[Evaluation]:
        """All `genomes` on `examples` (default: the pool) in one engine call, with a bar."""
        if not genomes:
            return []
        return evaluate_with_bar(self.evaluator, genomes, self.examples if examples is None else examples, label)

    def refresh_outputs(self) -> Path:
        """front.png and report.html, drawn from the archive as it stands (every way out of a
        run draws them); returns the report's path."""
        return refresh_outputs(self.archive, self.out, self.examples, self.heldout)

    @functools.cached_property
    def gold_tokens(self) -> dict[str, int]:
        """Tokens of each training example's gold answer (what an answer's `tokens` counts)."""
        return {ex.id: self.answer_tokens.length(ex.gold) for ex in self.examples}

    def admit(self, step: int, made: Sequence[NewCandidate] = (),
              placements: Sequence[Placement] = ()) -> list[Candidate]:
        """`made` as candidates of the archive (ids consecutive, in order), placed at
        their spots, with `placements` of earlier candidates, decided in strategy step
        `step`; then the kept ones with an evaluation are offered to the best-ever."""
        candidates = [Candidate(p.deltas, p.scratchpad, p.operator, p.parents, self.config.strategy, p.generation,
                                p.status, p.note, *_scores(p.evaluation)) for p in made]
        added = self.archive.admit(candidates, [p.spot for p in made], placements, step)
        self.best.consider([(Member(dict(c.deltas), c.scratchpad, c.id or 0), p.evaluation)
                            for c, p in zip(added, made)
                            if p.evaluation is not None and p.status == "evaluated"])
        return added

    def assess(self, assessed: Sequence[tuple[Member, Evaluation]]) -> None:
        """Records the fitness on the pool of candidates made before it was known, and
        offers them to the best-ever."""
        for member, e in assessed:
            self.archive.assess(member.candidate_id, e.fitness, e.mean_tokens, e.correctness)
        self.best.consider(assessed)


def _scores(evaluation: Evaluation | None) -> tuple[float | None, float | None, float | None]:
    """(fitness, mean tokens, correctness), as the archive records them."""
    if evaluation is None:
        return None, None, None
    return evaluation.fitness, evaluation.mean_tokens, evaluation.correctness


def resume_command() -> str:
    """The command line this process was started with, as the user would retype it."""
    args = sys.argv[1:]
    if Path(sys.argv[0]).name == "__main__.py":
        return shlex.join(["python", "-m", "compressor_2", *args])
    return shlex.join([Path(sys.argv[0]).name, *args])

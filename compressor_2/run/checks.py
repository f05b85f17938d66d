"""What the run gained: the candidates' points and the unsteered baseline on the training
pool, read from the archive, and the checks that measure outside the search.

- The baseline is the all-zero genome. When the search assessed it (the initial deltas
  are all zero, as build-clusters writes them), its candidate is the baseline; else
  `Checks.measure_baseline` evaluates it on the pool before the search starts.
- The held-out check (CONFIG_HOLDOUT_DATA, CONFIG_HOLDOUT_INDICES) runs when the search
  has stopped: the best candidate, the front's candidates and the baseline on the
  held-out questions.

Checks answer through their own evaluator, whose store is the archive's `CheckStore`:
answers the search already made are served from its cache, fresh ones go to
`check_answers` (cached there for the next check), so no check adds to the search's
metric calls, changes what its cache serves, or draws from its RNGs. Their results
go to `check_results`, by split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from compressor_2.archive.database import Candidate, CheckResult, RunArchive, genome_key
from compressor_2.data.example import Example
from compressor_2.fitness import Evaluation, Evaluator
from compressor_2.run.front import Point, pareto_front
from compressor_2.run.progress import answers_bar

TRAINING, HELDOUT = "training", "heldout"
BASELINE_ID = 0  # the baseline's Point id when no candidate is the all-zero genome
_ASSESSED = "mean_tokens IS NOT NULL AND correctness IS NOT NULL AND fitness IS NOT NULL"


def candidate_points(archive: RunArchive) -> list[Point]:
    """Every candidate assessed by the search, as a point."""
    return [_point(c) for c in archive.candidates(_ASSESSED)]


def _point(c: Candidate) -> Point:
    assert c.id is not None and c.mean_tokens is not None and c.correctness is not None and c.fitness is not None
    return Point(c.id, c.mean_tokens, c.correctness, c.fitness)


def zero_genome(archive: RunArchive) -> str | None:
    """The all-zero genome's key, or None while the archive holds no candidate to size it."""
    last = archive.candidate(archive.last_candidate_id())
    return None if last is None else genome_key([0.0] * len(last.deltas))


def training_baseline(archive: RunArchive) -> Point | None:
    """The unsteered baseline on the training pool: the search's all-zero candidate (the
    earliest), else what `measure_baseline` measured, else None."""
    for c in archive.candidates(_ASSESSED):
        if not any(c.deltas.values()):
            return _point(c)
    zeros = zero_genome(archive)
    measured = archive.checks(TRAINING).get(zeros or "")
    if measured is None:
        return None
    return Point(BASELINE_ID, measured.mean_tokens, measured.correctness, measured.fitness)


def best_point(archive: RunArchive) -> Point | None:
    """The fittest candidate (what deltas_best.json holds)."""
    best = archive.best()
    return None if best is None or best.mean_tokens is None or best.correctness is None else _point(best)


@dataclass(frozen=True)
class Gain:
    """The best and the baseline, on the training pool and held out."""

    best: Point
    baseline: Point
    best_heldout: CheckResult
    baseline_heldout: CheckResult


def gain(archive: RunArchive) -> Gain | None:
    """What the last held-out check measured for the best and the baseline, or None."""
    best, baseline, zeros = best_point(archive), training_baseline(archive), zero_genome(archive)
    heldout = archive.checks(HELDOUT)
    if best is None or baseline is None or zeros not in heldout:
        return None
    best_candidate = archive.candidate(best.id)
    assert best_candidate is not None
    best_held = heldout.get(genome_key(list(best_candidate.deltas.values())))
    return None if best_held is None else Gain(best, baseline, best_held, heldout[zeros or ""])


def heldout_line(g: Gain) -> str:
    """The one line `make run` ends with."""
    saved = 1 - g.best_heldout.mean_tokens / g.baseline_heldout.mean_tokens if g.baseline_heldout.mean_tokens else 0
    drop = 100 * (g.best_heldout.correctness - g.baseline_heldout.correctness)
    return (f"held-out ({g.best_heldout.examples} questions): best #{g.best.id} "
            f"{g.best_heldout.mean_tokens:.1f} tokens ({-100 * saved:+.0f}%), "
            f"{100 * g.best_heldout.correctness:.1f}% correct ({drop:+.1f} points) against the baseline's "
            f"{g.baseline_heldout.mean_tokens:.1f} tokens, {100 * g.baseline_heldout.correctness:.1f}% correct; "
            f"gap from training: {g.best_heldout.mean_tokens - g.best.tokens:+.1f} tokens, "
            f"{100 * (g.best_heldout.correctness - g.best.correctness):+.1f} points")


class Checks:
    """Measures genomes outside the search, with `evaluator` (whose store must be the
    archive's `CheckStore`)."""

    def __init__(self, evaluator: Evaluator, archive: RunArchive, pool: Sequence[Example],
                 heldout: Sequence[Example], n_clusters: int) -> None:
        self.evaluator = evaluator
        self.archive = archive
        self.pool = tuple(pool)
        self.heldout = tuple(heldout)
        self.zeros = [0.0] * n_clusters

    def measure_baseline(self) -> None:
        """The all-zero genome on the pool, unless the baseline is known already."""
        if training_baseline(self.archive) is not None:
            return
        [evaluation] = self._evaluate([self.zeros], self.pool, "unsteered baseline")
        self.archive.record_checks(TRAINING, [_result(TRAINING, evaluation)])

    def heldout_check(self) -> int:
        """The baseline, the best and the front's candidates on the held-out questions;
        returns how many genomes were checked (0 without a held-out set or candidates)."""
        if not self.heldout or self.archive.best() is None:
            return 0
        self.measure_baseline()
        front = pareto_front(candidate_points(self.archive))
        best = self.archive.best()
        assert best is not None and best.id is not None
        chosen = [best.id, *(p.id for p in front if p.id != best.id)]
        genomes = {genome_key(self.zeros): self.zeros}
        for cid in chosen:
            candidate = self.archive.candidate(cid)
            assert candidate is not None
            values = list(candidate.deltas.values())
            genomes.setdefault(genome_key(values), values)
        evaluations = self._evaluate(list(genomes.values()), self.heldout,
                                     f"held-out check ({len(genomes)} genomes)")
        self.archive.record_checks(HELDOUT, [_result(HELDOUT, e) for e in evaluations])
        return len(genomes)

    def _evaluate(self, genomes: Sequence[Sequence[float]], examples: Sequence[Example],
                  label: str) -> list[Evaluation]:
        with answers_bar(len(genomes) * len(examples), label) as bar:
            return self.evaluator.evaluate(genomes, bar.update, examples)


def _result(split: str, evaluation: Evaluation) -> CheckResult:
    return CheckResult(split, genome_key(evaluation.deltas), len(evaluation.records), evaluation.mean_tokens,
                       evaluation.correctness, evaluation.fitness)

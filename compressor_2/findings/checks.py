"""What the run gained: the candidates' points and the unsteered baseline on the training
pool, read from the archive, and the checks that measure outside the search.

- The baseline is the all-zero genome. When the search assessed it (the initial deltas
  are all zero, as build-clusters writes them), its candidate is the baseline; else
  `Checks.measure_baseline` evaluates it on the pool before the search starts.
- The held-out check (CONFIG_HOLDOUT_DATA, CONFIG_HOLDOUT_INDICES) runs when the search
  has stopped: the best candidate, the front's candidates and the baseline on the
  held-out questions.
- The simpler tools (CONFIG_COMPARE_SIMPLE, findings/simpler.py) are measured around it: the
  EOS-only search before (its best is checked held out with the others), the token cap and
  the instruction after.

Checks answer through their own evaluator, whose store is the archive's `CheckStore`:
answers the search already made are served from its cache, fresh ones go to
`check_answers` (cached there for the next check), so no check adds to the search's
metric calls, changes what its cache serves, or draws from its RNGs. Their results
go to `check_results`, by split. Every claim made of them is paired against the baseline
on the same questions (findings/claims.py).

The answers the outputs read (`measured`: the baseline's, the best's and the front's on
the pool, the held-out check's, the simpler tools') are ones the archive records as made.
When they are gone (rows of its answer tables deleted), `evolve` makes them again before
its first step (`Checks.restore_lost`), as a cache does; `show`, `export` and `report`,
which have no engine, refuse in one line naming run.sqlite (`refuse_lost`) before they
write anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from compressor_2.archive import Candidate, CheckResult, RunArchive, genome_key
from compressor_2.common import ConfigError, say
from compressor_2.data import Example
from compressor_2.fitness import Evaluation, Evaluator, evaluate_with_bar
from compressor_2.findings.arms import arms_lines
from compressor_2.findings.claims import HELDOUT, TRAINING, Arm, Claims
from compressor_2.findings.confidence import Paired, correctness_claim, tokens_claim
from compressor_2.findings.front import Point, pareto_front
from compressor_2.findings.simpler import (
    TOOLS_META, Measuring, Simpler, Tools, ToolsRecord, read_tools_record, simpler_line, tools,
)
from compressor_2.findings.stop_oracle import Oracle, oracle_lines

BASELINE_ID = 0  # the baseline's Point id when no candidate is the all-zero genome


def _point(c: Candidate) -> Point:
    assert c.id is not None and c.mean_tokens is not None and c.correctness is not None and c.fitness is not None
    return Point(c.id, c.mean_tokens, c.correctness, c.fitness)


def _assessed(c: Candidate) -> bool:
    return c.mean_tokens is not None and c.correctness is not None and c.fitness is not None


@dataclass(frozen=True)
class Gain:
    """The best and the baseline, on the training pool and held out."""

    best: Point
    baseline: Point
    best_heldout: CheckResult
    baseline_heldout: CheckResult


@dataclass(frozen=True)
class Standing:
    """The run as one read of the archive sees it: what front.png, report.html, `show
    --front` and `export` draw on. `evolve` redraws after every step, so the candidates
    table is read once here rather than once per figure."""

    candidates: dict[int, Candidate]  # every candidate, by id
    points: list[Point]  # the candidates the search assessed, in id order
    best: Point | None  # the fittest candidate (what deltas_best.json holds)
    zeros: str | None  # the all-zero genome's key; None while no candidate sizes it
    baseline: Point | None  # the unsteered baseline on the training pool
    heldout: dict[str, CheckResult]  # the last held-out check, by genome key

    def genome(self, candidate_id: int) -> str:
        return genome_key(list(self.candidates[candidate_id].deltas.values()))

    def front(self) -> list[tuple[Point, CheckResult | None]]:
        """The training front, shortest first, each with its held-out result if checked."""
        return [(p, self.heldout.get(self.genome(p.id))) for p in pareto_front(self.points)]

    @property
    def gain(self) -> Gain | None:
        """What the last held-out check measured for the best and the baseline, or None."""
        if self.best is None or self.baseline is None or self.zeros not in self.heldout:
            return None
        best_held = self.heldout.get(self.genome(self.best.id))
        return None if best_held is None else Gain(self.best, self.baseline, best_held, self.heldout[self.zeros or ""])


def standing(archive: RunArchive) -> Standing:
    """The baseline is the search's all-zero candidate (the earliest), else what
    `measure_baseline` measured, else None."""
    candidates = {c.id: c for c in archive.candidates() if c.id is not None}
    points = [_point(c) for c in candidates.values() if _assessed(c)]
    best = archive.best()
    zeros = genome_key([0.0] * len(next(iter(candidates.values())).deltas)) if candidates else None
    baseline = next((p for p in points if not any(candidates[p.id].deltas.values())), None)
    if baseline is None and (measured := archive.checks(TRAINING).get(zeros or "")) is not None:
        baseline = Point(BASELINE_ID, measured.mean_tokens, measured.correctness, measured.fitness)
    return Standing(candidates, points, _point(best) if best is not None and _assessed(best) else None, zeros,
                    baseline, archive.checks(HELDOUT))


def training_baseline(archive: RunArchive) -> Point | None:
    """The unsteered baseline on the training pool (see `standing`)."""
    return standing(archive).baseline


@dataclass(frozen=True)
class Measured:
    """Answers the archive records as made, and an output reads: `arm`'s on `split`."""

    arm: Arm
    split: str
    name: str  # as a message names the arm
    tool: bool = False  # one of the simpler tools' (their record vouches for it)


def measured(now: Standing, record: ToolsRecord | None) -> list[Measured]:
    """What the outputs read of the answers, where the archive records them as made: the
    baseline (a candidate of the search or measured apart), the best and the front's
    candidates on the training pool (each assessed there: GEPA's on its valset, the others'
    on the whole pool); every genome of the last held-out check on its questions; the
    simpler tools on the pool, once measured."""
    if now.zeros is None:
        return []
    named: dict[str, str] = {}
    if now.baseline is not None:
        named[now.zeros] = "the unsteered baseline"
    for cid in ([now.best.id] if now.best is not None else []) + [p.id for p, _ in now.front()]:
        named.setdefault(now.genome(cid), f"candidate #{cid}")
    found = [Measured(Arm(genome), TRAINING, name) for genome, name in named.items()]
    if record is not None:
        found += [Measured(tool.arm, TRAINING, tool.name, tool=True) for tool in tools(record, now.zeros)]
        best = now.genome(now.best.id) if now.best is not None else None
        if record.instruction and best in now.heldout:
            # Measured with the held-out check that holds this best: on the instruction's other side too.
            side = Arm(best, without=record.instruction) if record.in_search else \
                Arm(best, instruction=record.instruction)
            found.append(Measured(side, HELDOUT, "the best on the instruction's other side", tool=True))
        named.setdefault(record.eos_genome, "the EOS-only best")
    return found + [Measured(Arm(genome), HELDOUT, named.get(genome, "a genome of the held-out check"))
                    for genome in now.heldout]


def lost_answers(claims: Claims, now: Standing) -> list[Measured]:
    """The answers the outputs read that the archive lost (rows of its answer tables deleted)."""
    return [m for m in measured(now, read_tools_record(claims.archive)) if claims.lost(m.arm, m.split)]


def refuse_lost(claims: Claims, read: Sequence[Measured]) -> None:
    """Refuses, in one line naming run.sqlite, to read answers the archive lost among those
    a reader reads (`read`, e.g. `measured`'s): a reader without an engine cannot make
    them again, and a claim on the answers left would be another claim."""
    found = {(m.arm, m.split): m for m in read if claims.lost(m.arm, m.split)}
    if not found:
        return
    first = next(iter(found.values()))
    where = "the training pool" if first.split == TRAINING else "the held-out questions"
    why = "" if first.split == TRAINING else " (or the held-out questions changed since the last check)"
    raise ConfigError(f"'{claims.archive.path}' lost answers its records rest on ({first.name}'s on {where}"
                      f"{f', and {len(found) - 1} more' if len(found) > 1 else ''}): rows of its answer tables were "
                      f"deleted{why}; rerun evolve with this config, which answers them again")


def refuse_emptied_heldout(archive: RunArchive, now: Standing) -> None:
    """Refuses, in one line naming run.sqlite, a run whose held-out results were deleted
    after the held-out check recorded them: read without them, the run would look as if no
    check had run."""
    recorded = archive.checks_recorded(HELDOUT)
    if len(now.heldout) >= recorded:
        return
    raise ConfigError(f"'{archive.path}' lost the held-out check's results (its table check_results holds "
                      f"{len(now.heldout)} of the {recorded} held-out rows the check recorded): rows were deleted; "
                      "rerun evolve with this config, which checks again from the answers it holds")


def heldout_line(g: Gain, claim: Paired, instructed: bool = False) -> str:
    """The held-out check's line: the best against the baseline on the held-out questions
    (`instructed`: the run's prompts carry the instruction, so its baseline is the instruction alone)."""
    baseline = "the baseline's (the instruction alone)" if instructed else "the baseline's"
    return (f"held-out ({g.best_heldout.examples} questions): best #{g.best.id} {tokens_claim(claim)}, "
            f"{correctness_claim(claim)} against {baseline} "
            f"{g.baseline_heldout.mean_tokens:.1f} tokens, {100 * g.baseline_heldout.correctness:.1f}% correct; "
            f"gap from training: {g.best_heldout.mean_tokens - g.best.tokens:+.1f} tokens, "
            f"{100 * (g.best_heldout.correctness - g.best.correctness):+.1f} points")


class Checks(Measuring):
    """The baseline, the held-out check and the answers lost; `simpler`: the simpler
    tools to measure after the search; `oracle`: what the stop oracle of the held-out
    answers needs (findings/stop_oracle.py)."""

    def __init__(self, evaluator: Evaluator, archive: RunArchive, pool: Sequence[Example],
                 heldout: Sequence[Example], n_clusters: int, simpler: Simpler | None = None,
                 oracle: Oracle | None = None) -> None:
        super().__init__(evaluator, archive, pool, heldout, n_clusters)
        self.simpler = simpler
        self.oracle = oracle

    def restore_lost(self) -> None:
        """The answers the outputs read that the archive lost (`lost_answers`), made again
        as a cache does, into the checks' table; when the simpler tools' are among them,
        their record is dropped instead, and the checks after the search measure them again."""
        found = lost_answers(Claims(self.archive, self.pool, self.heldout), standing(self.archive))
        if any(m.tool for m in found):
            self.archive.delete_meta(TOOLS_META)
        for split, examples in ((TRAINING, self.pool), (HELDOUT, self.heldout)):
            genomes = list(dict.fromkeys(m.arm.genome for m in found if m.split == split and not m.tool))
            if genomes:
                say(f"'{self.archive.path}' lost the answers of {len(genomes)} genome(s) its outputs read on the "
                    f"{split} questions: answering them again")
                evaluate_with_bar(self.evaluator, [[float(x) for x in g.split(",")] for g in genomes], examples,
                                  f"answers lost, {split}")

    def measure_baseline(self) -> None:
        """The all-zero genome on the pool, unless the baseline is known already."""
        if training_baseline(self.archive) is not None:
            return
        [evaluation] = evaluate_with_bar(self.evaluator, [self.zeros], self.pool, "unsteered baseline")
        self.archive.record_checks(TRAINING, [_result(TRAINING, evaluation)])

    def baseline_correctness(self) -> float:
        """The unsteered baseline's correctness on the pool, measured first where unknown
        (before the search has made a candidate, `standing` cannot see it yet)."""
        self.measure_baseline()
        known = training_baseline(self.archive)
        return known.correctness if known is not None else \
            self.archive.checks(TRAINING)[genome_key(self.zeros)].correctness

    def after_search(self) -> int:
        """Everything measured once the search has stopped: the EOS-only search, the held-out
        check (with the EOS-only best), the token cap and the instruction; returns how many
        genomes the held-out check checked."""
        best = self.archive.best()
        if self.simpler is None or best is None or best.mean_tokens is None:
            return self.heldout_check()
        self.measure_baseline()
        tools = Tools(self, self.simpler)
        checked = self.heldout_check([tools.search_eos()])
        tools.finish(best.mean_tokens, list(best.deltas.values()))
        return checked

    def heldout_check(self, extra: Sequence[Sequence[float]] = ()) -> int:
        """The baseline, the best, the front's candidates and `extra` on the held-out
        questions; returns how many genomes were checked (0 without a held-out set or
        candidates)."""
        best = self.archive.best()
        if not self.heldout or best is None:
            return 0
        assert best.id is not None
        self.measure_baseline()
        now = standing(self.archive)
        chosen = [best.id, *(p.id for p, _ in now.front() if p.id != best.id)]
        genomes = {genome_key(self.zeros): self.zeros}
        for values in [list(now.candidates[cid].deltas.values()) for cid in chosen] + [list(e) for e in extra]:
            genomes.setdefault(genome_key(values), values)
        evaluations = evaluate_with_bar(self.evaluator, list(genomes.values()), self.heldout,
                                     f"held-out check ({len(genomes)} genomes)")
        self.archive.record_checks(HELDOUT, [_result(HELDOUT, e) for e in evaluations])
        return len(genomes)

    def closing_lines(self, checked: int) -> list[str]:
        """What the run ends with: the held-out check's accounting and its line (when it
        checked `checked` genomes) and the stop oracle's of its baseline and best, then, when
        the simpler tools were measured, the six arms' lines (with an instruction) and the
        simpler tools' line."""
        now = standing(self.archive)
        if now.best is None or now.zeros is None:
            return []
        claims = Claims(self.archive, self.pool, self.heldout)
        best = now.genome(now.best.id)
        lines = []
        if checked:
            lines.append(checks_line(self.archive, checked, len(self.heldout), self.simpler is not None))
            g, claim = now.gain, claims.paired(Arm(now.zeros), Arm(best), HELDOUT)
            if g is not None and claim is not None:
                lines.append(heldout_line(g, claim, self.simpler is not None and self.simpler.in_search))
            if self.oracle is not None:
                lines += oracle_lines(claims, self.oracle, now.zeros, best)
        record = read_tools_record(self.archive) if self.simpler is not None else None
        if record is None:
            return lines
        line = simpler_line(claims, record, now.zeros, best)
        return lines + arms_lines(claims, record, now.zeros, best) + ([line] if line else [])


def checks_line(archive: RunArchive, genomes: int, questions: int, simpler: bool) -> str:
    fresh, cached = archive.check_calls()
    which = "the baseline, the best, the front's and the EOS-only best" if simpler else \
        "the baseline, the best and the front's"
    return (f"held-out check: {genomes} genomes ({which}) on {questions} questions; the checks have made {fresh} "
            f"answers in all and served {cached} from the cache, counted apart from the search's "
            f"{archive.metric_calls()} metric calls")


def _result(split: str, evaluation: Evaluation) -> CheckResult:
    return CheckResult(split, genome_key(evaluation.deltas), len(evaluation.records), evaluation.mean_tokens,
                       evaluation.correctness, evaluation.fitness)

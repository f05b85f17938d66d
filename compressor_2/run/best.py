"""The best-ever individual: updated whenever a newly evaluated individual ranks strictly
higher, with deltas_best.json and processor_best.py rewritten each time; a genome with a
delta that is not a finite number is never taken. By default the rank is the fitness. With
a correctness floor (CONFIG_BEST_RULE="shortest": the unsteered baseline's correctness on the
pool) every candidate at least that correct ranks above every other, the shortest first, the
fitter on equal tokens: on a pool of 32 questions one question weighs as much as three
tokens an answer, and the fittest candidate bought training questions with length that did
not hold out (docs/real-model.md), where tokens saved did. A resume restores it from what
the run recorded (the state file or the archive) and writes both files again: they are
outputs, never read back, so a truncated or hand-edited deltas_best.json does not survive
a resume."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

from compressor_2.archive import Rank, rank
from compressor_2.common import atomic_write_json, say
from compressor_2.deltas import deltas_document, sidecar_path, write_sidecar
from compressor_2.fitness import Evaluation
from compressor_2.resume import Member

DELTAS_BEST = "deltas_best.json"
PROCESSOR_BEST = "processor_best.py"

WriteProcessor = Callable[[Path, Path], object]  # (deltas JSON, processor module); what it returns is unused


class BestEver:
    def __init__(self, output_dir: Path, write_processor: WriteProcessor, map_digest: str = "") -> None:
        self.output_dir = output_dir
        self.map_digest = map_digest
        self.write_processor = write_processor
        self.member: Member | None = None
        self.fitness: float | None = None
        self.rank: Rank | None = None
        self.floor: float | None = None  # set by the run before any candidate is offered

    def consider(self, assessed: Sequence[tuple[Member, Evaluation]]) -> bool:
        """Takes the highest ranked of `assessed` (the earliest on a tie), each evaluated on
        the whole pool, if it ranks above the best so far, and then writes the files once.
        Returns whether the best changed."""
        improved: Evaluation | None = None
        for member, evaluation in assessed:
            if not all(math.isfinite(v) for v in member.deltas.values()):
                # JSON would hold Infinity, which every reader (and every rerun) refuses.
                say(f"warning: candidate {member.candidate_id} has a delta that is not a finite number; it is "
                    f"never written to {DELTAS_BEST}")
                continue
            ranked = rank(evaluation.fitness, evaluation.mean_tokens, evaluation.correctness, self.floor)
            if self.rank is None or ranked > self.rank:
                self.member, self.fitness, self.rank, improved = member, evaluation.fitness, ranked, evaluation
        if improved is not None:
            self._write()
            say(f"new best fitness {self.fitness:.4f} (candidate {self.member.candidate_id}, "  # type: ignore[union-attr]
                f"{improved.mean_tokens:.1f} tokens, {100 * improved.correctness:.0f}% correct): "
                f"{self.output_dir / DELTAS_BEST}, {PROCESSOR_BEST} updated")
        return improved is not None

    def restore(self, member: Member | None, fitness: float | None, tokens: float | None = None,
                correctness: float | None = None) -> None:
        """The best-ever a resume found recorded (its tokens and correctness on the pool
        rank it under a floor); `rewrite` writes its files once the resume has taken
        everything else up."""
        self.member, self.fitness = member, fitness
        self.rank = None if fitness is None else rank(fitness, tokens, correctness, self.floor)

    def rewrite(self) -> None:
        """The best's files written again (they are never read back), or removed when
        nothing was evaluated yet: no run of this directory made them."""
        if self.member is not None:
            self._write()
            return
        for name in (DELTAS_BEST, PROCESSOR_BEST):
            (self.output_dir / name).unlink(missing_ok=True)
        sidecar_path(self.output_dir / DELTAS_BEST).unlink(missing_ok=True)

    def _write(self) -> None:
        assert self.member is not None
        deltas_path = self.output_dir / DELTAS_BEST
        atomic_write_json(deltas_path, deltas_document(self.member.deltas))
        if self.map_digest:
            write_sidecar(deltas_path, self.map_digest)
        self.write_processor(deltas_path, self.output_dir / PROCESSOR_BEST)

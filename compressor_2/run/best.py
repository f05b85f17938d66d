"""The best-ever individual (seed 000 §1): updated whenever a newly evaluated individual is
strictly fitter, with deltas_best.json and processor_best.py rewritten each time; a genome
with a delta that is not a finite number is never taken."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

from compressor_2.atomic import atomic_write_json
from compressor_2.deltas import write_fingerprint
from compressor_2.fitness import Evaluation
from compressor_2.run.progress import say
from compressor_2.run.state import Member

DELTAS_BEST = "deltas_best.json"
PROCESSOR_BEST = "processor_best.py"

WriteProcessor = Callable[[Path, Path], None]  # (deltas JSON, processor module) -> None


class BestEver:
    def __init__(self, output_dir: Path, cluster_ids: Sequence[str], write_processor: WriteProcessor,
                 member: Member | None = None, fitness: float | None = None, cluster_fingerprint: str = "") -> None:
        self.output_dir = output_dir
        self.cluster_fingerprint = cluster_fingerprint
        self.cluster_ids = list(cluster_ids)
        self.write_processor = write_processor
        self.member = member
        self.fitness = fitness

    def consider(self, assessed: Sequence[tuple[Member, Evaluation]]) -> bool:
        """Takes the fittest of `assessed` (the earliest on a tie), each evaluated on the
        whole pool, if it beats the best so far, and then writes the files once. Returns
        whether the best changed."""
        improved: Evaluation | None = None
        for member, evaluation in assessed:
            if not all(math.isfinite(v) for v in member.deltas.values()):
                # JSON would hold Infinity, which every reader (and every rerun) refuses.
                say(f"warning: candidate {member.candidate_id} has a delta that is not a finite number; it is "
                    f"never written to {DELTAS_BEST}")
                continue
            if self.fitness is None or evaluation.fitness > self.fitness:
                self.member, self.fitness, improved = member, evaluation.fitness, evaluation
        if improved is not None:
            assert self.member is not None
            deltas_path = self.output_dir / DELTAS_BEST
            atomic_write_json(deltas_path, self.member.deltas)
            if self.cluster_fingerprint:
                write_fingerprint(deltas_path, self.cluster_fingerprint)
            self.write_processor(deltas_path, self.output_dir / PROCESSOR_BEST)
            say(f"new best fitness {self.fitness:.4f} (candidate {self.member.candidate_id}, "
                f"{improved.mean_tokens:.1f} tokens, {100 * improved.correctness:.0f}% correct): "
                f"{deltas_path}, {PROCESSOR_BEST} updated")
        return improved is not None

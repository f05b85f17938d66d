"""The best-ever individual (seed 000 §1): updated whenever a newly evaluated individual is
strictly fitter, with deltas_best.json and processor_best.py rewritten each time."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from compressor_2.atomic import atomic_write_json
from compressor_2.evolution.progress import say
from compressor_2.evolution.state import Member
from compressor_2.steering.deltas import to_dict

DELTAS_BEST = "deltas_best.json"
PROCESSOR_BEST = "processor_best.py"

WriteProcessor = Callable[[Path, Path], None]  # (deltas JSON, processor module) -> None


class BestEver:
    def __init__(self, output_dir: Path, cluster_ids: Sequence[str], write_processor: WriteProcessor,
                 member: Member | None = None, fitness: float | None = None) -> None:
        self.output_dir = output_dir
        self.cluster_ids = list(cluster_ids)
        self.write_processor = write_processor
        self.member = member
        self.fitness = fitness

    def consider(self, individuals: Sequence[Any]) -> bool:
        """Takes the fittest of `individuals` (the earliest on a tie) if it beats the best so
        far, and then writes the files once. Returns whether the best changed."""
        improved = False
        for ind in individuals:
            value = ind.fitness.values[0]
            if self.fitness is None or value > self.fitness:
                self.member = Member(to_dict(ind, self.cluster_ids), ind.scratchpad)
                self.fitness = value
                improved = True
        if improved:
            assert self.member is not None
            deltas_path = self.output_dir / DELTAS_BEST
            atomic_write_json(deltas_path, self.member.deltas)
            self.write_processor(deltas_path, self.output_dir / PROCESSOR_BEST)
            best = max(individuals, key=lambda ind: ind.fitness.values[0])
            say(f"new best fitness {self.fitness:.4f} ({best.evaluation.mean_tokens:.1f} tokens, "
                f"{100 * best.evaluation.correctness:.0f}% correct): {deltas_path}, {PROCESSOR_BEST} updated")
        return improved

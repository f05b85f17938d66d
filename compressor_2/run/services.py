"""What every strategy is handed: `Run`, the run's shared services (the archive, the
evaluator whose answers it caches, the reflector, the pool of reflector calls, the budget,
the best-ever tracker), with the helpers every strategy's loop calls on them."""

from __future__ import annotations

import functools
import shlex
import sys
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from compressor_2.archive.database import RunArchive
from compressor_2.clusters.clusterset import ClusterSet
from compressor_2.clusters.tokens import AnswerTokens
from compressor_2.config import Config
from compressor_2.data.example import Example
from compressor_2.errors import ConfigError
from compressor_2.fitness import Evaluation, Evaluator
from compressor_2.reflector.base import Reflector
from compressor_2.run.best import BestEver
from compressor_2.run.budget import Budget
from compressor_2.run.progress import answers_bar


@dataclass
class Run:
    """What every strategy is given."""

    config: Config
    cluster_ids: list[str]  # canonical order
    examples: tuple[Example, ...]  # the training pool
    archive: RunArchive
    evaluator: Evaluator
    reflector: Reflector
    pool: Executor  # reflector calls in flight at once: CONFIG_REFLECTOR_CONCURRENCY
    budget: Budget
    best: BestEver
    started: float  # perf_counter at this session's start
    clusters: ClusterSet

    @property
    def out(self) -> Path:
        return self.config.output_dir

    def evaluate(self, genomes: Sequence[Sequence[float]], label: str,
                 examples: Sequence[Example] | None = None) -> list[Evaluation]:
        """All `genomes` on `examples` (default: the pool) in one engine call, with a bar."""
        if not genomes:
            return []
        n = len(self.examples if examples is None else examples)
        with answers_bar(len(genomes) * n, label) as bar:
            return self.evaluator.evaluate(genomes, bar.update, examples)

    @functools.cached_property
    def answer_tokens(self) -> AnswerTokens:
        """Texts retokenised with the model's tokenizer and mapped through the cluster map."""
        return AnswerTokens.from_config(self.config, self.clusters)

    @functools.cached_property
    def gold_tokens(self) -> dict[str, int]:
        """Tokens of each training example's gold answer (what an answer's `tokens` counts)."""
        return {ex.id: self.answer_tokens.length(ex.gold) for ex in self.examples}

    def start_afresh(self, state_file: Path, step: int) -> None:
        """A start without a state file forgets what an earlier start that saved nothing had
        made (its answers stay). An archive with later steps means the state file was lost:
        that is refused, never silently restarted."""
        later = self.archive.candidates("generation >= 1")
        if later:
            raise ConfigError(f"'{self.archive.path}' holds steps up to {later[-1].generation} but "
                              f"'{state_file}' is missing: restore it, or move the run directory "
                              "away (or choose another CONFIG_OUTPUT_DIR) to start a fresh run")
        self.archive.rollback(0, from_step=step)

    def stop_reason(self) -> str | None:
        """Asked between steps: the first budget reached, if any."""
        self.budget.checkpoint()
        return self.budget.exhausted()


def resume_command() -> str:
    """The command line this process was started with, as the user would retype it."""
    args = sys.argv[1:]
    if Path(sys.argv[0]).name == "__main__.py":
        return shlex.join(["python", "-m", "compressor_2", *args])
    return shlex.join([Path(sys.argv[0]).name, *args])

"""What every strategy is handed: `Run`, the run's shared services (the archive, the
evaluator whose answers it caches, the reflector, the pool of reflector calls and the
run's other thread pools, the budget, the best-ever tracker), with the helpers every
strategy's loop calls on them. `stop_reason`, asked at every step boundary, is where every
loop ends: a budget reached, or CONFIG_MAX_IDLE_STEPS steps in a row that made nothing new;
it also says when most of the last step's reflector replies were invalid, and brings the
outputs every strategy shares (front.png, report.html) up to date."""

from __future__ import annotations

import functools
import shlex
import sys
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path

from compressor_2.archive.database import RunArchive
from compressor_2.clusters.tokens import AnswerTokens
from compressor_2.config import Config
from compressor_2.data.example import Example
from compressor_2.errors import ConfigError
from compressor_2.fitness import Evaluation, Evaluator
from compressor_2.reflector.base import Reflector
from compressor_2.reflector.prompt_log import PROMPT_DIR
from compressor_2.run.best import BestEver
from compressor_2.run.budget import Budget
from compressor_2.run.idle import IdleSteps
from compressor_2.run.outputs import refresh_outputs
from compressor_2.run.progress import evaluate_with_bar, say
from compressor_2.run.workers import Workers


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
    workers: Workers  # every thread pool of the run (`pool` is one of them)
    answer_tokens: AnswerTokens  # answers retokenised through the cluster map, shared with the local reflector
    heldout: tuple[Example, ...] = ()  # CONFIG_HOLDOUT_*: checked when the run stops, never searched on
    idle: IdleSteps = field(init=False)
    replies_seen: int = field(init=False)  # the newest reflector call the step boundaries have looked at

    def __post_init__(self) -> None:
        self.idle = IdleSteps(self.config.max_idle_steps)
        self.replies_seen = self.archive.verdicts()[0]

    @property
    def out(self) -> Path:
        return self.config.output_dir

    def evaluate(self, genomes: Sequence[Sequence[float]], label: str,
                 examples: Sequence[Example] | None = None) -> list[Evaluation]:
        """All `genomes` on `examples` (default: the pool) in one engine call, with a bar."""
        if not genomes:
            return []
        return evaluate_with_bar(self.evaluator, genomes, self.examples if examples is None else examples, label)

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

    def stop_reason(self, proposer: str = "the reflector") -> str | None:
        """Asked between steps (every strategy does, at the end of each): the first budget
        reached, or CONFIG_MAX_IDLE_STEPS steps in a row without a fresh metric call, if any;
        either way the outputs every strategy shares are brought up to date. `proposer`
        names what proposes genomes."""
        self.budget.checkpoint()
        reason = self.budget.exhausted()  # judged on what the steps spent, before the drawing below
        if reason is None:
            self.report_invalid_replies()  # a stopping run's last replies are reported on the way out
            reason = self.idle.after_step(self.archive.metric_calls(), proposer)
        self.refresh()
        return reason

    def refresh(self) -> Path:
        """front.png and report.html, from the archive as it stands; returns the report's path."""
        return refresh_outputs(self.archive, self.out, self.examples, self.heldout)

    def report_invalid_replies(self) -> None:
        """One line when most reflector replies since the last step boundary were invalid."""
        newest, calls, accepted, last = self.archive.verdicts(after=self.replies_seen)
        self.replies_seen = newest
        if 2 * (calls - accepted) > calls:
            say(f"warning: {calls - accepted} of {calls} reflector replies of the last step were invalid (the last: "
                f"{last}); the replies are in {self.out / PROMPT_DIR}")

    def nothing_evolved(self) -> str | None:
        """Why the run failed when the reflector answered and not one reply was valid."""
        _, calls, accepted, last = self.archive.verdicts()
        if calls == 0 or accepted:
            return None
        return (f"none of the reflector's {calls} replies in this run was valid (the last: {last}), so it evolved "
                f"nothing; the replies are in {self.out / PROMPT_DIR}: check CONFIG_REFLECTOR_MODEL and that "
                "its server supports structured outputs")


def resume_command() -> str:
    """The command line this process was started with, as the user would retype it."""
    args = sys.argv[1:]
    if Path(sys.argv[0]).name == "__main__.py":
        return shlex.join(["python", "-m", "compressor_2", *args])
    return shlex.join([Path(sys.argv[0]).name, *args])

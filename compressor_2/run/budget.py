"""The run's three budgets (each 0 for unlimited) and what a step of a strategy costs.

- CONFIG_MAX_METRIC_CALLS: fresh (genome, example) evaluations; cache hits are free;
- CONFIG_MAX_REFLECTOR_TOKENS: prompt + completion tokens of every reflector attempt;
- CONFIG_MAX_WALL_MINUTES: wall time summed over the run's sessions.

The run's driver asks `exhausted()` between steps, and inside a step before every
evaluation that needs fresh answers (`gate`): a reached budget stops the step there, so a
run overshoots its metric calls by at most the one evaluation that crossed them, never by
a step. The reflector tokens and the wall time can also be overshot by the reflector calls
a step makes before its next evaluation (the gate is not asked before a reflector call). An
evaluation served from the cache is never refused: it costs nothing, and a replayed step
then stops exactly where the uninterrupted one did. The counts come from the run archive,
so they survive resumes, and a rerun with a raised budget continues where the run stopped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from compressor_2.archive import RunArchive
from compressor_2.config import Config


@dataclass(frozen=True)
class Limits:
    metric_calls: int
    reflector_tokens: int
    wall_minutes: float

    @classmethod
    def from_config(cls, config: Config) -> Limits:
        return cls(config.max_metric_calls, config.max_reflector_tokens, config.max_wall_minutes)


@dataclass(frozen=True)
class Spent:
    metric_calls: int
    reflector_tokens: int
    wall_minutes: float


@dataclass(frozen=True)
class Cost:
    """A strategy's estimate of its steps, before any work."""

    step: str  # what a step is called: "generation", "iteration"
    first_metric_calls: float  # the set-up (e.g. evaluating the initial population)
    metric_calls: float  # each step after it
    reflector_tokens: float  # each step


def stop_reason(limits: Limits, spent: Spent) -> str | None:
    """The first budget reached, in words, or None."""
    if limits.metric_calls and spent.metric_calls >= limits.metric_calls:
        return f"CONFIG_MAX_METRIC_CALLS={limits.metric_calls} reached ({spent.metric_calls} metric calls)"
    if limits.reflector_tokens and spent.reflector_tokens >= limits.reflector_tokens:
        return (f"CONFIG_MAX_REFLECTOR_TOKENS={limits.reflector_tokens} reached "
                f"({spent.reflector_tokens} reflector tokens)")
    if limits.wall_minutes and spent.wall_minutes >= limits.wall_minutes:
        return f"CONFIG_MAX_WALL_MINUTES={limits.wall_minutes:g} reached ({spent.wall_minutes:.1f} minutes)"
    return None


def shortfall(limits: Limits, spent: Spent, cost: Cost, steps: int = 3) -> str | None:
    """A warning, with the numbers, when what is left of a budget cannot pay for `steps`
    more steps (GEPA users ran "optimisations" that made one proposal)."""
    warnings = []
    if limits.metric_calls:
        left = limits.metric_calls - spent.metric_calls
        need = cost.first_metric_calls + steps * cost.metric_calls
        if left < need:
            affordable = max(0, math.floor((left - cost.first_metric_calls) / cost.metric_calls)) \
                if cost.metric_calls else steps
            warnings.append(
                f"CONFIG_MAX_METRIC_CALLS={limits.metric_calls} leaves {left} metric calls, enough for about "
                f"{affordable} {cost.step}(s): the start costs about {cost.first_metric_calls:.0f} and each "
                f"{cost.step} about {cost.metric_calls:.0f}, so {steps} need about {need:.0f}")
    if limits.reflector_tokens and cost.reflector_tokens:
        left = limits.reflector_tokens - spent.reflector_tokens
        need = steps * cost.reflector_tokens
        if left < need:
            warnings.append(
                f"CONFIG_MAX_REFLECTOR_TOKENS={limits.reflector_tokens} leaves {left} tokens, enough for about "
                f"{max(0, math.floor(left / cost.reflector_tokens))} {cost.step}(s) at about "
                f"{cost.reflector_tokens:.0f} per {cost.step}; {steps} need about {need:.0f}")
    return "; ".join(warnings) or None


class BudgetReached(Exception):
    """A budget was reached inside a step, before an evaluation that needed fresh answers."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Budget:
    """The run's limits and what it has spent, read from the archive."""

    def __init__(self, limits: Limits, archive: RunArchive, clock: Callable[[], float] = time.monotonic) -> None:
        """`clock`: the seconds the wall budget counts (a test's own, so that no outcome
        depends on how fast the machine is)."""
        self.limits = limits
        self.archive = archive
        self._clock = clock
        self._earlier_seconds = archive.meta_count("wall_seconds")
        self._session_start = clock()

    def start(self) -> None:
        """The session's clock starts now: what it did before its first step (measuring the
        baseline apart) is not the search's."""
        self._session_start = self._clock()

    def spent(self) -> Spent:
        _, prompt, completion = self.archive.reflector_tokens()
        return Spent(self.archive.metric_calls(), prompt + completion, self.seconds() / 60)

    def seconds(self) -> float:
        return self._earlier_seconds + self._clock() - self._session_start

    def exhausted(self) -> str | None:
        return stop_reason(self.limits, self.spent())

    def gate(self) -> None:
        """Before a step's fresh answers (any number of them: the budget is what was spent
        before): raises BudgetReached once a budget is reached."""
        if reason := self.exhausted():
            raise BudgetReached(reason)

    def checkpoint(self) -> None:
        """Saves the wall time so far (at the end of each step, and on the way out)."""
        self.archive.set_meta({"wall_seconds": round(self.seconds(), 3)})

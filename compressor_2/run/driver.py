"""The step driver: one loop owns a run's life, whatever the strategy.

A strategy supplies only its decisions (`Strategy`): how it starts, one step, its state as
one typed object, and how it restores it. The driver does the rest, in the order that
keeps a resume exact:
- a fresh start (forgetting what an earlier start that saved nothing made) or a resume:
  the state read and checked before anything is written (then the caller's `begin`, the
  session's first writes), what an interrupted step had made forgotten, the RNGs, the
  best-ever and the strategy restored;
- every step: its evaluations pass the budget's gate (a budget reached inside a step
  stops it before its next fresh answers); then the history, the state, the outputs (on
  a clock) and the step's line;
- between steps, why to stop: the step count, a budget, CONFIG_MAX_IDLE_STEPS steps in a
  row that made nothing new; and a warning when most of a step's reflector replies were
  invalid;
- Ctrl+C, SIGTERM or a reflector that stopped answering inside a step: the state of the
  step's start is saved again with the best-ever found since, and one line says how to
  resume; a budget reached inside a step saves it the same way, silently;
- the stop: the reason in the history and the archive's events, every output drawn, and a
  run whose reflector never answered validly failed.

A run that stopped at a budget and is rerun with a budget still reached stops at once
without forgetting anything: it is where the uninterrupted run stopped. Any other resume
replays the interrupted step from its start: its answers come from the archive, and its
evaluations meet the gate where the uninterrupted run met it.
"""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from compressor_2.archive import SEED_STEP, RunArchive
from compressor_2.common import (
    ConfigError,
    ReflectorUnavailable,
    RunError,
    atomic_write_json,
    ordinal,
    plural,
    say,
    signals_ignored,
)
from compressor_2.outputs import Refresh
from compressor_2.reflector import PROMPT_DIR
from compressor_2.resume import (
    HISTORY_FILE,
    Member,
    Saved,
    StateFormat,
    StepEntry,
    append_log,
    capture_rngs,
    check_state,
    load_history,
    log_lines,
    read_state,
    restore_rngs,
    save_history,
    save_state,
    truncate_log,
)
from compressor_2.run.budget import BudgetReached
from compressor_2.run.idle import IdleSteps
from compressor_2.run.services import Run, resume_command
from compressor_2.run.watch import CallWatch
from compressor_2.findings import standing


def check_readable(archive: RunArchive) -> None:
    """Reads once every row the outputs draw on (the run's standing: its candidates and the
    checks' results; the events; the stored answers) for its refusal alone, and drops what
    it read: a hand-edited row is refused before anything is written."""
    standing(archive)
    archive.events()
    archive.check_stored_answers()


@dataclass(frozen=True)
class Report:
    """What a step did: the history's entries from that step on (the GA's second one is
    the population it leaves), its line, and the JSON files it leaves in the run directory,
    by name (GEPA's front), which the driver writes with the history."""

    entries: list[StepEntry]
    line: str
    files: Mapping[str, Any] = field(default_factory=dict)


class Strategy(Protocol):
    """A strategy's decisions; everything around them is the driver's."""

    state_format: StateFormat[Any]
    step_name: str  # "generation", "iteration", "batch"
    steps: int | None  # the steps to run; None: until a budget stops the run
    steps_symbol: str  # the option setting `steps`
    proposer: str  # what proposes its genomes: "the reflector", "the sampler"
    progress_plot: str | None  # its plot of the best and percentiles against metric calls

    def rngs(self) -> Mapping[str, Any]:
        """The generators it draws from, by `state_format.rngs` name."""
        ...

    def start(self) -> None:
        """A fresh start: the seed candidates made, the generators seeded."""
        ...

    def own_state(self) -> Any:
        """Its state, as `state_format.write` takes it."""
        ...

    def restore(self, own: Any, t: int) -> None:
        """Takes up a saved state of step t's start, after the archive forgot what came
        after it."""
        ...

    def step(self, t: int) -> Report:
        ...

    def closing(self, t: int) -> list[StepEntry]:
        """The history's entries from step t on when the run stops before step t: none
        unless it has its own (the history ends with the last step's entry)."""
        return []


def drive(run: Run, strategy: Strategy, begin: Callable[[], None] = lambda: None) -> str:
    """Runs `strategy` from its start or its saved state to its stop; returns why it
    stopped. `begin`: what the session writes before its steps (the caller's), called once
    the run's files were read and checked, so a refused resume writes nothing. An
    interruption or a failure is recorded in the archive's events, with the front and the
    report drawn, and raised."""
    driver = Driver(run, strategy, begin)
    try:
        with CallWatch(run.reflector):
            return driver.drive()
    except (KeyboardInterrupt, RunError) as exc:
        with contextlib.suppress(Exception), signals_ignored():
            run.budget.checkpoint()
            if isinstance(exc, KeyboardInterrupt):
                run.archive.event("interrupted")
            else:
                run.archive.event("failed", error=str(exc))
            run.refresh_outputs()
        raise


class Driver:
    def __init__(self, run: Run, strategy: Strategy, begin: Callable[[], None] = lambda: None) -> None:
        self.run, self.strategy, self.archive, self.begin = run, strategy, run.archive, begin
        self.path = run.out / strategy.state_format.file
        self.history: list[StepEntry] = []
        self.saved: Saved[Any] | None = None
        self.idle = IdleSteps(run.config.max_idle_steps)
        self.replies_seen = run.archive.reply_tally().newest  # the newest reflector call the step boundaries have seen
        self.refresh = Refresh(run.archive, run.out, run.examples, run.heldout, strategy.progress_plot)

    def drive(self) -> str:
        stopped_cleanly = self.archive.last_event() == "stop"  # the last session was not cut short
        saved = self._read()  # before anything is written: a refused resume leaves every file as it was
        self.begin()
        self.archive.event("start", strategy=self.run.config.strategy, metric_calls=self.archive.metric_calls())
        if saved is None:
            return self._steps(self._start())
        if (done := self._all_run(saved.step)) is not None:
            return self._done(saved, done)
        reason = self.run.budget.exhausted() if stopped_cleanly else None
        self._restore(saved, forget=reason is None)
        return self._finish(saved.step, reason) if reason is not None else self._steps(saved.step)

    # -- start and resume -------------------------------------------------------------------

    def _read(self) -> Saved[Any] | None:
        """The state and the history, checked; and every row the outputs draw on read once
        (the candidates, the checks' results, the events, the answers): a hand-edited one
        is refused before anything is written. An archive with later steps than a start
        means the state file was lost: that is refused, never silently restarted."""
        config = self.run.config
        saved = read_state(self.path, self.strategy.state_format, self.run.cluster_ids,
                           config.lambda_shortness + config.lambda_correctness)
        if saved is None and (last := self.archive.last_step()) is not None and last >= 1:
            raise ConfigError(f"'{self.archive.path}' holds steps up to {last} but '{self.path}' is missing: restore "
                              "it, or move the run directory away (or choose another CONFIG_OUTPUT_DIR) to start a "
                              "fresh run")
        if saved is not None:
            check_state(saved, self.path, self.strategy.state_format, self.archive,
                        deterministic=config.temperature == 0)
            if self.strategy.state_format.log is not None:  # read with the state, before anything is written
                log_lines(self.run.out / self.strategy.state_format.log)
            # The history the run goes on from (all of it when every step has run; a resume
            # rewrites the rest).
            self.history = load_history(self.run.out / HISTORY_FILE,
                                        before=None if self._all_run(saved.step) else saved.step)
        check_readable(self.archive)
        return saved

    def _start(self) -> int:
        """A start without a state file forgets what an earlier start that saved nothing had
        made (its answers stay)."""
        self.archive.rollback(0, from_step=SEED_STEP)
        self.strategy.start()
        self._save(0)
        return 0

    def _restore(self, saved: Saved[Any], forget: bool) -> None:
        """The state of step `saved.step`'s start; with `forget`, what came after it is
        forgotten first (answers stay: they are the cache)."""
        if forget:
            self.archive.rollback(saved.last_candidate_id, from_step=saved.step)
        restore_rngs(saved.rng, self.strategy.rngs())
        self.run.best.restore(*self._recorded_best(saved))
        before = self.run.best.fitness
        if self.strategy.state_format.log is not None:  # its lines of the steps a resume replays go
            truncate_log(self.run.out / self.strategy.state_format.log, saved.step)
        self.strategy.restore(copy.deepcopy(saved.own), saved.step)  # the steps change theirs; the saved state stays
        self.saved = saved
        if self.run.best.fitness != before:  # a sampled re-evaluation beat it: the state keeps it
            self._save_with_best()
        self.run.best.rewrite()
        steps = self.strategy.steps
        say(f"resuming at {self.strategy.step_name} {ordinal(saved.step, steps) if steps else saved.step} from "
            f"{self.path}")

    def _recorded_best(self, saved: Saved[Any]) -> tuple[Member | None, float | None, float | None, float | None]:
        """The best-ever the state keeps, or else the archive's best assessed candidate; with
        its fitness, tokens and correctness on the pool (what ranks it)."""
        if self.strategy.state_format.keeps_best:
            if saved.best is None:
                return None, None, None, None
            row = self.archive.candidate(saved.best.candidate_id)
            return (saved.best, saved.best_fitness, row.mean_tokens if row else None,
                    row.correctness if row else None)
        best = self.archive.best()
        if best is None or best.id is None:
            return None, None, None, None
        return Member(dict(best.deltas), best.scratchpad, best.id), best.fitness, best.mean_tokens, best.correctness

    def _all_run(self, t: int) -> str | None:
        steps, name = self.strategy.steps, self.strategy.step_name
        if steps is None or t < steps:
            return None
        return f"all {t} {plural(name)} have run; raise {self.strategy.steps_symbol} to go further"

    def _done(self, saved: Saved[Any], reason: str) -> str:
        """Every step had run (the step count may have been lowered since): nothing that ran
        is dropped; a run killed after its last state was saved gets its stop recorded."""
        self.run.best.restore(*self._recorded_best(saved))
        self.run.best.rewrite()
        if self.history and "stop_reason" not in self.history[-1]:
            self.history[-1]["stop_reason"] = f"all {saved.step} {plural(self.strategy.step_name)} ran"
            save_history(self.run.out / HISTORY_FILE, self.history)
        self.refresh.draw(self.history)
        return self._conclude(reason)

    # -- the steps --------------------------------------------------------------------------

    def _steps(self, t: int) -> str:
        try:
            reason = self._boundary(t)
            while reason is None:
                self._record(t, self._step(t))
                t += 1
                reason = self._boundary(t)
        except BudgetReached as stop:
            self._save_with_best()
            return self._finish(t, stop.reason)
        except (KeyboardInterrupt, ReflectorUnavailable) as exc:
            self._cut_short("interrupted" if isinstance(exc, KeyboardInterrupt) else "stopped")
            raise
        return self._finish(t, reason)

    def _boundary(self, t: int) -> str | None:
        """Why the run stops before step t, if it does."""
        self.run.budget.checkpoint()
        if self.strategy.steps is not None and t >= self.strategy.steps:
            return f"all {self.strategy.steps} {plural(self.strategy.step_name)} ran"
        reason = self.run.budget.exhausted()  # judged on what the steps spent
        if reason is None:
            self._report_invalid_replies()  # a stopping run's last replies are reported on the way out
            reason = self.idle.after_step(self.archive.metric_calls(), self.strategy.proposer)
        return reason

    def _step(self, t: int) -> Report:
        """Step t, its fresh answers through the budget's gate."""
        self.run.evaluator.gate = self.run.budget.gate
        try:
            return self.strategy.step(t)
        finally:
            self.run.evaluator.gate = None

    def _cut_short(self, why: str) -> None:
        """The state of the step in progress, saved again with the best-ever found since,
        and how to resume."""
        assert self.saved is not None
        with signals_ignored():
            self._save_with_best()
        steps, t = self.strategy.steps, self.saved.step
        print(f"\n{why}: state saved to {self.path}; {self.strategy.step_name} {ordinal(t, steps) if steps else t} "
              f"starts again when you rerun the same command: {resume_command()}", file=sys.stderr)

    def _record(self, t: int, report: Report) -> None:
        """End of step t: the history, then the state that points past it (an interruption
        between the two never loses a finished step's records), the outputs, the line."""
        self.history[t:] = report.entries
        save_history(self.run.out / HISTORY_FILE, self.history)
        if self.strategy.state_format.log is not None:
            append_log(self.run.out / self.strategy.state_format.log, report.entries)
        for name, document in report.files.items():
            atomic_write_json(self.run.out / name, document)
        self._save(t + 1)
        self.refresh.after_step(self.history)
        say(report.line)

    def _save(self, step: int) -> None:
        self.saved = Saved(step, capture_rngs(self.strategy.rngs()), self.archive.last_candidate_id(),
                           copy.deepcopy(self.strategy.own_state()), self.run.best.member, self.run.best.fitness)
        save_state(self.run.out, self.strategy.state_format, self.saved)

    def _save_with_best(self) -> None:
        assert self.saved is not None
        self.saved = replace(self.saved, best=self.run.best.member, best_fitness=self.run.best.fitness)
        save_state(self.run.out, self.strategy.state_format, self.saved)

    # -- the stop ---------------------------------------------------------------------------

    def _finish(self, t: int, reason: str) -> str:
        """The run stops before step t (or inside it): the history ends with why."""
        if closing := self.strategy.closing(t):
            self.history[t:] = closing
        if self.history:
            self.history[-1]["stop_reason"] = reason
            save_history(self.run.out / HISTORY_FILE, self.history)
        self.refresh.draw(self.history)
        return self._conclude(reason)

    def _conclude(self, reason: str) -> str:
        self._report_invalid_replies()  # the last step's
        self.run.budget.checkpoint()
        self.archive.event("stop", reason=reason)
        if failure := self._nothing_evolved():
            raise RunError(failure)
        return reason

    def _report_invalid_replies(self) -> None:
        """One line when most reflector replies since the last step boundary were invalid."""
        tally = self.archive.reply_tally(after=self.replies_seen)
        self.replies_seen = tally.newest
        if 2 * (tally.calls - tally.accepted) > tally.calls:
            say(f"warning: {tally.calls - tally.accepted} of {tally.calls} reflector replies of the last step were "
                f"invalid (the last: {tally.last_rejection}); the replies are in {self.run.out / PROMPT_DIR}")

    def _nothing_evolved(self) -> str | None:
        """Why the run failed when the reflector answered and not one reply was valid."""
        _, calls, accepted, last = self.archive.reply_tally()
        if calls == 0 or accepted:
            return None
        return (f"none of the reflector's {calls} replies in this run was valid (the last: {last}), so it evolved "
                f"nothing; the replies are in {self.run.out / PROMPT_DIR}: check CONFIG_REFLECTOR_MODEL and that "
                "its server supports structured outputs")

"""Issue X item 1: an interruption at any moment, the initial population included, is
resumable, and the rerun ends like an uninterrupted run, its stop recorded.

The table interrupts every strategy with SIGINT, a double SIGINT, SIGTERM, SIGTERM then
SIGKILL, and SIGKILL, at the first answers a run generates (the initial population, or the
seed candidate) and in a later step. Each interrupted leg is a real `python -m
compressor_2 evolve` process, forked from a server that has imported everything once
(multiprocessing's forkserver: a fresh interpreter per case would cost seconds of imports),
with SIGINT reset to Python's own handler, since a suite started in the background
inherits an ignored one. The process sends the signals to itself from inside the engine,
right after an answer batch, so the stop lands mid-evaluation: answers generated, none of
them stored. A second signal comes at the first durable write after the first
one (the interrupted run's save), or after 0.2 s. The rerun, in this process, must end
with the uninterrupted run's candidates and deltas_best.json, and `show` must read the
stop.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from compressor_2.cli import main
from tests.test_evolution_support import shared_dir, write_config
from tests.test_fault_injection import candidates, soundness_problems, temp_files

pytestmark = pytest.mark.slow

# Small runs of each strategy, each with at least four answer batches after its first.
STRATEGIES = {
    "ga": {"NGEN": "2"},
    "gepa": {"STRATEGY_GEPA": "y", "MAX_METRIC_CALLS": "12", "GEPA_VALSET_SIZE": "1", "GEPA_MINIBATCH_SIZE": "1"},
    "archive": {"STRATEGY_ARCHIVE": "y", "ARCHIVE_ITERATIONS": "2", "ARCHIVE_PARENTS_PER_ITERATION": "1",
                "ARCHIVE_GENERATORS": '"cluster"'},
    "random": {"STRATEGY_RANDOM": "y", "RANDOM_BATCH_SIZE": "2", "RANDOM_BATCHES": "2"},
    "cmaes": {"STRATEGY_CMAES": "y", "CMAES_POPULATION": "2", "CMAES_GENERATIONS": "2"},
}

# (the first signal, the second: sent at the first durable write after the first, or None)
SIGNALS = {
    "SIGINT": (signal.SIGINT, None),
    "double SIGINT": (signal.SIGINT, signal.SIGINT),
    "SIGTERM": (signal.SIGTERM, None),
    "SIGTERM then SIGKILL": (signal.SIGTERM, signal.SIGKILL),
    "SIGKILL": (signal.SIGKILL, None),
}
SECOND_SIGNAL_AFTER = 0.2  # seconds, when no durable write comes first
HANG_GUARD = 300.0  # seconds: a hung leg is killed and reported, never waited for
FIRST = "first answers"
LATER = "a later step"


# -- the interrupted leg, in a forked process -------------------------------------------------

def _send(sig: int) -> None:
    os.kill(os.getpid(), sig)


def _arm(batch: int, first: int, second: int | None) -> None:
    """The engine sends `first` to its own process once it has generated answer batch `batch`
    (counted from 1 over the run), and `second` at the next fsync (a durable write) or a
    little later."""
    from compressor_2.engines.transformers.engine import TransformersEngine

    original, counter = TransformersEngine._generate_batch, itertools.count(1)
    sent = threading.Event()

    def generate_batch(self, encoded, deltas):  # noqa: ANN001, ANN202 - the patched method's signature
        answers = original(self, encoded, deltas)
        if next(counter) == batch:
            sent.set()
            if second is not None:
                threading.Timer(SECOND_SIGNAL_AFTER, _send, (second,)).start()
            _send(first)
        return answers

    fsync = os.fsync

    def fsync_then_second(fd: int) -> None:
        fsync(fd)
        if second is not None and sent.is_set():
            sent.clear()
            _send(second)

    TransformersEngine._generate_batch = generate_batch
    os.fsync = fsync_then_second


def _interrupted_leg(config: str, log: str, batch: int, first: int, second: int | None) -> None:
    """What the forked process runs: evolve, as `python -m compressor_2` does, with Python's
    own SIGINT handler and the default SIGTERM."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.argv = ["compressor_2", "evolve", "--config", config]
    _arm(batch, first, second)
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@pytest.fixture(scope="module")
def forkserver() -> multiprocessing.context.ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["compressor_2.cli", "compressor_2.commands.evolve", "compressor_2.engines.registry",
                                    "compressor_2.engines.transformers.engine", "transformers", "torch",
                                    __name__])
    return context


def interrupted_leg(forkserver: multiprocessing.context.ForkServerContext, config: Path, log: Path, batch: int,
                    first: int, second: int | None) -> int:
    """The leg's exit code: 130 for a stop it handled, -9 for SIGKILL."""
    process = forkserver.Process(target=_interrupted_leg, args=(str(config), str(log), batch, first, second))
    process.start()
    process.join(HANG_GUARD)
    if process.exitcode is None:
        process.kill()
        process.join()
        pytest.fail(f"the interrupted leg hung; its output:\n{log.read_text()}")
    return process.exitcode


# -- the uninterrupted runs ---------------------------------------------------------------------

@dataclass(frozen=True)
class Reference:
    out: Path
    batches: int  # answer batches the engine generated over the run
    stop: str  # `show`'s status line


def count_batches(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    from compressor_2.engines.transformers.engine import TransformersEngine

    original, calls = TransformersEngine._generate_batch, []

    def counted(self, encoded, deltas):  # noqa: ANN001, ANN202 - the patched method's signature
        calls.append(1)
        return original(self, encoded, deltas)

    monkeypatch.setattr(TransformersEngine, "_generate_batch", counted)
    return lambda: len(calls)


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict[str, Reference]:
    shared = shared_dir(tmp_path_factory)
    made = {}
    with pytest.MonkeyPatch.context() as monkeypatch, _Quiet() as quiet:
        for name, symbols in STRATEGIES.items():
            work = tmp_path_factory.mktemp(f"reference_{name}")
            config = write_config(work, shared, tiny_model_dir, **symbols)
            batches = count_batches(monkeypatch)
            assert main(["evolve", "--config", str(config)]) == 0, quiet.text()
            monkeypatch.undo()
            made[name] = Reference(work / "out", batches(), quiet.status(config))
    return made


class _Quiet:
    """Runs commands in this process with their output kept apart from the test's."""

    def __enter__(self) -> _Quiet:
        import contextlib
        import io

        self._buffer = io.StringIO()
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(contextlib.redirect_stdout(self._buffer))
        self._stack.enter_context(contextlib.redirect_stderr(self._buffer))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def text(self) -> str:
        return self._buffer.getvalue()

    def status(self, config: Path) -> str:
        start = len(self._buffer.getvalue())
        assert main(["show", "--config", str(config)]) == 0
        shown = self._buffer.getvalue()[start:]
        return next(line for line in shown.splitlines() if line.startswith("status "))


# -- the table ---------------------------------------------------------------------------------

CASES = [pytest.param(strategy, kind, point, id=f"{strategy}-{kind}-{point}")
         for strategy, kind, point in itertools.product(STRATEGIES, SIGNALS, (FIRST, LATER))
         # Every signal at the first answers; the later step with one of each way a run ends.
         if point == FIRST or kind in ("SIGINT", "SIGKILL")]


@pytest.mark.parametrize(("strategy", "kind", "point"), CASES)
def test_an_interruption_then_a_rerun_ends_like_an_uninterrupted_run(strategy, kind, point, tmp_path,
                                                                    tmp_path_factory, tiny_model_dir, references,
                                                                    forkserver):
    reference = references[strategy]
    config = write_config(tmp_path, shared_dir(tmp_path_factory), tiny_model_dir, **STRATEGIES[strategy])
    out, log = tmp_path / "out", tmp_path / "interrupted.log"
    batch = 1 if point == FIRST else reference.batches // 2 + 1
    first, second = SIGNALS[kind]
    code = interrupted_leg(forkserver, config, log, batch, first, second)
    what = f"{strategy}, {kind} after answer batch {batch} of {reference.batches}"
    assert code == (-signal.SIGKILL if signal.SIGKILL in (first, second) and code != 130 else 130), \
        f"{what}: exit {code}\n{log.read_text()}"
    if code == 130:
        assert "Traceback" not in log.read_text(), f"{what}:\n{log.read_text()}"
    assert not soundness_problems(out), f"{what}: {soundness_problems(out)}"

    with _Quiet() as quiet:
        assert main(["evolve", "--config", str(config)]) == 0, f"{what}: the rerun failed:\n{quiet.text()}"
        assert quiet.status(config) == reference.stop, f"{what}:\n{quiet.text()}"
    assert (out / "deltas_best.json").read_bytes() == (reference.out / "deltas_best.json").read_bytes(), what
    assert candidates(out) == candidates(reference.out), what
    assert temp_files(out) == [], what

"""`python -m compressor_2 evolve`: preflight, open the run, drive it, close it.

- Preflight, before anything is written or rebuilt (the lock file included): the output
  and cluster paths (a directory another evolve holds refused at once), the training
  pool and held-out questions, the model's weights and every prompt the run will send
  against its context (`check_model`); then, under the run directory's lock: a
  directory of a compressor_2 before the archive, the settings a resumed run was started
  with (the clusters' own among them); then the clusters are built (or reused: what an
  up-to-date set still owes its directory is written later), the initial deltas checked
  against them.
- Opening the run: the run archive (its identity compared on a resume: see
  resume/identity.py), the evaluator (answers cached in the archive, under the answer
  context the run recorded at its start), the reflector (every call recorded in it), the
  budget and the best-ever tracker, and a warning when the budget cannot pay for three
  steps.
- Driving: the strategy named by CONFIG_STRATEGY, through the run's driver
  (run/driver.py), which returns why it stopped. Once it has read and checked the run's
  files, the session makes its first writes (`begin` in `services`): compare first, write
  after, so a refused resume leaves every file of the run and of the clusters as it was,
  byte for byte.
- Closing: outside the search and its budget, the held-out check (CONFIG_HOLDOUT_*)
  measures the best, the front and the unsteered baseline, and the simpler tools
  (CONFIG_COMPARE_SIMPLE) are measured around it; the run ends with their lines. A Ctrl+C
  skips them (the next run of the same command makes them, from the cache where it can).

Whatever the exit (done, a budget, Ctrl+C, a failure), the reflector abandons its calls in
flight first, and then every thread pool of the run is stopped: `evolve` returns within
moments and leaves no thread of its own behind.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compressor_2.archive import ARCHIVE_FILE, BEST_FLOOR, CheckStore, RunArchive
from compressor_2.commands.files import Files
from compressor_2.common import ConfigError, remove_orphans, say, signals_ignored, stop_on_first_signal
from compressor_2.config import Config
from compressor_2.data import Example
from compressor_2.deltas import Deltas, check_map_digest, sidecar_path, gene_ids, load_deltas
from compressor_2.fitness import Evaluator, answer_context
from compressor_2.outputs import FRONT_PLOT
from compressor_2.reflector import PROMPT_DIR
from compressor_2.resume import (
    RunInputs, check_identity, check_not_in_use, check_settings, model_identity, recorded_context, run_lock,
)
from compressor_2.run import DELTAS_BEST, PROCESSOR_BEST, BestEver, Budget, Limits, Run, Workers, drive, shortfall
from compressor_2.strategies import Plugin, load_strategy
from compressor_2.findings import Checks, Oracle, other_side_examples, simpler_options

if TYPE_CHECKING:
    from compressor_2.clusters.clusterset import ClusterSet
    from compressor_2.clusters.tokens import AnswerTokens
    from compressor_2.engines import LazyEngine
    from compressor_2.reflector import Reflector

# Files a run directory of an earlier compressor_2 (before the archive) holds.
PRE_ARCHIVE_FILES = ("evolution_state.json", "history.json")


@dataclass(frozen=True)
class Inputs:
    """What preflight read: the clusters, the training pool, the held-out questions, the
    initial deltas, the answer context (the digest of the settings that make an answer), and the writes the
    cluster build still owes."""

    clusters: ClusterSet
    digest: str  # cluster_map_digest
    examples: tuple[Example, ...]
    heldout: tuple[Example, ...]
    initial: Deltas
    context: str
    model: str  # model_identity
    prompts: dict[str, str]  # every prompt the run will send, by example id (`every_prompt`)
    owed: tuple[Callable[[], None], ...] = ()  # made by the session's `begin`


def evolve(config: Config, files: Files | None = None) -> None:
    """`files`: the table of the command's files (made here from `config` when not handed)."""
    strategy = load_strategy(config.strategy)
    files = files or Files.of(config)
    with preflight(config, files) as inputs, open_run(config, inputs, strategy) as (run, checks, begin):
        reason = drive(run, strategy.make(run), begin)
        close(run, checks, reason)


@contextlib.contextmanager
def preflight(config: Config, files: Files) -> Iterator[Inputs]:
    """Everything checked before any work, what needs no run file before the run directory's
    lock is taken, the rest under it (held until the run ends); nothing is written or rebuilt before a resume's settings are compared, and
    nothing but a rebuild (whose map the run's identity compares) before the session's
    `begin`."""
    from compressor_2.clusters.builder import build_clusters
    from compressor_2.clusters.clusterset import cluster_map_digest
    from compressor_2.data import examples_from_config, holdout_examples
    from compressor_2.engines import check_model

    out = config.output_dir
    files.check_output_dir(run=True)
    check_not_in_use(out)
    files.check_cluster_outputs()
    examples = tuple(examples_from_config(config))
    heldout = tuple(holdout_examples(config, examples))
    prompts = every_prompt(config, (*examples, *heldout))
    check_model(config, prompts)
    with run_lock(out):
        _refuse_pre_archive_directory(out)
        model = model_identity(config)
        kept = _refuse_changed_settings(out, config, RunInputs(None, examples, None, model))
        owed: list[Callable[[], None]] = []
        clusters = build_clusters(config, later=owed, paths=files.artifacts)
        digest = cluster_map_digest(clusters)
        initial = _initial_deltas(config, clusters.cluster_ids, digest)
        context = kept or answer_context(answer_settings(config, clusters.build_digest))
        yield Inputs(clusters, digest, examples, heldout, initial, context, model, prompts, tuple(owed))


def every_prompt(config: Config, asked: tuple[Example, ...]) -> dict[str, str]:
    """Every prompt the run will send by example id: the pool's and the held-out questions',
    and the instruction tool's on the instruction's other side."""
    return {e.id: e.prompt for e in (*asked, *other_side_examples(config, asked))}


def _initial_deltas(config: Config, cluster_ids: tuple[str, ...], digest: str) -> Deltas:
    """CONFIG_INITIAL_DELTAS_PATH, checked against the clusters (`digest`), as a genome of
    CONFIG_DELTA_PHASES phases (a plain map in every phase); all zero when it is absent, as
    the cluster build then writes it (in the session's `begin`)."""
    path = config.initial_deltas_path
    if not path.exists():
        return {gene: 0.0 for gene in gene_ids(cluster_ids, config.delta_phases)}
    check_map_digest(path, digest, force=False, override=f"delete '{sidecar_path(path)}' to start from these "
                      "deltas anyway")
    return load_deltas(path, list(cluster_ids), config.delta_phases)


@contextlib.contextmanager
def open_run(config: Config, inputs: Inputs, strategy: Plugin) -> Iterator[tuple[Run, Checks, Callable[[], None]]]:
    """The run's services, and the checks beside them; on the way out, whatever the exit,
    the reflector's calls are abandoned, the thread pools stopped, the engine and the
    archive closed. Inside, the first Ctrl+C or SIGTERM stops the run, the later ones are
    ignored."""
    from compressor_2.clusters.tokens import AnswerTokens
    from compressor_2.engines import LazyEngine
    from compressor_2.reflector import make_reflector

    archive, identity = open_archive(config.output_dir, config,
                                     RunInputs(inputs.digest, inputs.examples, inputs.initial, inputs.model),
                                     inputs.context)
    workers, reflector, engine = Workers(), None, None
    try:
        with stop_on_first_signal():
            # A missing API key stops us here, before the model loads.
            tokens = AnswerTokens.from_config(config, inputs.clusters)
            reflector = make_reflector(config, inputs.clusters, recorder=archive.record_call, tokens=tokens)
            # Every prompt the run will send, the checks' too: checked before any work.
            engine = LazyEngine(config, inputs.clusters, inputs.prompts)
            yield services(config, inputs, archive, identity, reflector, engine, tokens, workers, strategy)
    finally:
        if reflector is not None:
            reflector.close()  # abandons the calls in flight, so that their threads end at once
        workers.stop()
        if engine is not None:
            engine.close()
        archive.close()


def services(config: Config, inputs: Inputs, archive: RunArchive, identity: dict[str, str], reflector: Reflector,
             engine: LazyEngine, tokens: AnswerTokens, workers: Workers,
             strategy: Plugin) -> tuple[Run, Checks, Callable[[], None]]:
    """The run's services over the opened archive, reflector and engine, its checks, and
    the session's first writes (`begin`), which the driver makes once it has read and
    checked the run's files. Nothing is written here."""
    from compressor_2.judges import make_judge
    from compressor_2.steering.generate import write_processor

    ids = gene_ids(inputs.clusters.cluster_ids, config.delta_phases)
    judge = make_judge(config)
    # The search's and the checks' evaluators differ only in where answers are kept.
    evaluator_on = functools.partial(Evaluator, engine, judge, inputs.examples, config.lambda_shortness,
                                     config.lambda_correctness, config.shortness_scale, context=inputs.context,
                                     reuse=config.temperature == 0)
    checks = Checks(evaluator_on(store=CheckStore(archive)), archive, inputs.examples, inputs.heldout, len(ids),
                    simpler_options(config, ids, tokens), Oracle(tokens, judge, config.judge))
    budget = Budget(Limits.from_config(config), archive)
    if warning := shortfall(budget.limits, budget.spent(), strategy.estimate(config, len(inputs.examples))):
        say(f"warning: {warning}")
    # Over the run's clusters, loaded once; BestEver says what changed, so the processor's
    # own line goes unsaid.
    best = BestEver(config.output_dir, functools.partial(write_processor, inputs.clusters, model_path=config.model_path),
                    map_digest=inputs.digest)
    run = Run(config=config, cluster_ids=ids, examples=inputs.examples, archive=archive,
              evaluator=evaluator_on(store=archive), reflector=reflector,
              pool=workers.pool(config.reflector_concurrency, "reflector"), budget=budget, best=best,
              workers=workers, answer_tokens=tokens, initial=inputs.initial, heldout=inputs.heldout)

    def begin() -> None:
        """What the cluster build still owed, the temp files of a killed writer removed, this
        start's identity and answer context recorded (`show` reads the run's answers under
        it), the answers the outputs read made again where the archive lost them; then, when
        the search starts from other deltas than the baseline's or the best must be as correct
        as it, the baseline measured apart, before the budget's clock starts."""
        for write in inputs.owed:
            write()
        _remove_orphans(config.output_dir)
        archive.set_meta({**identity, "context": inputs.context})
        checks.restore_lost()
        if any(inputs.initial.values()):
            checks.measure_baseline()
        if config.best_rule == "shortest":
            best.floor = floor(archive, checks)
        budget.start()

    return run, checks, begin


def floor(archive: RunArchive, checks: Checks) -> float:
    """The correctness a best must reach under CONFIG_BEST_SHORTEST: the unsteered baseline's
    on the pool, recorded at the run's first start (a resume keeps it)."""
    if (recorded := archive.meta(BEST_FLOOR)) is None:
        correctness = checks.baseline_correctness()
        archive.set_meta({BEST_FLOOR: repr(correctness)})
        return correctness
    return float(recorded)


def close(run: Run, checks: Checks, reason: str) -> None:
    """After the search, outside its budget (nothing it drew or decided changes): the
    held-out check and the simpler tools, then the run's last lines."""
    try:
        checked = checks.after_search()
    except KeyboardInterrupt:
        with contextlib.suppress(Exception), signals_ignored():
            say("the checks after the search (held-out, simpler tools) were interrupted: rerun the same command to "
                "finish them (the answers they made are cached)")
            run.refresh_outputs()
        raise
    report = run.refresh_outputs()
    say(f"the front and the report: {run.out / FRONT_PLOT}, {report}")
    say(final_line(reason, run.best))
    for line in checks.closing_lines(checked):
        say(line)


def final_line(reason: str, best: BestEver) -> str:
    what = "done" if reason.startswith("all ") else "stopped"
    if best.member is None:
        return f"{what}: {reason}; nothing evaluated yet"
    return (f"{what}: {reason}; best fitness {best.fitness:.4f} (candidate {best.member.candidate_id}); "
            f"{best.output_dir / DELTAS_BEST} and {best.output_dir / PROCESSOR_BEST} hold the best deltas")


def answer_settings(config: Config, build_digest: str) -> dict[str, Any]:
    """Everything besides the genome and the example that changes an answer or its verdict;
    the prompt template and evidence cap are in each example's key. The answer phases only
    when there are several, so that a one-phase run keeps the context it always had."""
    settings: dict[str, Any] = {
        "model": config.model_path, "engine": config.engine, "clusters": build_digest,
        "max_new_tokens": config.max_new_tokens, "temperature": config.temperature,
        "judge": config.judge, "tolerance": config.correctness_tolerance,
        "judge_model": config.judge_model if config.judge != "numeric" else "",
    }
    return settings if config.delta_phases == 1 else {**settings, "delta_phases": config.delta_phases}


def open_archive(out: Path, config: Config, inputs: RunInputs, context: str) -> tuple[RunArchive, dict[str, str]]:
    """The run archive, its identity compared on a resume, and the meta rows that record
    this start's (written by the session's `begin`)."""
    archive = RunArchive.open(out / ARCHIVE_FILE)
    try:
        return archive, check_identity(archive, config, inputs, context)
    except BaseException:
        archive.close()
        raise


def _refuse_changed_settings(out: Path, config: Config, inputs: RunInputs) -> str | None:
    """A resume's settings compared with the run's before anything is written or rebuilt
    (opening an existing archive writes nothing to it); returns the answer context the run
    keeps (`recorded_context`), None for a run that starts afresh."""
    if not (out / ARCHIVE_FILE).exists():
        return None
    archive = RunArchive.open(out / ARCHIVE_FILE)
    try:
        check_settings(archive, config, inputs)
        return recorded_context(archive)
    finally:
        archive.close()


def _remove_orphans(out: Path) -> None:
    """What writers killed mid-write (kill -9) left in the run's directories; the run lock
    keeps every other evolve out of them meanwhile."""
    removed = [path for directory in (out, out / PROMPT_DIR) for path in remove_orphans(directory)]
    if removed:
        say(f"removed {len(removed)} temp file(s) a killed run had left in {out}")


def _refuse_pre_archive_directory(out: Path) -> None:
    if (out / ARCHIVE_FILE).exists():
        return
    old = [name for name in PRE_ARCHIVE_FILES if (out / name).exists()]
    if old:
        raise ConfigError(f"'{out}' holds a run of a compressor_2 without the run archive ({', '.join(old)}, "
                          f"no {ARCHIVE_FILE}): finish it with the version that started it, or move the directory "
                          "away (or choose another CONFIG_OUTPUT_DIR) to start a fresh run")

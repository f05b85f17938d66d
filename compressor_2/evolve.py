"""`python -m compressor_2 evolve`: the run's services composed, and the strategy that uses them.

`evolve` locks the run directory, opens the run archive (recording the run's identity at
its start, comparing it on a resume: see run/identity.py), builds the evaluator (answers
cached in the archive), the reflector (every call recorded in it), the budget and the
best-ever tracker, warns when the budget cannot pay for three steps, and hands them to
the strategy named by CONFIG_STRATEGY. The strategy returns why it stopped; that reason
goes to the archive's events and onto the final line. A run whose reflector answered and
never validly is a failure (exit 1), whatever stopped it. Then, outside the search and its
budget, the held-out check (CONFIG_HOLDOUT_*) measures the best, the front and the
unsteered baseline, and the simpler tools (CONFIG_COMPARE_SIMPLE) are measured around it;
the run ends with their lines. A Ctrl+C skips them (the next run of the same command
makes them, from the cache where it can).

Whatever the exit (done, a budget, Ctrl+C, a failure), the reflector abandons its calls in
flight first, and then every thread pool of the run is stopped: `evolve` returns within
moments and leaves no thread of its own behind.
"""

from __future__ import annotations

import contextlib
import functools
import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compressor_2.archive.database import ARCHIVE_FILE, CheckStore, RunArchive
from compressor_2.atomic import remove_orphans
from compressor_2.config import Config
from compressor_2.deltas import check_fingerprint, fingerprint_path, load_deltas
from compressor_2.errors import ConfigError, RunError
from compressor_2.fitness import Evaluator, answer_context
from compressor_2.interrupts import signals_ignored, stop_on_first_signal
from compressor_2.reflector.prompt_log import PROMPT_DIR
from compressor_2.run.best import DELTAS_BEST, PROCESSOR_BEST, BestEver
from compressor_2.run.budget import Budget, Limits, shortfall
from compressor_2.run.checks import Checks
from compressor_2.run.identity import RunInputs, check_identity
from compressor_2.run.lock import run_lock
from compressor_2.run.plots import FRONT_PLOT
from compressor_2.run.progress import CallWatch, say
from compressor_2.run.services import Run
from compressor_2.run.simpler import instructed_examples, simpler_options
from compressor_2.run.workers import Workers
from compressor_2.run_directory import check_cluster_outputs, check_output_dir
from compressor_2.strategies import load_strategy

# Files a run directory of an earlier compressor_2 (before the archive) holds.
PRE_ARCHIVE_FILES = ("evolution_state.json", "history.json")


def evolve(config: Config) -> None:
    from compressor_2.clusters.build import build_clusters
    from compressor_2.clusters.clusterset import cluster_map_digest
    from compressor_2.clusters.tokens import AnswerTokens
    from compressor_2.data.financebench import examples_from_config, holdout_examples
    from compressor_2.engines.registry import LazyEngine
    from compressor_2.judges.registry import make_judge
    from compressor_2.reflector.registry import make_reflector
    from compressor_2.steering.generate import generate_processor

    out = config.output_dir
    strategy = load_strategy(config.strategy)
    check_output_dir(out)
    check_cluster_outputs(config)
    with run_lock(out):
        _remove_orphans(out)
        _refuse_pre_archive_directory(out)
        clusters = build_clusters(config)
        ids = list(clusters.cluster_ids)
        digest = cluster_map_digest(clusters)
        sidecar = fingerprint_path(config.initial_deltas_path)
        check_fingerprint(config.initial_deltas_path, digest, force=False,
                          override=f"delete '{sidecar}' to start from these deltas anyway")
        examples = tuple(examples_from_config(config))
        heldout = tuple(holdout_examples(config, examples))
        initial = load_deltas(config.initial_deltas_path, ids)
        context = answer_context(answer_settings(config, clusters.fingerprint))
        archive = open_archive(out, config, RunInputs(digest, examples, initial), context)
        workers = Workers()
        reflector, engine, budget, run, stopped = None, None, None, None, False
        try:
            with stop_on_first_signal():
                # A missing API key stops us here, before the model loads.
                tokens = AnswerTokens.from_config(config, clusters)
                reflector = make_reflector(config, clusters, recorder=archive.record_call, tokens=tokens)
                # Every prompt the run will send, the checks' too: checked before any work.
                prompts = (*examples, *heldout, *instructed_examples(config, (*examples, *heldout)))
                engine = LazyEngine(config, clusters, {e.id: e.prompt for e in prompts})
                archive.set_meta({"context": context})  # `show` reads this run's answers under it
                judge = make_judge(config)
                # The search's and the checks' evaluators differ only in where answers are kept.
                evaluator_on = functools.partial(Evaluator, engine, judge, examples, config.lambda_shortness,
                                                 config.lambda_correctness, config.shortness_scale, context=context,
                                                 reuse=config.temperature == 0)
                evaluator = evaluator_on(store=archive)
                checks = Checks(evaluator_on(store=CheckStore(archive)), archive, examples, heldout, len(ids),
                                simpler_options(config, ids, tokens))
                if any(initial.values()):
                    # The search starts from other deltas than the baseline's: measure the
                    # baseline apart, before the budget's clock starts.
                    checks.measure_baseline()
                budget = Budget(Limits.from_config(config), archive)
                warning = shortfall(budget.limits, budget.spent(), strategy.estimate(config, len(examples)))
                if warning:
                    say(f"warning: {warning}")
                best = BestEver(out, ids, lambda d, o: quietly(generate_processor, config, deltas_path=d, out=o),
                                cluster_fingerprint=digest)
                run = Run(config, ids, examples, archive, evaluator, reflector,
                          workers.pool(config.reflector_concurrency, "reflector"), budget, best, time.perf_counter(),
                          workers, tokens, heldout)
                archive.event("start", strategy=config.strategy, metric_calls=archive.metric_calls())
                with CallWatch(reflector):
                    reason = strategy.run(run)
                run.report_invalid_replies()  # the last step's
                budget.checkpoint()
                archive.event("stop", reason=reason)
                if failure := run.nothing_evolved():
                    raise RunError(failure)
                stopped = True
                # After the search, outside its budget: nothing it drew or decided changes.
                checked = checks.after_search()
                report = run.refresh()
            say(f"the front and the report: {out / FRONT_PLOT}, {report}")
            say(final_line(reason, best))
            for line in checks.closing_lines(checked):
                say(line)
        except (KeyboardInterrupt, RunError) as exc:
            with contextlib.suppress(Exception), signals_ignored():
                if budget is not None and not stopped:
                    budget.checkpoint()
                if stopped:
                    # The search had stopped (and said so in the archive): only the check failed.
                    if isinstance(exc, KeyboardInterrupt):
                        say("the checks after the search (held-out, simpler tools) were interrupted: rerun the "
                            "same command to finish them (the answers they made are cached)")
                elif isinstance(exc, KeyboardInterrupt):
                    archive.event("interrupted")
                else:
                    archive.event("failed", error=str(exc))
                if run is not None:
                    run.refresh()
            raise
        finally:
            if reflector is not None:
                reflector.close()  # abandons the calls in flight, so that their threads end at once
            workers.stop()
            if engine is not None:
                engine.close()
            archive.close()


def final_line(reason: str, best: BestEver) -> str:
    what = "done" if reason.startswith("all ") else "stopped"
    if best.member is None:
        return f"{what}: {reason}; nothing evaluated yet"
    return (f"{what}: {reason}; best fitness {best.fitness:.4f} (candidate {best.member.candidate_id}); "
            f"{best.output_dir / DELTAS_BEST} and {best.output_dir / PROCESSOR_BEST} hold the best deltas")


def answer_settings(config: Config, cluster_fingerprint: str) -> dict[str, Any]:
    """Everything besides the genome and the example that changes an answer or its verdict;
    the prompt template and evidence cap are in each example's key."""
    return {
        "model": config.model_path, "engine": config.engine, "clusters": cluster_fingerprint,
        "max_new_tokens": config.max_new_tokens, "temperature": config.temperature,
        "judge": config.judge, "tolerance": config.correctness_tolerance,
        "judge_model": config.judge_model if config.judge != "numeric" else "",
    }


def open_archive(out: Path, config: Config, inputs: RunInputs, context: str) -> RunArchive:
    """The run archive, its identity recorded at the run's start and compared on a resume."""
    archive = RunArchive.open(out / ARCHIVE_FILE)
    try:
        check_identity(archive, config, inputs, context)
    except BaseException:
        archive.close()
        raise
    return archive


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
                          f"no {ARCHIVE_FILE}): finish it with the version that started it, or move the "
                          "directory away (or choose another CONFIG_OUTPUT_DIR) to start a fresh run")


def quietly(fn: Callable[..., None], *args: Any, **kwargs: Any) -> None:
    """Runs `fn` without its own report lines: BestEver says what changed, once."""
    with contextlib.redirect_stdout(io.StringIO()):
        fn(*args, **kwargs)

"""`python -m compressor_2 evolve`: the run's services composed, and the strategy that uses them.

`evolve` locks the run directory, opens the run archive, builds the evaluator (answers
cached in the archive), the reflector (every call recorded in it), the budget and the
best-ever tracker, warns when the budget cannot pay for three steps, and hands them to
the strategy named by CONFIG_STRATEGY. The strategy returns why it stopped; that reason
goes to the archive's events and onto the last line printed.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from compressor_2.archive.database import ARCHIVE_FILE, RunArchive
from compressor_2.atomic import remove_orphans
from compressor_2.config import Config
from compressor_2.errors import ConfigError, RunError
from compressor_2.fitness import Evaluator, answer_context
from compressor_2.interrupts import signals_ignored, stop_on_first_signal
from compressor_2.reflector.prompt_log import PROMPT_DIR
from compressor_2.run.best import DELTAS_BEST, PROCESSOR_BEST, BestEver
from compressor_2.run.budget import Budget, Limits, shortfall
from compressor_2.run.lock import run_lock
from compressor_2.run.progress import say
from compressor_2.run.services import Run
from compressor_2.run_directory import check_output_dir
from compressor_2.strategies import load_strategy

# Files a run directory of an earlier compressor_2 (before the archive) holds.
PRE_ARCHIVE_FILES = ("evolution_state.json", "history.json")


def evolve(config: Config) -> None:
    from compressor_2.clusters.build import build_clusters
    from compressor_2.clusters.clusterset import cluster_map_digest
    from compressor_2.data.financebench import examples_from_config
    from compressor_2.engines.registry import LazyEngine
    from compressor_2.judges.registry import make_judge
    from compressor_2.reflector.registry import make_reflector
    from compressor_2.steering.generate import generate_processor

    out = config.output_dir
    strategy = load_strategy(config.strategy)
    check_output_dir(out)
    with run_lock(out):
        _remove_orphans(out)
        _refuse_pre_archive_directory(out)
        clusters = build_clusters(config)
        ids = list(clusters.cluster_ids)
        examples = tuple(examples_from_config(config))
        archive = open_archive(out, config.strategy)
        pool = ThreadPoolExecutor(config.reflector_concurrency, thread_name_prefix="reflector")
        reflector, engine, budget = None, None, None
        try:
            with stop_on_first_signal():
                # A missing API key stops us here, before the model loads.
                reflector = make_reflector(config, clusters, recorder=archive.record_call)
                engine = LazyEngine(config, clusters)
                context = answer_context(answer_settings(config, clusters.fingerprint))
                archive.set_meta({"context": context})  # `show` reads this run's answers under it
                evaluator = Evaluator(engine, make_judge(config), examples, config.lambda_shortness,
                                      config.lambda_correctness, config.shortness_scale, store=archive,
                                      context=context, reuse=config.temperature == 0)
                budget = Budget(Limits.from_config(config), archive)
                warning = shortfall(budget.limits, budget.spent(), strategy.estimate(config, len(examples)))
                if warning:
                    say(f"warning: {warning}")
                best = BestEver(out, ids, lambda d, o: quietly(generate_processor, config, deltas_path=d, out=o),
                                cluster_fingerprint=cluster_map_digest(clusters))
                run = Run(config, ids, examples, archive, evaluator, reflector, pool, budget, best,
                          time.perf_counter(), clusters)
                archive.event("start", strategy=config.strategy, metric_calls=archive.metric_calls())
                reason = strategy.run(run)
                budget.checkpoint()
                archive.event("stop", reason=reason)
            say(final_line(reason, best))
        except (KeyboardInterrupt, RunError) as exc:
            with contextlib.suppress(Exception), signals_ignored():
                if budget is not None:
                    budget.checkpoint()
                if isinstance(exc, KeyboardInterrupt):
                    archive.event("interrupted")
                else:
                    archive.event("failed", error=str(exc))
            raise
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            if reflector is not None:
                reflector.close()
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


def open_archive(out: Path, strategy: str) -> RunArchive:
    archive = RunArchive.open(out / ARCHIVE_FILE)
    recorded = archive.meta("strategy")
    if recorded is None:
        archive.set_meta({"strategy": strategy})
    elif recorded != strategy:
        archive.close()
        raise ConfigError(f"'{out / ARCHIVE_FILE}' holds a run of strategy {recorded!r}, not "
                          f"CONFIG_STRATEGY={strategy!r}: choose another CONFIG_OUTPUT_DIR for a new run")
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

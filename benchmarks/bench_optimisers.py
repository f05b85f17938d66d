"""Which strategy should a user run? Every strategy on the same config at the same budget.

For each cluster count and seed, every strategy runs `evolve` on the same config
(default: the repository's `defconfig`, the embedded demo) with CONFIG_MAX_METRIC_CALLS
as the only stop, CONFIG_SEED and CONFIG_CLUSTER_SEED set to the seed, and clusters
built once per (cluster count, seed) and shared by the strategies. Per run it records:
- the anytime curve: the training fitness of the strategy's incumbent (its own best so
  far) against the metric calls spent. GEPA ranks its candidates on its valset; its
  incumbents are evaluated on the whole training pool afterwards, outside its budget;
- the area under that curve, as the mean incumbent fitness over [0, budget];
- the metric calls needed to reach 95% of the best improvement over the initial deltas
  that any strategy reached on that seed and cluster count;
- the final best: the incumbent once the budget is spent. A run stops inside the step in
  which it reaches the budget, before that step's next fresh answers, so it may overshoot
  by the one evaluation that crossed it; what it found after the budget does not count
  here;
- that incumbent's held-out mean tokens and correctness (`evaluate` on `--heldout`);
- reflector tokens and wall time.
Writes `results.json` (every run) and `anytime.png` (mean and spread of the curves per
strategy, one panel per cluster count) to `--out`, and prints a table of means over
seeds with their spread. A run whose directory already holds `result.json` is read,
not repeated, so an interrupted benchmark continues.

    .venv/bin/python benchmarks/bench_optimisers.py            # the full run (~30 min, 2 cores)
    .venv/bin/python benchmarks/bench_optimisers.py --quick    # one seed, one cluster count, a small budget
    .venv/bin/python benchmarks/bench_optimisers.py --config my.config --heldout my_heldout.jsonl \\
        --clusters 64 --seeds 3 --budget 20000 --workers 1     # your model, your GPU
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import multiprocessing
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Each strategy as the Kconfig symbols that select it; every other option is the config's.
# The step counts are set out of reach so that the metric-call budget is the only stop.
STRATEGIES: dict[str, dict[str, str]] = {
    "ga": {"STRATEGY_GA": "y", "NGEN": "100000"},
    "ga-llm-selection": {"STRATEGY_GA": "y", "NGEN": "100000", "SELECTION": '"llm"',
                         "SELECTION_FALLBACK": '"tournament"', "TOURNAMENT_SIZE": "3"},
    "ga-vector-mutation": {"STRATEGY_GA": "y", "NGEN": "100000", "MUTATION_SCOPE": '"vector"'},
    "archive": {"STRATEGY_ARCHIVE": "y", "ARCHIVE_ITERATIONS": "100000"},
    "gepa": {"STRATEGY_GEPA": "y"},
    "random": {"STRATEGY_RANDOM": "y", "RANDOM_BATCHES": "100000"},
    "cmaes": {"STRATEGY_CMAES": "y", "CMAES_GENERATIONS": "100000"},
}
DEFAULT_HELDOUT = REPO / "compressor_2" / "demo" / "data" / "heldout.jsonl"
REACH = 0.95


def write_config(base: Path, path: Path, symbols: dict[str, str]) -> Path:
    """`base` with `symbols` (raw Kconfig values by name without CONFIG_) replacing or
    added to its lines; the strategy choice's other entries are dropped."""
    names = {f"CONFIG_{name}" for name in symbols}
    kept = [line for line in base.read_text(encoding="utf-8").splitlines()
            if line.split("=", 1)[0] not in names and not line.startswith("CONFIG_STRATEGY_")]
    path.write_text("\n".join([*kept, *(f"CONFIG_{k}={v}" for k, v in symbols.items())]) + "\n", encoding="utf-8")
    return path


def run_one(base: Path, heldout: Path, out: Path, strategy: str, clusters: int, seed: int, budget: int) -> dict[str, Any]:
    """One `evolve` to the budget, then its curve and the best's held-out quality."""
    from compressor_2.cli import main as cli
    from compressor_2.commands.evolve import evolve
    from compressor_2.config import load_config

    done = out / "result.json"
    if done.exists():
        return json.loads(done.read_text(encoding="utf-8"))
    out.mkdir(parents=True, exist_ok=True)
    shared = out.parent.parent / f"clusters-k{clusters}-seed{seed}"
    symbols = {**STRATEGIES[strategy], "MAX_METRIC_CALLS": str(budget), "SEED": str(seed),
               "CLUSTER_SEED": str(seed), "NUM_CLUSTERS": str(clusters), "OUTPUT_DIR": f'"{out / "run"}"',
               "CLUSTER_DIR": f'"{shared}"', "CLUSTER_DESCRIPTIONS_PATH": f'"{shared / "cluster_descriptions.json"}"',
               "INITIAL_DELTAS_PATH": f'"{shared / "initial_deltas.json"}"'}
    config_path = write_config(base, out / "bench.config", symbols)
    config = load_config(config_path)
    with open(out / "evolve.log", "a", encoding="utf-8") as log, contextlib.redirect_stdout(log), \
            contextlib.redirect_stderr(log):
        evolve(config)
        curve = anytime_curve(config)
        final = incumbent_at(curve, budget)
        (out / "incumbent.json").write_text(json.dumps(final[2]), encoding="utf-8")
        code = cli(["evaluate", "--config", str(config_path), "--data", str(heldout), "--deltas",
                    str(out / "incumbent.json"), "--out", str(out / "heldout.json")])
    if code != 0:
        raise RuntimeError(f"evaluate failed for {out}; see {out / 'evolve.log'}")
    summary = json.loads((out / "heldout.json").read_text(encoding="utf-8"))["summary"]
    result = {"strategy": strategy, "clusters": clusters, "seed": seed, "budget": budget,
              "curve": [point[:2] for point in curve], "final_best": final[1], "heldout_tokens": summary["mean_tokens"],
              "heldout_correctness": summary["correctness"], **reflector_tokens_and_wall(config)}
    done.write_text(json.dumps(result), encoding="utf-8")
    return result


def anytime_curve(config: Any) -> list[tuple[int, float, dict[str, float]]]:
    """(metric calls spent, incumbent training fitness, its deltas) at every change of incumbent.

    A candidate's metric calls are the answers stored up to its creation. The incumbent
    is the strategy's own best so far (GEPA's by valset score); its training fitness is
    its fitness on the whole pool, which GEPA's incumbents get here, from the cache
    where the answers exist."""
    from compressor_2.archive import RunArchive
    from compressor_2.clusters.builder import build_clusters
    from compressor_2.commands.evolve import answer_settings
    from compressor_2.data import examples_from_config
    from compressor_2.deltas import to_list
    from compressor_2.engines import LazyEngine
    from compressor_2.fitness import Evaluator, answer_context
    from compressor_2.judges import make_judge

    archive = RunArchive.open(config.output_dir / "run.sqlite")
    try:
        stamps = archive.answer_times()
        incumbents, best = [], None
        for c in archive.assessed():
            if best is None or c.fitness > best.fitness:
                best = c
                incumbents.append((bisect.bisect_right(stamps, c.created), c))
        if config.strategy != "gepa":
            return [(calls, c.fitness, dict(c.deltas)) for calls, c in incumbents]
        clusters = build_clusters(config)
        engine = LazyEngine(config, clusters)
        try:
            evaluator = Evaluator(engine, make_judge(config), examples_from_config(config), config.lambda_shortness,
                                  config.lambda_correctness, config.shortness_scale, store=archive,
                                  context=answer_context(answer_settings(config, clusters.build_digest)))
            fitness = [e.fitness for e in evaluator.evaluate([to_list(c.deltas) for _, c in incumbents])]
        finally:
            engine.close()
        return [(calls, f, dict(c.deltas)) for (calls, c), f in zip(incumbents, fitness)]
    finally:
        archive.close()


def reflector_tokens_and_wall(config: Any) -> dict[str, float]:
    """The run's reflector tokens and its wall time summed over its sessions (a resumed
    run's included), from its archive."""
    from compressor_2.archive import RunArchive

    archive = RunArchive.open_read_only(config.output_dir / "run.sqlite")
    try:
        _, prompt, completion = archive.reflector_tokens()
        return {"reflector_tokens": prompt + completion, "wall_seconds": float(archive.meta("wall_seconds", "0") or 0)}
    finally:
        archive.close()


def incumbent_at(curve: list[tuple[int, float, dict[str, float]]], calls: int) -> tuple[int, float, dict[str, float]]:
    """The incumbent once `calls` metric calls were spent (the first one if none was yet)."""
    within = [point for point in curve if point[0] <= calls]
    return within[-1] if within else curve[0]


def value_at(curve: list[list[float]], calls: float) -> float | None:
    """The incumbent's fitness once `calls` metric calls were spent (None before the first)."""
    value = None
    for spent, fitness in curve:
        if spent > calls:
            break
        value = fitness
    return value


def area(curve: list[list[float]], budget: int) -> float:
    """The mean incumbent fitness over [first point, budget]: the area under the curve."""
    start = curve[0][0]
    points = [*(p for p in curve if p[0] < budget), [budget, None]]
    total = sum((b[0] - a[0]) * a[1] for a, b in zip(points, points[1:]))
    return total / max(1, budget - start)


def calls_to_reach(curve: list[list[float]], target: float, budget: int) -> float | None:
    return next((spent for spent, fitness in curve if fitness >= target - 1e-12 and spent <= budget), None)


def summarise(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per run: AUC and calls to reach 95% of the seed's best improvement (any strategy)."""
    for r in results:
        r["auc"] = area(r["curve"], r["budget"])
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["clusters"], r["seed"]), []).append(r)
    for group in groups.values():
        start = min(r["curve"][0][1] for r in group)
        best = max(r["final_best"] for r in group)
        for r in group:
            r["calls_to_95"] = calls_to_reach(r["curve"], start + REACH * (best - start), r["budget"])
    return results


def table(results: list[dict[str, Any]]) -> str:
    def spread(values: list[float], fmt: str) -> str:
        if not values:
            return "-"
        mean = statistics.fmean(values)
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{mean:{fmt}} ± {sd:{fmt}}"

    lines = [f"{'clusters':>8}  {'strategy':<20} {'final best':>17} {'AUC':>17} {'calls to 95%':>16} "
             f"{'held-out tokens':>15} {'held-out correct':>17} {'reached':>7} {'wall s':>7}"]
    for clusters in sorted({r["clusters"] for r in results}):
        for strategy in STRATEGIES:
            runs = [r for r in results if r["clusters"] == clusters and r["strategy"] == strategy]
            if not runs:
                continue
            reached = [r["calls_to_95"] for r in runs if r["calls_to_95"] is not None]
            lines.append(
                f"{clusters:>8}  {strategy:<20} {spread([r['final_best'] for r in runs], '.4f'):>17} "
                f"{spread([r['auc'] for r in runs], '.4f'):>17} {spread(reached, '.0f'):>16} "
                f"{spread([r['heldout_tokens'] for r in runs], '.1f'):>15} "
                f"{spread([100 * r['heldout_correctness'] for r in runs], '.1f'):>17} "
                f"{len(reached)}/{len(runs):<5} {statistics.fmean(r['wall_seconds'] for r in runs):>7.0f}")
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    counts = sorted({r["clusters"] for r in results})
    fig, axes = plt.subplots(1, len(counts), figsize=(6.5 * len(counts), 4.5), squeeze=False, sharey=True)
    for ax, clusters in zip(axes[0], counts):
        for strategy in STRATEGIES:
            runs = [r for r in results if r["clusters"] == clusters and r["strategy"] == strategy]
            if not runs:
                continue
            budget = runs[0]["budget"]
            grid = np.linspace(max(r["curve"][0][0] for r in runs), budget, 200)
            curves = np.array([[value_at(r["curve"], x) or np.nan for x in grid] for r in runs], dtype=float)
            mean = np.nanmean(curves, axis=0)
            line, = ax.plot(grid, mean, label=strategy)
            if len(runs) > 1:
                ax.fill_between(grid, np.nanmin(curves, axis=0), np.nanmax(curves, axis=0), alpha=0.12,
                                color=line.get_color())
        ax.set_title(f"{clusters} k-means clusters ({len(runs)} seeds: mean, min..max)")
        ax.set_xlabel("metric calls (fresh answers)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("training fitness of the incumbent")
    axes[0][-1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "defconfig")
    parser.add_argument("--heldout", type=Path, default=DEFAULT_HELDOUT, help="questions for the best's check")
    parser.add_argument("--clusters", default="10,40", help="k-means cluster counts, comma-separated")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget", type=int, default=3000, help="CONFIG_MAX_METRIC_CALLS of every run")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--workers", type=int, default=2, help="runs at once (one CPU thread each on the demo)")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "bench_optimisers")
    parser.add_argument("--quick", action="store_true", help="1 seed, 10 clusters, budget 640: a few minutes")
    args = parser.parse_args(argv)
    if args.quick:
        args.clusters, args.seeds, args.budget = "10", 1, 640
        args.out = args.out.with_name(args.out.name + "_quick")
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        print(f"error: unknown strategies {', '.join(unknown)}; choose from {', '.join(STRATEGIES)}", file=sys.stderr)
        return 2
    for name, path in (("--config", args.config), ("--heldout", args.heldout)):
        if not path.is_file():
            print(f"error: {name} {path} is not a file", file=sys.stderr)
            return 2
    try:
        counts = [int(c) for c in args.clusters.split(",")]
    except ValueError:
        print(f"error: --clusters {args.clusters!r} must be comma-separated integers, e.g. 10,40", file=sys.stderr)
        return 2
    jobs = [(args.config.resolve(), args.heldout.resolve(), args.out.resolve() / f"k{k}-seed{seed}" / strategy,
             strategy, k, seed, args.budget) for k in counts for seed in range(args.seeds) for strategy in strategies]
    print(f"{len(jobs)} runs ({len(strategies)} strategies x {len(counts)} cluster counts x {args.seeds} seeds) at "
          f"{args.budget} metric calls each, {args.workers} at a time; logs under {args.out}")
    # The first run of each (cluster count, seed) builds its clusters alone; the others
    # then share them, `workers` at a time.
    firsts: dict[tuple[int, int], tuple[Any, ...]] = {}
    for job in jobs:
        firsts.setdefault((job[4], job[5]), job)
    for job in firsts.values():
        _report(run_one(*job))
    # Spawned, not forked: this process has torch's threads running by now.
    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for result in pool.map(_run_job, [job for job in jobs if job not in firsts.values()]):
            _report(result)
    results = summarise([run_one(*job) for job in jobs])  # each read back from its result.json
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    plot(results, args.out / "anytime.png")
    print(table(results))
    print(f"written: {args.out / 'results.json'}, {args.out / 'anytime.png'}")
    return 0


def _run_job(job: tuple[Any, ...]) -> dict[str, Any]:
    return run_one(*job)


def _report(result: dict[str, Any]) -> None:
    print(f"  k={result['clusters']:<3} seed {result['seed']}  {result['strategy']:<20} best {result['final_best']:.4f}"
          f"  held-out {result['heldout_tokens']:.1f} tokens, {100 * result['heldout_correctness']:.1f}% correct"
          f"  {result['wall_seconds']:.0f}s", flush=True)


if __name__ == "__main__":
    sys.exit(main())

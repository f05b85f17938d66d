"""The run archive's cost: its share of a defconfig run's wall time, its two hot
operations timed directly, and what drawing the run from it costs as it grows.

1. `evolve` in this process on the repository's `defconfig` (the shipped demo model,
   population 8, 60 training examples, the local reflector), shortened to
   CONFIG_NGEN=4 and writing to a temporary CONFIG_OUTPUT_DIR; the clusters are built
   in (or reused from) outputs/clusters as `make run` does. `RunArchive.seconds` adds up
   the time spent inside the archive's methods (every transaction and query; not the
   wait for its lock, which is another thread's time inside it, already counted);
   `RunArchive.open` is wrapped here to keep the run's instance and to add the time of
   opening and closing the file (schema, WAL checkpoint). Target: the archive takes at
   most 2% of the run's wall time (exit code 1 above).
2. On a scratch database, one generation's worth of answers at a time (8 genomes x 60
   examples, answers of the demo's length): `store` of the 480 fresh answers in one
   transaction, and the `cached` look-up of the same 8 genomes x 60 examples, per
   call, as the table grows to 50 generations (24,000 rows): median and slowest.

3. What the run shows (tree.json and evolution_tree.png, the fitness and lengths plots,
   front.png, report.html) drawn once from archives of 1,000, 10,000 and 100,000
   candidates in the GA's shape (per generation 7 offspring and 5 mutated children, the
   population of 8 placed), next to the defconfig run's mean generation: the share of a
   run's wall time drawing would take after every step, and the share on the run's clock
   (outputs/refresh.py: a drawing waits until the run has worked 1 / SHARE - 1 times as long
   as the last one took), with the share measured in the defconfig run of part 1.

Run: .venv/bin/python benchmarks/bench_archive.py [--sizes 1000,10000,100000]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from compressor_2.archive import ARCHIVE_FILE, Answer, Candidate, Placement, RunArchive, Spot, genome_key  # noqa: E402
from compressor_2.outputs import refresh as outputs  # noqa: E402

NGEN = 4
TARGET = 0.02
GENOMES, EXAMPLES, GENERATIONS = 8, 60, 50
CLUSTERS = 12  # the defconfig's cluster count


def defconfig_run(tmp: Path) -> tuple[float, float, float, int, int, float, float]:
    """(seconds inside the archive's methods, seconds opening and closing it, the run's
    wall seconds, evaluations rows, candidates, seconds drawing the run's outputs between
    steps and in all) of a shortened defconfig run."""
    from compressor_2.commands.evolve import evolve
    from compressor_2.config import load_config

    lines = [line for line in (REPO / "defconfig").read_text().splitlines()
             if not line.startswith(("CONFIG_NGEN=", "CONFIG_OUTPUT_DIR="))]
    config_path = tmp / "bench.config"
    config_path.write_text("\n".join([*lines, f"CONFIG_NGEN={NGEN}", f'CONFIG_OUTPUT_DIR="{tmp / "run"}"']) + "\n")

    opened: list[RunArchive] = []
    open_close = [0.0]
    original = RunArchive.open.__func__  # type: ignore[attr-defined]

    def keep(cls: type[RunArchive], path: Path) -> RunArchive:
        started = time.perf_counter()
        archive = original(cls, path)
        open_close[0] += time.perf_counter() - started
        opened.append(archive)
        close = archive.close

        def timed_close() -> None:
            started = time.perf_counter()
            close()
            open_close[0] += time.perf_counter() - started

        archive.close = timed_close  # type: ignore[method-assign]
        return archive

    drawing = [0.0, 0.0]  # between steps, in all
    draw, after_step = outputs.Refresh.draw, outputs.Refresh.after_step

    def timed(method: Any, slot: int) -> Any:
        def run(self: outputs.Refresh, history: list) -> Any:
            started = time.perf_counter()
            try:
                return method(self, history)
            finally:
                drawing[slot] += time.perf_counter() - started
        return run

    RunArchive.open = classmethod(keep)  # type: ignore[method-assign, assignment]
    outputs.Refresh.draw, outputs.Refresh.after_step = timed(draw, 1), timed(after_step, 0)  # type: ignore
    try:
        started = time.perf_counter()
        evolve(load_config(config_path))
        wall = time.perf_counter() - started
    finally:
        RunArchive.open = classmethod(original)  # type: ignore[method-assign, assignment]
        outputs.Refresh.draw, outputs.Refresh.after_step = draw, after_step  # type: ignore[method-assign]
    assert len(opened) == 1, f"expected one archive, the run opened {len(opened)}"
    check = RunArchive.open_read_only(tmp / "run" / ARCHIVE_FILE)
    rows, candidates = check.metric_calls(), len(check.candidates())
    check.close()
    return opened[0].seconds, open_close[0], wall, rows, candidates, drawing[0], drawing[1]


def hot_operations(tmp: Path) -> tuple[list[float], list[float]]:
    """Seconds per `store` and per `cached` call, one generation's answers each."""
    rng = random.Random(0)
    archive = RunArchive.open(tmp / "scratch.sqlite")
    context = "c" * 24
    examples = [f"demo-{i:04d}#{rng.getrandbits(64):016x}" for i in range(EXAMPLES)]
    stores, lookups = [], []
    for _ in range(GENERATIONS):
        genomes = [genome_key([round(rng.gauss(0, 1), 4) for _ in range(CLUSTERS)]) for _ in range(GENOMES)]
        answers = {(g, e): Answer("The revenue was $39,116 million in FY2022." * rng.randint(1, 3),
                                  rng.randint(5, 90), rng.random() < 0.8, "numeric: 39116 matches 39116")
                   for g in genomes for e in examples}
        started = time.perf_counter()
        archive.store(answers, context, cache_hits=0)
        stores.append(time.perf_counter() - started)
        started = time.perf_counter()
        found = archive.cached(genomes, examples, context)
        lookups.append(time.perf_counter() - started)
        assert len(found) == GENOMES * EXAMPLES
    archive.close()
    return stores, lookups


def grown_archive(path: Path, size: int) -> tuple[RunArchive, list[dict[str, float]]]:
    """An archive of `size` candidates in the GA's shape, and its history."""
    rng, archive = random.Random(0), RunArchive.open(path)
    history, population, g = [], [], 0
    while archive.last_candidate_id() < size:
        made = archive.add([Candidate({str(k): round(rng.gauss(0, 1), 4) for k in range(CLUSTERS)}, "",
                                      "mutation" if i >= 7 else "crossover", tuple(population[:2]), "ga", g,
                                      fitness=rng.uniform(0.8, 0.95), mean_tokens=rng.uniform(8, 35),
                                      correctness=rng.uniform(0.9, 1.0)) for i in range(12)])
        ids = [c.id or 0 for c in made]
        population = rng.sample(ids, 8)
        archive.place([*(Placement(c, Spot(g, "pre", j)) for j, c in enumerate(ids[:7])),
                       *(Placement(c, Spot(g, "mut", j)) for j, c in enumerate(ids[7:])),
                       *(Placement(c, Spot(g + 1, "pop", i)) for i, c in enumerate(population))], g)
        history.append({"generation": g, "best_fitness": 0.95, "mean_fitness": 0.9, "best_ever_fitness": 0.95,
                        "mean_tokens": 20.0, "best_mean_tokens": 9.0})
        g += 1
    return archive, history


def drawing_seconds(tmp: Path, size: int) -> float:
    """One drawing of everything the run shows from an archive of `size` candidates."""
    folder = tmp / f"grown_{size}"
    folder.mkdir()
    archive, history = grown_archive(folder / "run.sqlite", size)
    refresh = outputs.Refresh(archive, folder, [], [], None)
    refresh.draw(history)
    archive.close()
    return refresh.seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="archive sizes drawn in part 3")
    sizes = [int(n) for n in parser.parse_args().sizes.split(",")]
    os.chdir(REPO)  # the defconfig's paths are relative to the repository
    with tempfile.TemporaryDirectory(prefix="bench_archive_") as name:
        tmp = Path(name)
        stores, lookups = hot_operations(tmp)
        methods_s, open_close_s, wall_s, rows, candidates, between_s, drawn_s = defconfig_run(tmp)
        drawings = [drawing_seconds(tmp, size) for size in sizes]

    n = GENOMES * EXAMPLES
    print(f"\n1. defconfig, CONFIG_NGEN={NGEN} (population 8, 60 training examples), in process")
    print(f"   run wall time          {wall_s:8.2f} s  ({rows} answers generated, {candidates} candidates)")
    print(f"   inside its methods     {methods_s:8.3f} s  (RunArchive.seconds)")
    print(f"   opening and closing    {open_close_s:8.3f} s")
    share = (methods_s + open_close_s) / wall_s
    print(f"   RATIO archive / run: {share:.2%} (target at most {TARGET:.0%})")

    print(f"\n2. scratch database, {GENOMES} genomes x {EXAMPLES} examples = {n} answers a call, "
          f"{GENERATIONS} generations (up to {GENERATIONS * n:,} rows)")
    for label, times in (("store (one transaction)", stores), ("cached (look-up)", lookups)):
        median = statistics.median(times)
        print(f"   {label:<24} median {1e3 * median:6.2f} ms a call ({1e6 * median / n:5.1f} us an answer), "
              f"slowest {1e3 * max(times):6.2f} ms")

    step = wall_s / NGEN
    print(f"\n3. drawing what the run shows, against the defconfig's {step:.1f} s a generation")
    print(f"   {'candidates':>10}  {'one drawing':>11}  {'every step':>10}  {'on the clock':>12}")
    for size, drawing in zip(sizes, drawings):
        clocked = drawing / (drawing + max(step, drawing * (1 / outputs.SHARE - 1)))
        print(f"   {size:>10,}  {drawing:>9.2f} s  {drawing / (drawing + step):>10.1%}  {clocked:>12.2%}")
    print(f"   RATIO one drawing {sizes[-1]:,} / {sizes[0]:,} candidates: {drawings[-1] / drawings[0]:.1f}x")
    print(f"   measured in part 1's run of {wall_s:.1f} s: {between_s:.2f} s between steps ({between_s / wall_s:.2%}), "
          f"{drawn_s:.2f} s in all ({drawn_s / wall_s:.2%}: the drawing when the run stops included)")
    return 0 if share <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())

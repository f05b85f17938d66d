"""Does training fitness predict held-out quality on the embedded default?

1. `evolve` on the repository's `defconfig` (the shipped demo model, the local
   reflector), writing to `--out` (default: a temporary directory). A directory that
   already holds the finished run is resumed, which re-evaluates nothing.
2. Every distinct candidate the run evaluated, read from its archive, is evaluated on
   the held-out split (`compressor_2/demo/data/heldout.jsonl`) with the run's engine,
   judge and fitness.
3. Printed: the Spearman correlation between training fitness and held-out fitness
   (target >= 0.8), and the held-out correctness of the best training candidate next
   to that of the best held-out candidate (target: within 2 points). Exit code 1 when
   a target is missed.

Run: .venv/bin/python benchmarks/bench_generalisation.py [--out DIR]
(about 10 minutes on 2 cores: a defconfig run, then ~130 candidates x 200 questions; `--out outputs`
after `make run` resumes that run instead)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from compressor_2.archive import Candidate, RunArchive, genome_key  # noqa: E402
from compressor_2.config import Config, load_config  # noqa: E402
from compressor_2.fitness import Evaluation  # noqa: E402

MIN_RHO = 0.8
MAX_GAP_POINTS = 2.0


def defconfig(out: Path) -> Config:
    lines = [line for line in (REPO / "defconfig").read_text().splitlines()
             if not line.startswith("CONFIG_OUTPUT_DIR=")]
    path = out / "generalisation.config"
    path.write_text("\n".join([*lines, f'CONFIG_OUTPUT_DIR="{out / "run"}"']) + "\n")
    return load_config(path)


def distinct_candidates(archive: RunArchive) -> list[Candidate]:
    """One evaluated candidate per genome (the first): greedy answers make equal
    genomes equal in fitness."""
    seen: dict[str, Candidate] = {}
    for candidate in archive.candidates():
        if candidate.fitness is not None:
            seen.setdefault(genome_key(list(candidate.deltas.values())), candidate)
    return list(seen.values())


def held_out(config: Config, candidates: list[Candidate]) -> list[Evaluation]:
    from tqdm import tqdm

    from compressor_2.clusters.builder import build_clusters
    from compressor_2.data import examples_from_config
    from compressor_2.demo.task import DATA_DIR
    from compressor_2.engines import make_engine
    from compressor_2.fitness import Evaluator
    from compressor_2.judges import make_judge

    clusters = build_clusters(config)
    heldout = dataclasses.replace(config, financebench_jsonl_path=DATA_DIR / "heldout.jsonl", pool_indices="all")
    examples = examples_from_config(heldout)
    engine = make_engine(config, clusters)
    try:
        evaluator = Evaluator(engine, make_judge(config), examples, config.lambda_shortness,
                              config.lambda_correctness, config.shortness_scale)
        genomes = [list(c.deltas.values()) for c in candidates]
        with tqdm(total=len(genomes) * len(examples), desc="held-out", unit="answer") as bar:
            return evaluator.evaluate(genomes, progress=bar.update)
    finally:
        engine.close()


def main(argv: list[str] | None = None) -> int:
    from scipy.stats import spearmanr

    from compressor_2.commands.evolve import evolve

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="run directory to write or resume (default: temporary)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        out = (args.out or Path(scratch)).resolve()
        out.mkdir(parents=True, exist_ok=True)
        config = defconfig(out)
        evolve(config)
        archive = RunArchive.open_read_only(config.output_dir / "run.sqlite")
        try:
            candidates = distinct_candidates(archive)
        finally:
            archive.close()
        evaluations = held_out(config, candidates)

    train = [c.fitness for c in candidates]
    test = [e.fitness for e in evaluations]
    rho = float(spearmanr(train, test).statistic)
    best_train = max(range(len(candidates)), key=lambda i: (train[i], -i))
    best_test = max(range(len(candidates)), key=lambda i: (test[i], -i))
    gap = 100 * (evaluations[best_test].correctness - evaluations[best_train].correctness)
    print(f"candidates evaluated on {len(evaluations[0].records)} held-out questions: {len(candidates)}")
    print(f"Spearman(training fitness, held-out fitness) = {rho:.3f}   (target >= {MIN_RHO})")
    for name, i in (("best training candidate", best_train), ("best held-out candidate", best_test)):
        e = evaluations[i]
        print(f"{name:<24} #{candidates[i].id:<5} training fitness {train[i]:.4f}  held-out fitness "
              f"{test[i]:.4f}, {e.correctness:.1%} correct, {e.mean_tokens:.1f} tokens")
    print(f"held-out correctness gap = {gap:.1f} points   (target <= {MAX_GAP_POINTS})")
    return 0 if rho >= MIN_RHO and gap <= MAX_GAP_POINTS else 1


if __name__ == "__main__":
    sys.exit(main())

"""Which candidate a run should call its best: the fittest, or one the noise cannot explain?

Issue Y's table showed the fitness's balance on a small pool: with lambda 0.5/0.5 and a
shortness scale of 100, one question of 32 weighs as much as 3.1 tokens an answer, so the
search buys length for training gains of a question or two that do not hold out. This reads
finished runs of benchmarks/bench_real_model.py (their archives, through the run's own claims
code) and sets the rule a run uses today against rules that tell a gain from noise:

- fittest: the highest fitness on the training pool (what deltas_best.json holds today);
- shorter, not significantly less correct: candidates in the order the search made them; one
  replaces the best so far (from the unsteered baseline on) only when it is shorter on the
  pool and its correctness there is not significantly lower than the best's (the paired 95%
  interval of the difference reaches zero);
- shortest not significantly below the baseline: the shortest candidate whose correctness on
  the pool is not significantly lower than the unsteered baseline's;
- shortest as correct as the baseline (CONFIG_BEST_SHORTEST, what a run does with it): the
  shortest candidate with at least the unsteered baseline's correctness on the pool, the
  fitter on equal tokens, ranked by the run's own code (the archive's `rank`). The search follows
  the fitness either way, so a run with that option makes the same candidates as the run
  read here and calls this one its best.

Each rule's pick is then read on the held-out questions, paired against the model as it is
and, in runs whose prompts carry the instruction, against the instruction alone; no answer is
made here. Every pick is a candidate of the training front, which the run's held-out check
answered in full; a pick it did not answer is shown as such.

    .venv/bin/python benchmarks/bench_best_rule.py --out-root outputs/bench-new --json docs/real-model/best_rule.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from compressor_2.archive import RunArchive, rank  # noqa: E402 - after the path is set
from compressor_2.common import atomic_write_text  # noqa: E402
from compressor_2.config import load_config  # noqa: E402
from compressor_2.findings import HELDOUT, TRAINING, Arm, Claims, Paired, Standing, read_tools_record, standing  # noqa: E402

ORACLE = REPO / "docs" / "real-model" / "stop_oracle.json"  # the baselines' stop oracle, 200 held-out


@dataclass(frozen=True)
class Candidate:
    """A candidate the search assessed on the whole pool, paired there with the baseline."""

    id: int
    genome: str
    tokens: float
    correctness: float
    fitness: float
    against_baseline: Paired


Rule = Callable[[Sequence[Candidate], Claims, Candidate], Candidate]


def fittest(candidates: Sequence[Candidate], claims: Claims, baseline: Candidate) -> Candidate:
    return max(candidates, key=lambda c: (c.fitness, -c.id))


def shorter_not_worse(candidates: Sequence[Candidate], claims: Claims, baseline: Candidate) -> Candidate:
    best = baseline
    for candidate in sorted(candidates, key=lambda c: c.id):
        if candidate.tokens < best.tokens:
            p = claims.paired(Arm(best.genome), Arm(candidate.genome), TRAINING)
            if p is not None and p.high >= 0:
                best = candidate
    return best


def shortest_near_baseline(candidates: Sequence[Candidate], claims: Claims, baseline: Candidate) -> Candidate:
    eligible = [c for c in candidates if c.against_baseline.high >= 0] or [baseline]
    return min(eligible, key=lambda c: (c.tokens, -c.fitness, c.id))


def shortest_as_correct(candidates: Sequence[Candidate], claims: Claims, baseline: Candidate) -> Candidate:
    """CONFIG_BEST_SHORTEST, through the run's own rank."""
    everyone = [baseline, *candidates] if baseline.id > 0 else list(candidates)
    return max(everyone, key=lambda c: (rank(c.fitness, c.tokens, c.correctness, baseline.correctness), -c.id))


RULES: dict[str, Rule] = {
    "fittest (today)": fittest,
    "shorter, not significantly less correct than the best so far": shorter_not_worse,
    "shortest not significantly below the baseline": shortest_near_baseline,
    "shortest as correct as the baseline (CONFIG_BEST_SHORTEST)": shortest_as_correct,
}


def assessed(now: Standing, claims: Claims) -> tuple[Candidate, list[Candidate]]:
    """The baseline and every candidate assessed on the pool, each paired with the baseline."""
    assert now.zeros is not None and now.baseline is not None
    found = []
    for point in now.points:
        genome = now.genome(point.id)
        p = claims.paired(Arm(now.zeros), Arm(genome), TRAINING)
        if p is not None and p.questions == len(claims.examples[TRAINING]):
            found.append(Candidate(point.id, genome, point.tokens, point.correctness, point.fitness, p))
    base = claims.paired(Arm(now.zeros), Arm(now.zeros), TRAINING)
    assert base is not None
    baseline = Candidate(now.baseline.id, now.zeros, base.tokens, base.correctness, now.baseline.fitness, base)
    return baseline, [c for c in found if c.genome != now.zeros]


def read_run(folder: Path, oracle: dict[str, float]) -> dict[str, Any] | None:
    """The run's picks, or None while it has no held-out check yet (still running)."""
    config = load_config(folder / "run.config")
    archive = RunArchive.open_read_only(folder / "run" / "run.sqlite")
    try:
        now = standing(archive)
        if now.baseline is None or not now.heldout:
            return None
        claims = Claims.of_config(config, archive)
        record = read_tools_record(archive)
        instruction = record.instruction if record is not None and record.in_search else ""
        baseline, candidates = assessed(now, claims)
        rows = []
        for name, rule in RULES.items():
            pick = rule(candidates, claims, baseline)
            row: dict[str, Any] = {"rule": name, "candidate": pick.id, "pool_tokens": pick.tokens,
                                   "pool_correctness": pick.correctness, "pool_against_baseline": asdict(pick.against_baseline)}
            against = claims.paired(Arm(baseline.genome), Arm(pick.genome), HELDOUT)
            row["heldout_checked"] = against is not None and against.questions == len(claims.examples[HELDOUT])
            if row["heldout_checked"]:
                assert against is not None
                row["against_baseline"] = asdict(against)
                prompt = "instructed" if instruction else "plain"
                cut = oracle[prompt]
                row["share_of_oracle_cut"] = (against.reference_tokens - against.tokens) / cut if cut > 0 else None
                if instruction:
                    as_is = claims.paired(Arm(baseline.genome, without=instruction), Arm(pick.genome), HELDOUT)
                    row["against_model_as_is"] = asdict(as_is) if as_is is not None else None
            rows.append(row)
        return {"run": folder.name, "instructed": bool(instruction), "candidates": len(candidates), "rules": rows}
    finally:
        archive.close()


def oracle_cuts() -> dict[str, float]:
    arms = json.loads(ORACLE.read_text(encoding="utf-8"))["arms"]
    return {a["arm"]: a["oracle"]["cut"] for a in arms}


def shown(p: dict[str, Any]) -> str:
    return (f"{p['tokens']:.1f} tok, {100 * p['correctness']:.1f}% ({p['tokens_change']:+.1f} tok, "
            f"{100 * p['difference']:+.1f} pts, {100 * p['low']:+.1f} to {100 * p['high']:+.1f}, p={p['p_value']:.2g})")


def table(runs: list[dict[str, Any]]) -> list[str]:
    lines = ["| run | rule | candidate | pool: tokens, correct (against the baseline) | held out, against the "
             "baseline | share of the oracle's cut |", "| --- | --- | --- | --- | --- | --- |"]
    for run in runs:
        for row in run["rules"]:
            held = shown(row["against_baseline"]) if row["heldout_checked"] else "not answered by the check"
            share = row.get("share_of_oracle_cut")
            lines.append(f"| {run['run']} | {row['rule']} | #{row['candidate']} | {shown(row['pool_against_baseline'])} "
                         f"| {held} | {'' if share is None else f'{100 * share:.0f}%'} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-root", type=Path, default=REPO / "outputs" / "bench-real",
                        help="bench_real_model.py's --out-root (default outputs/bench-real)")
    parser.add_argument("--json", type=Path, help="write every run's picks here")
    args = parser.parse_args(argv)
    folders = sorted(p.parent.parent for p in args.out_root.glob("*/run/run.sqlite"))
    if not folders:
        print(f"error: no finished run under {args.out_root}", file=sys.stderr)
        return 2
    cuts = oracle_cuts()
    found = [(folder, read_run(folder, cuts)) for folder in folders]
    for folder, run in found:
        if run is None:
            print(f"{folder.name}: no held-out check yet, left out", file=sys.stderr)
    runs = [run for _, run in found if run is not None]
    print("\n".join(table(runs)))
    if args.json:
        atomic_write_text(args.json, json.dumps({"runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Agreement of the numeric judge with FinanceBench's human labels.

The paper's results files hold model answers labelled by people "Correct Answer",
"Incorrect Answer" or "Refusal" (a refusal counts as incorrect). Gold answers come
from financebench_open_source.jsonl, joined on financebench_id (the results'
gold_answer column is an older format). Prints agreement per question type, per
kind of gold answer (figure, yes/no, figures in prose, prose), per results file and
overall, with the confusion counts (judge+/human- = judged correct, labelled not).

    .venv/bin/python benchmarks/calibrate_judge.py [--data DIR] [--tolerance 0.01] [--show N]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from compressor_2.judges.base import JudgeItem
from compressor_2.judges.numeric import NumericJudge, gold_kind

DEFAULT_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "financebench"


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _kappa(c: Counter) -> float:
    """Cohen's kappa: agreement beyond what the two raters' base rates give by chance
    (plain agreement looks high on a file that is mostly refusals)."""
    n = sum(c.values())
    observed = (c["tp"] + c["tn"]) / n
    judge_yes, human_yes = (c["tp"] + c["fp"]) / n, (c["tp"] + c["fn"]) / n
    chance = judge_yes * human_yes + (1 - judge_yes) * (1 - human_yes)
    return 1.0 if chance == 1 else (observed - chance) / (1 - chance)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the FinanceBench folder")
    parser.add_argument("--tolerance", type=float, default=0.01, help="relative tolerance for figures")
    parser.add_argument("--show", type=int, default=0, metavar="N",
                        help="print up to N disagreements per question type")
    args = parser.parse_args(argv)

    questions = args.data / "financebench_open_source.jsonl"
    results = sorted((args.data / "results").glob("*.jsonl"))
    if not questions.is_file() or not results:
        print(f"skipped: FinanceBench data not found at {args.data} "
              "(questions file and results/*.jsonl; only in the dev workspace)")
        return 0

    gold = {r["financebench_id"]: r for r in _rows(questions)}
    judge = NumericJudge(tolerance=args.tolerance)
    agree: dict[tuple[str, str], Counter] = defaultdict(Counter)  # (axis, key) -> outcome counts
    shown: Counter = Counter()
    unmatched = 0
    for path in results:
        for row in _rows(path):
            record = gold.get(row["financebench_id"])
            if record is None:
                unmatched += 1
                continue
            kind = record.get("question_type") or "unknown"
            human = row["label"] == "Correct Answer"
            verdict = judge.judge_one(JudgeItem(record["question"], row["model_answer"] or "",
                                                record["answer"]))
            outcome = {(True, True): "tp", (False, False): "tn",
                       (True, False): "fp", (False, True): "fn"}[(verdict.is_correct, human)]
            for key in (("type", kind), ("gold", gold_kind(record["answer"])), ("file", path.stem),
                        ("all", "all")):
                agree[key][outcome] += 1
            if outcome in ("fp", "fn") and shown[kind] < args.show:
                shown[kind] += 1
                print(f"--- {kind} {path.stem} {row['financebench_id']} human={row['label']} "
                      f"judge={verdict.is_correct}\n  gold: {record['answer'][:200]!r}\n"
                      f"  answer: {(row['model_answer'] or '')[-400:]!r}\n  why: {verdict.reasoning}")

    print(f"numeric judge vs human labels in {len(results)} results files "
          f"(tolerance {args.tolerance:.1%}; Refusal = incorrect)")
    if unmatched:
        print(f"{unmatched} rows skipped: their financebench_id is not in {questions.name}")
    print()
    print(f"{'group':<44} {'n':>5} {'agree':>7} {'kappa':>6}  {'judge+/human+':>13} "
          f"{'judge+/human-':>13} {'judge-/human+':>13} {'judge-/human-':>13}")
    for axis in ("type", "gold", "file", "all"):
        for (a, key), c in sorted(agree.items()):
            if a != axis:
                continue
            n = sum(c.values())
            print(f"{axis + ': ' + key:<44} {n:>5} {(c['tp'] + c['tn']) / n:>7.1%} {_kappa(c):>6.2f}  "
                  f"{c['tp']:>13} {c['fp']:>13} {c['fn']:>13} {c['tn']:>13}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

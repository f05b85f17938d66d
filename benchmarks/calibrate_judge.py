"""Agreement of a correctness judge with FinanceBench's human labels.

The paper's results files hold model answers labelled by people "Correct Answer",
"Incorrect Answer" or "Refusal" (a refusal counts as incorrect). Gold answers come
from financebench_open_source.jsonl, joined on financebench_id (the results'
gold_answer column is an older format). The judge is the config's (`--config`: its judge,
model, URL, key variable and tolerance; without one, the defconfig's numeric judge), or
the one `--judge` names, with `--judge-model`, `--judge-base-url` and `--judge-api-key-env`
for the llm and hybrid judges (the key is read from that variable only).

Prints agreement and Cohen's kappa per question type, per kind of gold answer (figure,
yes/no, figures in prose, prose), per results file and overall, with the confusion counts;
then the lenient cases (judged correct, labelled incorrect: they reward an answer cut
short of what mattered) apart from the strict ones (judged incorrect, labelled correct),
and the leniency on answers shorter than the median against the longer ones.

    .venv/bin/python benchmarks/calibrate_judge.py [--data DIR] [--config PATH] [--judge numeric|llm|hybrid]
        [--judge-model M] [--judge-base-url URL] [--judge-api-key-env VAR] [--tolerance T] [--limit N] [--show N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from sklearn.metrics import cohen_kappa_score

from compressor_2.common import ConfigError, RunError
from compressor_2.config import Config, load_config
from compressor_2.judges import gold_kind
from compressor_2.judges.base import JudgeItem, Verdict
from compressor_2.judges.registry import JUDGES, make_judge

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "data" / "financebench"


class Row(NamedTuple):
    """One labelled answer, and what the judge made of it. (A NamedTuple: the benchmarks are
    loaded from their file, outside sys.modules, where a dataclass cannot be built.)"""

    groups: tuple[tuple[str, str], ...]  # (axis, key): type, gold kind, results file, all
    item: JudgeItem
    human: bool  # labelled correct
    judged: bool
    reasoning: str
    words: int  # the answer's length

    @property
    def lenient(self) -> bool:
        return self.judged and not self.human

    @property
    def strict(self) -> bool:
        return self.human and not self.judged


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _judge_config(args: argparse.Namespace) -> Config:
    """The config's judge settings, with the flags' on top."""
    config = load_config(args.config if args.config is not None else REPO / "defconfig")
    overrides = {"judge": args.judge, "judge_model": args.judge_model, "judge_base_url": args.judge_base_url,
                 "judge_api_key_env": args.judge_api_key_env, "correctness_tolerance": args.tolerance}
    return dataclasses.replace(config, **{k: v for k, v in overrides.items() if v is not None})


def judged_rows(data: Path, config: Config, limit: int) -> tuple[list[Row], int]:
    """Every labelled answer whose question is known, judged in one call; and how many were
    skipped for an unknown financebench_id."""
    gold = {r["financebench_id"]: r for r in _rows(data / "financebench_open_source.jsonl")}
    labelled: list[tuple[tuple[tuple[str, str], ...], JudgeItem, bool]] = []
    unmatched = 0
    for path in sorted((data / "results").glob("*.jsonl")):
        for row in _rows(path)[:limit or None]:
            record = gold.get(row["financebench_id"])
            if record is None:
                unmatched += 1
                continue
            groups = (("type", record.get("question_type") or "unknown"), ("gold", gold_kind(record["answer"])),
                      ("file", path.stem), ("all", "all"))
            item = JudgeItem(record["question"], row["model_answer"] or "", record["answer"])
            labelled.append((groups, item, row["label"] == "Correct Answer"))
    if not labelled:
        return [], unmatched  # no judge made, no call paid, for nothing to judge
    verdicts: list[Verdict] = make_judge(config).judge([item for _, item, _ in labelled])
    return [Row(groups, item, human, v.is_correct, v.reasoning, len(item.answer.split()))
            for (groups, item, human), v in zip(labelled, verdicts)], unmatched


def kappa(rows: Sequence[Row]) -> str:
    """Cohen's kappa: agreement beyond what the two raters' base rates give by chance (plain
    agreement looks high on a file that is mostly refusals); '-' where it is undefined (one
    rater says the same of every answer, and the other too)."""
    if len({r.human for r in rows} | {r.judged for r in rows}) < 2:
        return "-"
    return f"{cohen_kappa_score([r.human for r in rows], [r.judged for r in rows]):.2f}"


def agreement_table(rows: Sequence[Row]) -> list[str]:
    lines = [f"{'group':<44} {'n':>5} {'agree':>7} {'kappa':>6}  {'judge+/human+':>13} "
             f"{'judge+/human- (lenient)':>23} {'judge-/human+ (strict)':>22} {'judge-/human-':>13}"]
    for axis in ("type", "gold", "file", "all"):
        for key in sorted({k for r in rows for a, k in r.groups if a == axis}):
            group = [r for r in rows if (axis, key) in r.groups]
            agree = sum(r.judged == r.human for r in group) / len(group)
            lines.append(f"{axis + ': ' + key:<44} {len(group):>5} {agree:>7.1%} {kappa(group):>6}  "
                         f"{sum(r.judged and r.human for r in group):>13} {sum(r.lenient for r in group):>23} "
                         f"{sum(r.strict for r in group):>22} {sum(not r.judged and not r.human for r in group):>13}")
        lines.append("")
    return lines


def leniency(rows: Sequence[Row]) -> str:
    """The share of answers people marked wrong that the judge accepted."""
    wrong = [r for r in rows if not r.human]
    if not wrong:
        return "- (no answer labelled incorrect)"
    return f"{sum(r.lenient for r in wrong) / len(wrong):.1%} ({sum(r.lenient for r in wrong)} of {len(wrong)})"


def lenient_and_strict(rows: Sequence[Row]) -> list[str]:
    median = statistics.median(r.words for r in rows)
    short = [r for r in rows if r.words < median]
    longer = [r for r in rows if r.words >= median]
    right = [r for r in rows if r.human]
    strict = f"{sum(r.strict for r in right) / len(right):.1%}" if right else "-"
    return [
        f"lenient (judged correct, labelled incorrect): {sum(r.lenient for r in rows)} answers; the judge accepts "
        f"{leniency(rows)} of the answers people marked wrong",
        f"strict (judged incorrect, labelled correct): {sum(r.strict for r in rows)} answers; the judge rejects "
        f"{strict} of the answers people marked right",
        f"leniency on answers shorter than the median ({median:g} words): {leniency(short)}; "
        f"at the median or longer: {leniency(longer)}",
    ]


def disagreements(rows: Sequence[Row], show: int) -> list[str]:
    """Up to `show` lenient and `show` strict cases per question type, each kind apart."""
    lines = []
    for kind, pick in (("lenient", lambda r: r.lenient), ("strict", lambda r: r.strict)):
        shown: dict[str, int] = {}
        for r in rows:
            key = dict(r.groups)["type"]
            if pick(r) and shown.get(key, 0) < show:
                shown[key] = shown.get(key, 0) + 1
                lines += [f"--- {kind} {key} {dict(r.groups)['file']}  human={'correct' if r.human else 'incorrect'}",
                          f"  gold: {r.item.gold[:200]!r}", f"  answer: {r.item.answer[-400:]!r}",
                          f"  why: {r.reasoning}"]
    return lines


def _count(text: str) -> int:
    """An argument that counts rows: a negative one would cut rows off the end unseen."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative: give 0 or more")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the FinanceBench folder")
    parser.add_argument("--config", type=Path, default=None,
                        help="take the judge, its model, URL, key variable and tolerance from this config")
    parser.add_argument("--judge", choices=tuple(JUDGES), default=None, help="the judge (default: the config's)")
    parser.add_argument("--judge-model", default=None, help="the llm judge's model")
    parser.add_argument("--judge-base-url", default=None, help="the llm judge's OpenAI-compatible API")
    parser.add_argument("--judge-api-key-env", default=None, help="the environment variable holding its key")
    parser.add_argument("--tolerance", type=float, default=None, help="relative tolerance for figures")
    parser.add_argument("--limit", type=_count, default=0, metavar="N",
                        help="judge the first N answers of each results file (0: all; an llm judge pays per call)")
    parser.add_argument("--show", type=_count, default=0, metavar="N",
                        help="print up to N lenient and N strict cases per question type")
    args = parser.parse_args(argv)

    results = sorted((args.data / "results").glob("*.jsonl"))
    if not (args.data / "financebench_open_source.jsonl").is_file() or not results:
        print(f"skipped: FinanceBench data not found at {args.data} "
              "(questions file and results/*.jsonl; only in the dev workspace)")
        return 0
    try:
        config = _judge_config(args)
        rows, unmatched = judged_rows(args.data, config, args.limit)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not rows:  # nothing to measure: no median, no agreement
        print(f"error: no labelled answer matched a question: {args.data / 'results'}/*.jsonl holds {unmatched} "
              f"rows, none with a financebench_id in {args.data / 'financebench_open_source.jsonl'}",
              file=sys.stderr)
        return 2
    judge = config.judge if config.judge == "numeric" else f"{config.judge} ({config.judge_model})"
    print(f"{judge} judge vs human labels in {len(results)} results files "
          f"(tolerance {config.correctness_tolerance:.1%}; Refusal = incorrect)")
    if unmatched:
        print(f"{unmatched} rows skipped: their financebench_id is not in financebench_open_source.jsonl")
    print()
    print("\n".join([*agreement_table(rows), *lenient_and_strict(rows), *disagreements(rows, args.show)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

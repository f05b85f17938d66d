"""The demo model's quality bar, per question kind, unsteered and with an EOS bias.

Generates greedily with the transformers engine on the held-out split and judges with
the numeric judge, the same components `evaluate` uses. The EOS bias (a delta on a
two-cluster map: EOS vs everything else) shows how much room steering has: answers
should get shorter while the first figure still appears.

    python -m compressor_2.demo.quality --model compressor_2/demo/model --eos-bias 0 3 5 8
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from compressor_2.data import Example, load_examples
from compressor_2.demo.task import DATA_DIR
from compressor_2.demo.train import MODEL_DIR
from compressor_2.engines import GenerationRequest
from compressor_2.engines.transformers.engine import TransformersEngine
from compressor_2.judges import JudgeItem, NumericJudge

ALL = "all"


@dataclass(frozen=True)
class KindScore:
    kind: str
    n: int
    correctness: float
    mean_tokens: float  # completion tokens, EOS included (as the engines count)
    bare_tokens: float  # the gold's tokens plus EOS: the shortest correct answer

    @property
    def ratio(self) -> float:
        return self.mean_tokens / self.bare_tokens


def score(engine: TransformersEngine, examples: list[Example], eos_bias: float,
          judge: NumericJudge) -> tuple[list[KindScore], list[tuple[Example, str, bool]]]:
    """Per-kind scores (plus ALL) and each (example, answer, is_correct)."""
    deltas = (eos_bias, 0.0)
    generations = engine.generate([GenerationRequest(e.prompt, deltas) for e in examples])
    verdicts = judge.judge([JudgeItem(e.question, g.text, e.gold) for e, g in zip(examples, generations)])
    groups: dict[str, list[tuple[int, int, bool]]] = defaultdict(list)
    for e, g, v in zip(examples, generations, verdicts):
        bare = len(engine.tokenizer(e.gold)["input_ids"]) + 1
        row = (g.completion_tokens, bare, v.is_correct)
        groups[e.question_type or "unknown"].append(row)
        groups[ALL].append(row)
    scores = [
        KindScore(kind, len(rows), statistics.mean(r[2] for r in rows),
                  statistics.mean(r[0] for r in rows), statistics.mean(r[1] for r in rows))
        for kind, rows in sorted(groups.items(), key=lambda kv: (kv[0] == ALL, kv[0]))
    ]
    answers = [(e, g.text, v.is_correct) for e, g, v in zip(examples, generations, verdicts)]
    return scores, answers


def eos_engine(model: Path, batch_size: int, max_new_tokens: int) -> TransformersEngine:
    """The engine on a two-cluster map: cluster 0 = the EOS token(s), cluster 1 = the rest."""
    from compressor_2.model import load_tokenizer

    tokenizer = load_tokenizer(str(model))
    clusters = np.ones(len(tokenizer), dtype=np.int64)
    clusters[tokenizer.eos_token_id] = 0
    return TransformersEngine(str(model), clusters, 2, batch_size=batch_size,
                              max_new_tokens=max_new_tokens, device="cpu")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=MODEL_DIR)
    parser.add_argument("--data", type=Path, default=DATA_DIR / "heldout.jsonl")
    parser.add_argument("--indices", default="all")
    parser.add_argument("--eos-bias", type=float, nargs="+", default=[0.0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--show", type=int, default=0, help="print this many answers per setting")
    args = parser.parse_args(argv)
    engine = eos_engine(args.model, args.batch_size, args.max_new_tokens)
    examples = load_examples(args.data, args.indices)
    judge = NumericJudge()
    print(f"{'eos bias':>8}  {'kind':<14} {'n':>4}  {'correct':>7}  {'tokens':>6}  {'bare':>5}  {'ratio':>5}")
    for bias in args.eos_bias:
        scores, answers = score(engine, examples, bias, judge)
        for s in scores:
            print(f"{bias:>8.1f}  {s.kind:<14} {s.n:>4}  {s.correctness:>7.1%}  {s.mean_tokens:>6.1f}  "
                  f"{s.bare_tokens:>5.1f}  {s.ratio:>5.2f}")
        for example, text, ok in answers[:args.show]:
            print(f"    [{'ok' if ok else 'WRONG'}] {example.question}\n      gold: {example.gold}\n      answer: {text}")


if __name__ == "__main__":
    main()

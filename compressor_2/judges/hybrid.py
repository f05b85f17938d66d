"""The hybrid judge: the numeric judge where the gold is a bare figure or a yes/no,
the LLM judge for everything else (prose and sentences with figures)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from compressor_2.judges.base import Judge, JudgeItem, Verdict
from compressor_2.judges.numeric import gold_kind

NUMERIC_KINDS = frozenset({"figure", "yes_no"})


@dataclass(frozen=True)
class HybridJudge:
    numeric: Judge
    llm: Judge

    def judge(self, items: Sequence[JudgeItem]) -> list[Verdict]:
        to_numeric = [i for i, item in enumerate(items) if gold_kind(item.gold) in NUMERIC_KINDS]
        chosen = set(to_numeric)
        to_llm = [i for i in range(len(items)) if i not in chosen]
        verdicts: dict[int, Verdict] = {}
        # One call per judge keeps the LLM's thread pool busy across all its items.
        for judge, indices in ((self.numeric, to_numeric), (self.llm, to_llm)):
            if indices:
                verdicts.update(zip(indices, judge.judge([items[i] for i in indices]), strict=True))
        return [verdicts[i] for i in range(len(items))]

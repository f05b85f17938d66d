"""Correctness judges (`Judge`, `JudgeItem`, `make_judge`): per answer, whether it is correct and why."""

from compressor_2.judges.base import Judge, JudgeItem
from compressor_2.judges.numeric import NumericJudge, figure_spans, gold_kind
from compressor_2.judges.registry import make_judge

__all__ = ["Judge", "JudgeItem", "NumericJudge", "figure_spans", "gold_kind", "make_judge"]

"""Correctness judges (`Judge`, `JudgeItem`, `make_judge`): per answer, whether it is correct and why, and where it could
have stopped."""

from compressor_2.judges.base import Judge, JudgeItem
from compressor_2.judges.numeric import NumericJudge, figure_spans, gold_kind
from compressor_2.judges.prefixes import first_accepted, stopping_points
from compressor_2.judges.registry import make_judge

__all__ = ["Judge", "JudgeItem", "NumericJudge", "figure_spans", "first_accepted", "gold_kind", "make_judge",
           "stopping_points"]

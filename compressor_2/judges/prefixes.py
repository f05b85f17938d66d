"""Where an answer could have stopped: its shortest prefix, token by token, that a judge
already accepts. The stop oracle (findings/stop_oracle.py) and the local reflector's padding
evidence (reflector/evidence.py) read answers by it.

A prefix that ends inside one of the whole answer's figures or numbers is no stopping point
(`stopping_points`): the judge may accept "$31" for "$31,057 million", a rule that stopped
there would have changed the figure."""

from __future__ import annotations

import re
from collections.abc import Sequence

from compressor_2.judges.base import Judge, JudgeItem
from compressor_2.judges.numeric import figure_spans

# At an offset inside a number: after a digit, before a digit or a separator and a digit;
# or between a digit and its separator and the next digit.
_INSIDE_NUMBER = re.compile(r"(?<=\d)[.,]?\d|(?<=\d[.,])\d")


def stopping_points(prefixes: Sequence[str]) -> list[int]:
    """The lengths, short of the whole answer, at which a rule may stop it: every prefix that
    does not end inside one of the whole answer's figures or numbers (a digit the answer goes
    on from with a digit, or with a separator and a digit). Stopping "$31,057 million" after
    "$31" would change the figure, though the numeric judge, which reads "$31" as $31 billion
    at its precision, accepts it."""
    whole = prefixes[-1]
    spans = figure_spans(whole)

    def inside(end: int) -> bool:
        return any(start < end < stop for start, stop in spans) or _INSIDE_NUMBER.match(whole, end) is not None

    return [n for n in range(1, len(prefixes) - 1) if not inside(len(prefixes[n]))]


def first_accepted(judge: Judge, question: str, gold: str, prefixes: Sequence[str]) -> int | None:
    """The length of the shortest stopping point of the answer whose decoded prefixes (0, 1,
    ..., all of its tokens long) are `prefixes` that `judge` accepts; None when none is."""
    points = stopping_points(prefixes)
    verdicts = judge.judge([JudgeItem(question, prefixes[n], gold) for n in points])
    return next((n for n, v in zip(points, verdicts) if v.is_correct), None)

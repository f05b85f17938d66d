"""The judge interface: was each answer correct, and why."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class JudgeItem:
    question: str
    answer: str  # the model's answer
    gold: str


@dataclass(frozen=True)
class Verdict:
    is_correct: bool
    reasoning: str  # what was compared, in words the reflector can use


class Judge(Protocol):
    def judge(self, items: Sequence[JudgeItem]) -> list[Verdict]:
        """Verdicts in item order."""
        ...

"""One training or evaluation question, ready to send to an engine."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Example:
    id: str  # financebench_id
    question: str
    gold: str  # the reference answer
    prompt: str  # question plus evidence, from the prompt template
    question_type: str | None = None  # e.g. metrics-generated; the demo task's kind

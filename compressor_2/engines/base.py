"""The engine interface fitness code uses: many (prompt, deltas) pairs in, answers out."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class GenerationRequest:
    """One answer to produce: a user prompt (the engine applies the chat template) and
    the delta list, in canonical cluster order, to steer it with; with P answer phases,
    P such lists one after the other (phase-major)."""

    prompt: str
    deltas: tuple[float, ...]


@dataclass(frozen=True)
class Generation:
    text: str
    completion_tokens: int  # counted with the model's tokenizer


Progress = Callable[[int], None]  # called with the number of newly finished requests


class Engine(Protocol):
    def generate(
        self, requests: Sequence[GenerationRequest], progress: Progress | None = None
    ) -> list[Generation]:
        """Answers in request order. One call carries a whole generation's requests."""
        ...

    def close(self) -> None:
        """Release the model or stop the server the engine owns. Idempotent."""
        ...

"""One text file per reflector attempt under output_dir/reflector_prompts/: the
exact messages, the raw reply (its first REPLY_LOG_MAX_CHARS characters, masked
before it is cut) and the attempt's outcome (under the header `verdict`). Headers, keys
and URLs never appear."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from compressor_2.common import atomic_write_text, scrub
from compressor_2.reflector.base import Message, Reply
from compressor_2.reflector.limits import REPLY_LOG_MAX_CHARS, keep_first

PROMPT_DIR = "reflector_prompts"  # in the run's output directory


class PromptLog:
    def __init__(self, directory: Path, reflector: str) -> None:
        self.directory = directory
        self.reflector = reflector

    def path(self, generation: int, call: str, child: int | None, attempt: int) -> Path:
        """`child` is None for a call about the whole population (a selection)."""
        about = f"_child{child}" if child is not None else ""
        return self.directory / f"gen_{generation}_{call}{about}_attempt{attempt}.txt"

    def write(self, generation: int, call: str, child: int | None, attempt: int,
              indices: Mapping[str, object], messages: list[Message], reply: Reply, outcome: str) -> None:
        header = {"generation": generation, "call": call, **({"child": child} if child is not None else {}), **indices,
                  "attempt": attempt, "reflector": self.reflector}
        parts = [*(f"{key}: {value}" for key, value in header.items())]
        for message in messages:
            parts += [f"===== {message['role']} =====", message["content"]]
        parts += ["===== reply =====",
                  keep_first(scrub(reply.content), REPLY_LOG_MAX_CHARS) if reply.content is not None
                  else f"(call failed: {reply.error})",
                  "===== verdict =====", outcome,
                  f"usage: prompt_tokens={reply.usage.prompt_tokens} "
                  f"completion_tokens={reply.usage.completion_tokens}"]
        atomic_write_text(self.path(generation, call, child, attempt), scrub("\n".join(parts) + "\n"))

"""What an OpenAI-compatible server sent back for a Chat Completions call, read from the
raw HTTP body and checked, for the reflector and the LLM judge alike.

The SDK builds its response objects without validating them: an HTML page with status 200
reached the code as a string (AttributeError), a `usage` of 2**70 as an integer SQLite
cannot store (OverflowError), a string or NaN as a token count (TypeError,
IntegrityError), and a negative count took a run past CONFIG_MAX_REFLECTOR_TOKENS. Here a
reply is a JSON object with a list of choices, the first one's message content text (or
null), and token counts that are integers in [0, 2^53); anything else is a `BadReply`
whose one line says what came back, every key in it masked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compressor_2.common.json_values import as_count, loads_or_reason, shown

MAX_TOKENS = 2**53  # every float holds a count below it exactly
USAGE_FIELDS = ("prompt_tokens", "completion_tokens")


@dataclass(frozen=True)
class Completion:
    content: str | None  # the first choice's message content; None when the server sent none
    prompt_tokens: int
    completion_tokens: int


class BadReply(Exception):
    """The reply is no chat completion; the message says what came back."""


def read_completion(status: int, content_type: str, body: bytes) -> Completion:
    """The completion in a successful response's `body`, or BadReply."""
    data, unreadable = loads_or_reason(body)
    if unreadable is not None:
        text = body.decode("utf-8", errors="replace")
        raise BadReply(f"the reply is {unreadable} (HTTP {status}, {content_type or 'no content type'}): "
                       f"{shown(text.strip())}")
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list):
        raise BadReply(f"the reply is not a chat completion (no list of choices): {shown(data)}")
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    if choices and not isinstance(message, dict):
        raise BadReply(f"the reply's first choice has no message object: {shown(choices[0])}")
    if content is not None and not isinstance(content, str):
        raise BadReply(f"the reply's message content is {shown(content)}, not text")
    prompt, completion = _usage(data.get("usage"))
    return Completion(content, prompt, completion)


def _usage(usage: Any) -> tuple[int, int]:
    """(prompt, completion) tokens; a server that reports no usage spent none we know of."""
    if usage is None:
        return 0, 0
    if not isinstance(usage, dict):
        raise BadReply(f"the reply's usage is {shown(usage)}, not an object of token counts")
    counts = []
    for field in USAGE_FIELDS:
        value = usage.get(field, 0)
        count = as_count(value, MAX_TOKENS)
        if count is None:
            raise BadReply(f"the reply's usage.{field} is {shown(value)}, not an integer in [0, 2^53)")
        counts.append(count)
    return counts[0], counts[1]

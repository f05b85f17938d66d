"""What of a reply may be stored: every text a reply brings is masked (`api_key.scrub`: a
server or proxy may echo the Authorization header into the content) and capped before the
run archive, a state file, the history or the prompt log holds it.

- a scratchpad keeps its most recent SCRATCHPAD_MAX_CHARS characters (notes are appended,
  newest last; the local reflector's 40 notes stay far below), from the first line that
  starts inside them;
- any other text of a reply that is kept (a selection's reasoning and summary, a
  full-vector summary before it joins the scratchpad) keeps its first TEXT_MAX_CHARS;
- the raw reply in the prompt log keeps its first REPLY_LOG_MAX_CHARS, and an API error
  or a rejection's reason its first NOTE_MAX_CHARS; a refused value is shown in at most
  REFUSED_VALUE_CHARS (`json_values.shown`).

Every text is masked before it is cut: a key cut in two no longer matches the mask.
"""

from __future__ import annotations

from compressor_2.common import masked, scrub

SCRATCHPAD_MAX_CHARS = 16_000
TEXT_MAX_CHARS = 2_000
REPLY_LOG_MAX_CHARS = 64_000
NOTE_MAX_CHARS = 1_000
REFUSED_VALUE_CHARS = 80


def keep_recent(text: str, limit: int = SCRATCHPAD_MAX_CHARS) -> str:
    """`text`'s last `limit` characters, from a line start when one falls inside them."""
    if len(text) <= limit:
        return text
    tail = text[-limit:]
    cut = tail.find("\n")
    return tail[cut + 1:] if 0 <= cut < len(tail) - 1 else tail


def keep_first(text: str, limit: int) -> str:
    """`text`'s first `limit` characters, saying how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]} [... {len(text) - limit} more characters]"


def scratchpad(text: str) -> str:
    """A reply's scratchpad as it may be stored."""
    return keep_recent(scrub(text))


def kept_text(text: str) -> str:
    """Any other text of a reply as it may be stored (the LLM judge's reasoning alike)."""
    return masked(text, TEXT_MAX_CHARS)


def note(text: str) -> str:
    """An API error or a rejection's reason as it may be stored."""
    return masked(text, NOTE_MAX_CHARS)

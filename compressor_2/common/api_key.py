"""API keys come only from the environment; the error names the variable, never a key.

Every key read here is remembered, and `scrub` replaces each of them in any text: the one
place through which error texts, log lines, prompt-log entries and archive records pass
before they are written (servers echo the Authorization header in error bodies).
"""

from __future__ import annotations

import logging
import os
import threading

from compressor_2.common.errors import ConfigError

MASK = "***"
_KEYS: set[str] = set()
_LOCK = threading.Lock()


def api_key_from_env(variable: str, user: str, symbol: str) -> str:
    """The key in `variable`; `user` ("the judge") and `symbol` (the CONFIG_ option naming
    the variable) make the error say where to look."""
    key = os.environ.get(variable, "").strip()
    if not key:
        raise ConfigError(
            f"{user}'s API key is missing: set the environment variable {variable} "
            f"(named by CONFIG_{symbol})"
        )
    remember(key)
    return key


def remember(key: str) -> None:
    """Adds a secret that `scrub` must mask (every client does, whatever gave it the key)."""
    if key:
        with _LOCK:
            _KEYS.add(key)


def scrub(text: str) -> str:
    """`text` with every API key this process has read replaced by ***."""
    with _LOCK:
        keys = sorted(_KEYS, key=len, reverse=True)
    for key in keys:
        text = text.replace(key, MASK)
    return text


def masked(text: str, limit: int) -> str:
    """An outside text (a reply's, an error's) as it may be stored: every key masked, then
    its first `limit` characters kept (masked first: a key cut in two no longer matches)."""
    text = scrub(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]} [... {len(text) - limit} more characters]"


class ScrubFilter(logging.Filter):
    """Scrubs every log record's message, arguments included, before a handler writes it."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = scrub(record.getMessage())
        record.args = None
        return True

"""A start-up check that an API endpoint accepts connections, before any model loads: a
closed port or an unknown host is one line at once, not a run whose every call fails."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from compressor_2.errors import ConfigError, RunError

CONNECT_TIMEOUT = 5.0


def check_reachable(url: str, who: str, symbol: str) -> None:
    """Opens (and closes) a TCP connection to `url`'s host and port."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"CONFIG_{symbol}={url!r} is not an http(s):// URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT).close()
    except OSError as exc:
        raise RunError(f"{who} at {url} cannot be reached ({exc.strerror or exc}): check CONFIG_{symbol} "
                       "and that the server is up") from None

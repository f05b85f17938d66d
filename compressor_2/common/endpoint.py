"""Where this project's peers live: the loopback rule (an SGLang server runs code sent in
requests, so it must be reached by this machine alone unless the config says otherwise),
and a start-up check that an API endpoint accepts connections, before any model loads: a
closed port or an unknown host is one line at once, not a run whose every call fails."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from compressor_2.common.errors import ConfigError, RunError

CONNECT_TIMEOUT = 5.0
TUNNEL_HINT = ("reach a server on another machine through an SSH tunnel (ssh -N -L 30001:127.0.0.1:30000 HOST, "
               "then http://127.0.0.1:30001)")


def is_loopback(host: str) -> bool:
    """localhost, 127.0.0.0/8 or ::1 (brackets allowed): the only addresses where a server that runs
    code sent in requests is reached by this machine alone."""
    host = host.strip().removeprefix("[").removesuffix("]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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

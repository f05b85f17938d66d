"""API keys come only from the environment; the error names the variable, never a key."""

from __future__ import annotations

import os

from compressor_2.errors import ConfigError


def api_key_from_env(variable: str, user: str, symbol: str) -> str:
    """The key in `variable`; `user` ("the judge") and `symbol` (the CONFIG_ option naming
    the variable) make the error say where to look."""
    key = os.environ.get(variable, "").strip()
    if not key:
        raise ConfigError(
            f"{user}'s API key is missing: set the environment variable {variable} "
            f"(named by CONFIG_{symbol})"
        )
    return key

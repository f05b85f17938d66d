"""Values read from JSON a user may have edited, as numbers and in messages.

JSON puts no limit on an integer's digits and Python's parser accepts NaN and Infinity;
`true` passes for 1 in Python. A value is a usable number only when it is none of these.
"""

from __future__ import annotations

import math
from typing import Any

from compressor_2.api_key import scrub

SHOWN_CHARS = 60  # of a refused value in a message, unless the caller says otherwise


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """`value` for a message: its repr with every API key masked, then cut to `limit`
    characters (masked first: a key cut in two no longer matches)."""
    text = scrub(repr(value))
    return text if len(text) <= limit else text[:limit] + "..."


def as_float(found: Any) -> float | None:
    """`found` as a finite float, or None: not a number, a bool, NaN, infinite, or an
    integer too large for a float."""
    if isinstance(found, bool) or not isinstance(found, (int, float)):
        return None
    try:
        converted = float(found)
    except OverflowError:
        return None
    return converted if math.isfinite(converted) else None


def as_count(found: Any, limit: int) -> int | None:
    """`found` as an integer in [0, `limit`), or None: a bool, a float (even 5.0), a string,
    a negative or a larger number."""
    return found if type(found) is int and 0 <= found < limit else None

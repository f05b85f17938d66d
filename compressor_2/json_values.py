"""Values read from JSON a user may have edited, as numbers and in messages.

JSON puts no limit on an integer's digits and Python's parser accepts NaN and Infinity;
`true` passes for 1 in Python. A value is a usable number only when it is none of these.
"""

from __future__ import annotations

import math
from typing import Any

SHOWN_CHARS = 60  # of a refused value in a message


def shown(value: Any) -> str:
    """`value` for a message: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


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

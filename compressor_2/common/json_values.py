"""Values read from JSON a user or a server may have written, as numbers and in messages.

JSON puts no limit on an integer's digits and Python's parser accepts NaN and Infinity;
`true` passes for 1 in Python. A value is a usable number only when it is none of these.
Python's parser itself refuses an integer of more than 4,300 digits (ValueError) and
nesting deeper than the recursion limit (RecursionError, which no `except ValueError`
catches): `loads_or_reason` says which.
"""

from __future__ import annotations

import json
import math
from typing import Any

from compressor_2.common.api_key import scrub

SHOWN_CHARS = 60  # of a refused value in a message, unless the caller says otherwise


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """`value` for a message: its repr with every API key masked, then cut to `limit`
    characters (masked first: a key cut in two no longer matches)."""
    text = scrub(repr(value))
    return text if len(text) <= limit else text[:limit] + "..."


def loads_or_reason(text: str | bytes) -> tuple[Any, str | None]:
    """(the value in `text`, None), or (None, why it cannot be read): "not JSON", "JSON with
    a number too long to read" or "JSON nested too deeply to read"."""
    try:
        return json.loads(text), None
    except (json.JSONDecodeError, UnicodeDecodeError):  # bytes not in a JSON encoding
        return None, "not JSON"
    except ValueError:  # an integer of more than 4,300 digits (sys.get_int_max_str_digits)
        return None, "JSON with a number too long to read"
    except RecursionError:
        return None, "JSON nested too deeply to read"


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

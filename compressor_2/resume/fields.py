"""Typed reads of the run files a user can edit by hand (evolution_state.json,
history.json): each read names the field it refuses, so that a loader can say in one line
which file and which field is wrong, before any work.

JSON has no integer type apart from numbers and lets `true` pass for 1 in Python; it also
carries NaN and Infinity. Neither is accepted where a count or a fitness is expected.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from compressor_2.common import as_float, shown

__all__ = ["FieldError", "as_float", "candidate_id", "integer", "is_candidate_id", "number", "shown", "typed",
           "value"]


class FieldError(ValueError):
    """A field is missing or holds the wrong kind of value; the message names it."""


def value(obj: Mapping[str, Any], key: str, where: str = "") -> Any:
    if key not in obj:
        raise FieldError(f"{where}{key} is missing")
    return obj[key]


def typed(obj: Mapping[str, Any], key: str, kind: type, what: str, where: str = "") -> Any:
    found = value(obj, key, where)
    if not isinstance(found, kind):
        raise FieldError(f"{where}{key} is {shown(found)}, not {what}")
    return found


def integer(obj: Mapping[str, Any], key: str, where: str = "", minimum: int = 0) -> int:
    found = value(obj, key, where)
    if isinstance(found, bool) or not isinstance(found, int) or found < minimum:
        raise FieldError(f"{where}{key} is {shown(found)}, not an integer >= {minimum}")
    return found


def number(obj: Mapping[str, Any], key: str, where: str = "", low: float = -math.inf,
           high: float = math.inf) -> float:
    found = value(obj, key, where)
    converted = as_float(found)
    if converted is None or not low <= converted <= high:
        bounds = f" in [{low:g}, {high:g}]" if math.isfinite(low) or math.isfinite(high) else ""
        raise FieldError(f"{where}{key} is {shown(found)}, not a finite number{bounds}")
    return converted


def is_candidate_id(found: Any) -> bool:
    """A candidate id as JSON holds one: an integer >= 1 (not `true`)."""
    return isinstance(found, int) and not isinstance(found, bool) and found >= 1


def candidate_id(found: Any, where: str) -> int:
    """`found`, read at `where`, as a candidate id (whether the archive holds it is the caller's)."""
    if not is_candidate_id(found):
        raise FieldError(f"{where} is {shown(found)}, not a candidate id")
    return int(found)

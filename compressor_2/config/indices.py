"""Index lists: 'all', or 0-based indices and inclusive ranges such as '0,3,5-9' (the
training pool, the held-out questions, GEPA's valset), and the rule each keeps: every
index once. A question named twice would weigh double in whatever is averaged over the
list, so a repeat is refused, never silently dropped."""

from __future__ import annotations

import re

from compressor_2.common import ConfigError

INDICES = r"all|[0-9]+(-[0-9]+)?(\s*,\s*[0-9]+(-[0-9]+)?)*"  # the whole syntax, 'all' included
_PART = re.compile(r"([0-9]+)(?:-([0-9]+))?")


def repeated(spec: str) -> tuple[int, str, str] | None:
    """The smallest index `spec` names twice and the two parts (as written, in their order)
    that name it, or None. Ranges are compared as intervals, so '0-999999999' costs nothing;
    parts that are not an index or an ascending range are left to the syntax's checks."""
    spans = []
    for position, part in enumerate(p.strip() for p in spec.split(",")):
        match = _PART.fullmatch(part)
        if match is not None and int(match.group(2) or match.group(1)) >= int(match.group(1)):
            spans.append((int(match.group(1)), int(match.group(2) or match.group(1)), position, part))
    widest: tuple[int, int, int, str] | None = None  # the span reaching furthest among those before
    for span in sorted(spans):
        if widest is not None and span[0] <= widest[1]:
            first, second = sorted((widest, span), key=lambda s: s[2])
            return span[0], first[3], second[3]
        if widest is None or span[1] > widest[1]:
            widest = span
    return None


def check_each_once(spec: str, source: str, what: str = "index") -> None:
    """Refuses, naming `source` (how the user set `spec`), an index given twice."""
    if (found := repeated(spec)) is not None:
        index, first, second = found
        both = f"{first!r} and {second!r}" if first != second else f"{first!r} twice"
        raise ConfigError(f"{source}={spec!r} names {what} {index} more than once ({both}): a question listed "
                          "twice would count twice; list each once")

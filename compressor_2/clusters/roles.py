"""Clusters by role (CONFIG_ROLE_CLUSTERS=y): the tokens that lay an answer out or punctuate
it, each role a cluster of its own before k-means, as the end tokens (cluster "0") and the
numbers (cluster "1") are. On SmolLM2 the stop oracle (findings/stop_oracle.py) finds the
padding after an answer's last needed token made of words, the closing full stop and line
breaks that open further lines, while commas and colons mostly stay (they build figures);
in k-means all of them share one cluster with markup, so no delta could move one without
the others (docs/clusters.md).

The rule reads a token's decoded text. Its core is the text without whitespace and the
word-boundary markers (`strip_markers`, as the numbers' rule reads it); a token is in
the first role it passes, in this order:

1. line breaks: the text holds a line break, and its core is empty or made only of
   punctuation and markup (`\\n`, `\\n\\n`, ` \\n`, `.\\n`, `:\\n\\n`, `**\\n`);
2. markup: the core is made only of punctuation and markup and holds a markup character
   (`MARKUP`: `* # | _ ~ ` > =`, dashes, bullets), so `**`, `###`, `|`, `---`, `•`, `**:`;
3. sentence ends: the core is made only of punctuation and holds a sentence end
   (`SENTENCE_ENDS`: `. ! ? …`), so `.`, `...`, `?`, `.)`, `."`;
4. clause punctuation: the core is punctuation (Unicode category P), so `,`, `:`, `;`,
   `(`, `"`, `'`.

Letters, digits and symbols (`$`, `©`, `°`) are in no role; neither is a token of spaces
alone. A single `-`, `*`, `+`, `=` is an operator and stays a number (cluster "1"), and the
EOS, number and unsteered tokens keep their places: roles take only what k-means would
have had.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from compressor_2.clusters.special import strip_markers
from compressor_2.config import Config

# Bump when the rules below change: part of a role build's build digest (a build
# without roles records none, so its build digest is what it always was).
ROLES_VERSION = "1"
FIRST_ROLE_ID = 2  # after the EOS cluster "0" and the numbers cluster "1"

LINE_BREAKS = frozenset("\n\r\u2028\u2029\x0b\x0c\x85")
MARKUP = frozenset("*#|_~`>=<+^-\u2010\u2011\u2012\u2013\u2014\u2015\u2022\u2023\u2043\u25aa\u25cf\u25e6\u00b7\u2219")
SENTENCE_ENDS = frozenset(".!?\u2026\u3002\uff01\uff1f")


def _punctuation(char: str) -> bool:
    return unicodedata.category(char).startswith("P")


def _marks(core: str) -> bool:
    """Made only of punctuation and markup characters (and not empty)."""
    return bool(core) and all(c in MARKUP or _punctuation(c) for c in core)


def is_line_break(text: str) -> bool:
    core = strip_markers(text)
    return any(c in LINE_BREAKS for c in text) and (not core or _marks(core))


def is_markup(text: str) -> bool:
    core = strip_markers(text)
    return _marks(core) and any(c in MARKUP for c in core)


def is_sentence_end(text: str) -> bool:
    core = strip_markers(text)
    return _marks(core) and all(_punctuation(c) for c in core) and any(c in SENTENCE_ENDS for c in core)


def is_clause_punctuation(text: str) -> bool:
    core = strip_markers(text)
    return bool(core) and all(_punctuation(c) for c in core)


@dataclass(frozen=True)
class Role:
    name: str
    description: str  # what the reflector reads of its cluster
    rule: Callable[[str], bool]


ROLES: tuple[Role, ...] = (
    Role("line breaks", "Line breaks (with the punctuation or markup on their line): raising this delta starts "
         "new lines (lists, repeated lines); lowering it keeps an answer on one line.", is_line_break),
    Role("markup", "Markdown and list markup: ** bold, # headings, | table bars, --- rules, bullets, _ and ` "
         "(a single - or * is an operator, in the numbers cluster).", is_markup),
    Role("sentence ends", "Sentence ends: the full stop, ! ? and ellipses (also the decimal point where the "
         "tokenizer splits digits apart).", is_sentence_end),
    Role("clause punctuation", "Clause punctuation: , : ; brackets and quotes (also the thousands separator "
         "where the tokenizer splits digits apart).", is_clause_punctuation),
)


def role_ids(count: int = len(ROLES)) -> list[str]:
    """The cluster ids of the roles, in ROLES' order."""
    return [str(FIRST_ROLE_ID + i) for i in range(count)]


def cluster_count(config: Config) -> int:
    """How many clusters a build for `config` makes: EOS, numbers, the roles when on, k-means."""
    return FIRST_ROLE_ID + (len(ROLES) if config.role_clusters else 0) + config.num_clusters


def role_of(text: str) -> int | None:
    """The index in ROLES of the first role `text` passes, or None."""
    return next((i for i, role in enumerate(ROLES) if role.rule(text)), None)


def role_token_ids(texts: Sequence[str], exclude: frozenset[int]) -> list[list[int]]:
    """Per role, the ids of the decoded `texts` (index = token id) in it, `exclude` aside."""
    found: list[list[int]] = [[] for _ in ROLES]
    for i, text in enumerate(texts):
        if i not in exclude and (role := role_of(text)) is not None:
            found[role].append(i)
    return found

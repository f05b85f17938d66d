"""Deltas by answer phase: which of a row's P delta vectors steers its next token.

A row's phase is read from the tokens it has generated so far, by a small DFA over token
classes, advanced by each new token (never a re-scan of the answer):

- a token's class comes from its decoded text, normalised as the clusters normalise it
  (`clusters.special.strip_markers`: whitespace and the markers Ġ ▁ ## removed). In this
  order: DIGIT (non-empty, only decimal digits and the figure chars `. , %`, at least one
  digit: "1", " 2018", "3.5%"), NEWLINE (the raw text holds a line break: "\\n", ".\\n",
  ":\\n\\n"), JOIN (exactly one of `, . %`: what may continue a figure, "1" "," "234"),
  OTHER (everything else; the end tokens and the unsteered special tokens always);
- the states: BEFORE (no digit yet), FIGURE (the last token was a DIGIT),
  JOIN_AFTER_FIGURE (a JOIN right after a figure), AFTER (a figure was completed),
  AFTER_LINE (a line break once a figure was completed, or one that completed it);
- a state's phase: with 2 phases, 0 until the first complete figure and 1 after it; with 3,
  the line break after it starts phase 2. One phase: always 0, and nothing here runs.

`phase_sequence` is the one reference: every implementation (the transformers decode loop
and its `generate` processor, the SGLang processor and its standalone copy) is tested
exact against it. On a device a step is two gathers: the new token's class, then the
state's row of `TRANSITIONS`; no host sync.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from compressor_2.clusters.special import strip_markers

if TYPE_CHECKING:
    # Imported where a tensor is made: the reference and the token classes serve readers
    # (the reflector's evidence, a warm cluster build) that never load torch.
    import torch

OTHER, DIGIT, JOIN, NEWLINE = 0, 1, 2, 3
CLASSES = 4
BEFORE, FIGURE, JOIN_AFTER_FIGURE, AFTER, AFTER_LINE = 0, 1, 2, 3, 4
STATES = 5
# deltas.MAX_PHASES, which this module cannot import: it is imported inside SGLang
# servers, without the package's dependencies.
_MAX_PHASES = 3
FIGURE_CHARS = frozenset(".,%")

# TRANSITIONS[state][class]: the state after a token of that class.
TRANSITIONS: tuple[tuple[int, ...], ...] = (
    # OTHER       DIGIT   JOIN               NEWLINE
    (BEFORE,      FIGURE, BEFORE,            BEFORE),      # BEFORE
    (AFTER,       FIGURE, JOIN_AFTER_FIGURE, AFTER_LINE),  # FIGURE
    (AFTER,       FIGURE, AFTER,             AFTER_LINE),  # JOIN_AFTER_FIGURE
    (AFTER,       AFTER,  AFTER,             AFTER_LINE),  # AFTER
    (AFTER_LINE,  AFTER_LINE, AFTER_LINE,    AFTER_LINE),  # AFTER_LINE
)
# STATE_PHASES[phases - 1][state]: the phase, i.e. which delta vector steers.
STATE_PHASES: tuple[tuple[int, ...], ...] = (
    (0, 0, 0, 0, 0),
    (0, 0, 0, 1, 1),
    (0, 0, 0, 1, 2),
)


def token_class(text: str) -> int:
    """The class of one decoded token text (see the module docstring)."""
    core = strip_markers(text)
    if core and all(c.isdecimal() or c in FIGURE_CHARS for c in core) and any(c.isdecimal() for c in core):
        return DIGIT
    if "\n" in text:
        return NEWLINE
    if len(core) == 1 and core in FIGURE_CHARS:
        return JOIN
    return OTHER


def token_classes(texts: Iterable[str], other_ids: Iterable[int] = ()) -> np.ndarray:
    """(vocab,) int8: the class of each decoded text (index = token id); `other_ids` (the
    end and special tokens) are OTHER whatever their text."""
    classes = np.fromiter((token_class(text) for text in texts), dtype=np.int8)
    others = [i for i in other_ids if i < len(classes)]
    classes[others] = OTHER
    return classes


def vocabulary_classes(vocabulary: Any) -> np.ndarray:
    """`token_classes` of a `clusters.vocab.Vocabulary`: its texts, its end and unsteered
    tokens OTHER."""
    return token_classes(vocabulary.texts, vocabulary.eos_ids | vocabulary.unsteered_ids)


def check_phases(phases: int) -> int:
    if not isinstance(phases, int) or isinstance(phases, bool) or not 1 <= phases <= _MAX_PHASES:
        raise ValueError(f"phases must be an int from 1 to {_MAX_PHASES}, got {phases!r}")
    return phases


def phase_sequence(ids: Sequence[int], classes: Sequence[int], phases: int) -> list[int]:
    """The reference: element i is the phase whose deltas steer the choice of `ids[i]`,
    i.e. the phase of the state after `ids[:i]`. An id past `classes` is OTHER."""
    by_state = STATE_PHASES[check_phases(phases) - 1]
    state, out = BEFORE, []
    for token in ids:
        out.append(by_state[state])
        state = TRANSITIONS[state][int(classes[token]) if 0 <= token < len(classes) else OTHER]
    return out


def phase_rows(deltas: torch.Tensor, phases: int) -> torch.Tensor:
    """(rows, phases * clusters) phase-major deltas -> (rows, STATES, clusters + 1): each
    state's delta row and the zero column unsteered tokens read, so a step selects a row's
    bias row by its state alone."""
    import torch

    rows = deltas.shape[0]
    per_phase = torch.nn.functional.pad(deltas.reshape(rows, phases, -1), (0, 1))
    return per_phase[:, list(STATE_PHASES[phases - 1])]


@dataclass(frozen=True)
class PhaseTables:
    """The DFA on a device: `classes` is (vocab + 1,) long, its last entry OTHER for any id
    past the vocabulary (a model's padding columns); `transitions` is TRANSITIONS flat."""

    phases: int
    classes: torch.Tensor
    transitions: torch.Tensor

    @classmethod
    def make(cls, classes: np.ndarray, phases: int, device: torch.device | str) -> PhaseTables:
        import torch

        padded = np.append(np.asarray(classes, dtype=np.int64), OTHER)
        return cls(check_phases(phases), torch.as_tensor(padded, device=device),
                   torch.tensor(TRANSITIONS, device=device).flatten())

    def start(self, rows: int) -> torch.Tensor:
        """Every row BEFORE, as a (rows,) long state."""
        import torch

        return torch.full((rows,), BEFORE, dtype=torch.long, device=self.classes.device)

    def advance(self, states: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The states after each row's new token: two gathers, no host sync."""
        last = self.classes.shape[0] - 1
        token_class = self.classes.index_select(0, tokens.clamp(0, last))
        return self.transitions.index_select(0, states * CLASSES + token_class)

    @staticmethod
    def select(table: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """(rows, STATES, clusters + 1) -> each row's (clusters + 1) row for its state."""
        import torch

        return table[torch.arange(table.shape[0], device=table.device), states]

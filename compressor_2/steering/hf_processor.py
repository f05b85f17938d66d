"""The steering bias as a transformers `LogitsProcessor`: one delta row per sequence.

A batch's deltas do not change while it decodes, so the (rows, width) bias is built
once, at the first step, and every later step is a single in-place tensor add.
In place because `generate` hands processors a private float32 copy of the logits and
a fresh (rows, vocab) tensor per step costs several times the add itself on a CPU; the
one thing it changes is `output_logits=True`, which the engine never asks for.

With phases (`phases.PhaseTables`) the deltas are (rows, phases * clusters) and a row's
bias follows its DFA state: the processor keeps each row's state and how many of
`input_ids`' columns it has read, advances the states by the new columns only, and adds
each row's state's row of a (rows, STATES, clusters + 1) table (a gather and an add, as
the decode loop does).
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor

from compressor_2.steering.bias import add_bias, bias_matrix, gather_index
from compressor_2.steering.phases import PhaseTables, phase_rows


class DeltaBiasProcessor(LogitsProcessor):
    """Adds `deltas_rows[i][token_clusters[t]]` to the logit of token t in row i."""

    def __init__(self, deltas_rows: torch.Tensor, token_clusters: torch.Tensor,
                 phases: PhaseTables | None = None) -> None:
        if deltas_rows.ndim != 2:
            raise ValueError(f"deltas_rows must be (rows, clusters), got shape {tuple(deltas_rows.shape)}")
        self.deltas_rows = deltas_rows
        self.token_clusters = token_clusters
        self._bias: torch.Tensor | None = None
        self.phases = phases if phases is not None and phases.phases > 1 else None
        self._states: torch.Tensor | None = None
        self._table = self._index = torch.empty(0)  # made at the first phased call
        self._seen = 0  # columns of input_ids the states have read

    def bias_for(self, scores: torch.Tensor) -> torch.Tensor:
        """The (rows, width) bias matching `scores`, built on first use."""
        self._check_rows(scores)
        bias = self._bias
        if bias is None or bias.shape[1] != scores.shape[1] or bias.device != scores.device \
                or bias.dtype != scores.dtype:
            bias = bias_matrix(
                self.deltas_rows.to(device=scores.device, dtype=scores.dtype),
                self.token_clusters.to(scores.device),
                scores.shape[1],
            )
            self._bias = bias
        return bias

    def _check_rows(self, scores: torch.Tensor) -> None:
        if scores.shape[0] != self.deltas_rows.shape[0]:
            # Beam search or sampling with several return sequences would silently
            # shift rows against their deltas.
            raise ValueError(
                f"{scores.shape[0]} score rows for {self.deltas_rows.shape[0]} delta rows"
            )

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        if self.phases is None:
            return scores.add_(self.bias_for(scores))
        return self._phased(input_ids, scores)

    def _phased(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """scores + each row's bias for its state; the first call sees the prompts alone."""
        phases = self.phases
        assert phases is not None
        if self._states is None:
            self._check_rows(scores)
            clusters = self.deltas_rows.shape[1] // phases.phases
            self._table = phase_rows(self.deltas_rows.to(device=scores.device, dtype=scores.dtype), phases.phases)
            self._index = gather_index(self.token_clusters.to(scores.device), clusters)[:scores.shape[1]]
            self._states, self._seen = phases.start(scores.shape[0]), input_ids.shape[1]
        for column in range(self._seen, input_ids.shape[1]):
            self._states = phases.advance(self._states, input_ids[:, column])
        self._seen = input_ids.shape[1]
        return add_bias(scores, PhaseTables.select(self._table, self._states), self._index)

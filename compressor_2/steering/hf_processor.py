"""The steering bias as a transformers `LogitsProcessor`: one delta row per sequence.

A batch's deltas do not change while it decodes, so the (rows, width) bias is built
once, at the first step, and every later step is a single in-place tensor add.
In place because `generate` hands processors a private float32 copy of the logits and
a fresh (rows, vocab) tensor per step costs several times the add itself on a CPU; the
one thing it changes is `output_logits=True`, which the engine never asks for.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor

from compressor_2.steering.bias import bias_matrix


class DeltaBiasProcessor(LogitsProcessor):
    """Adds `deltas_rows[i][token_clusters[t]]` to the logit of token t in row i."""

    def __init__(self, deltas_rows: torch.Tensor, token_clusters: torch.Tensor) -> None:
        if deltas_rows.ndim != 2:
            raise ValueError(f"deltas_rows must be (rows, clusters), got shape {tuple(deltas_rows.shape)}")
        self.deltas_rows = deltas_rows
        self.token_clusters = token_clusters
        self._bias: torch.Tensor | None = None

    def bias_for(self, scores: torch.Tensor) -> torch.Tensor:
        """The (rows, width) bias matching `scores`, built on first use."""
        if scores.shape[0] != self.deltas_rows.shape[0]:
            # Beam search or sampling with several return sequences would silently
            # shift rows against their deltas.
            raise ValueError(
                f"{scores.shape[0]} score rows for {self.deltas_rows.shape[0]} delta rows"
            )
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

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        del input_ids
        return scores.add_(self.bias_for(scores))

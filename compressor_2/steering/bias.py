"""(deltas, token_clusters) -> logit bias: the steering arithmetic, in one place.

`token_clusters[t]` is the cluster id of token t (an index into the canonical delta
list). Logits are often wider than the tokenizer's vocabulary: those extra columns
get bias 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def bias_matrix(
    deltas_rows: torch.Tensor, token_clusters: torch.Tensor, width: int
) -> torch.Tensor:
    """One bias row per delta row: shape (rows, width).

    `deltas_rows` is (rows, clusters) float; `token_clusters` is (vocab,) long.
    """
    rows = deltas_rows.shape[0]
    vocab = min(int(token_clusters.shape[0]), width)
    bias = torch.zeros((rows, width), dtype=deltas_rows.dtype, device=deltas_rows.device)
    bias[:, :vocab] = deltas_rows.index_select(1, token_clusters[:vocab])
    return bias


def bias_vector(deltas: Sequence[float], token_clusters: torch.Tensor, width: int) -> torch.Tensor:
    """The single-row form: shape (width,)."""
    rows = torch.tensor([list(deltas)], dtype=torch.float32, device=token_clusters.device)
    return bias_matrix(rows, token_clusters, width)[0]


def apply_bias(
    logits: torch.Tensor, deltas_rows: torch.Tensor, token_clusters: torch.Tensor
) -> torch.Tensor:
    """logits (rows, width) + the bias of each row's deltas, in place; returns logits."""
    deltas_rows = deltas_rows.to(device=logits.device, dtype=logits.dtype)
    token_clusters = token_clusters.to(logits.device)
    vocab = min(int(token_clusters.shape[0]), logits.shape[1])
    logits[:, :vocab] += deltas_rows.index_select(1, token_clusters[:vocab])
    return logits

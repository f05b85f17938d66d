"""(deltas, token_clusters) -> logit bias: the steering arithmetic, in one place.

`token_clusters[t]` is the cluster id of token t (an index into the canonical delta
list), or UNSTEERED (-1) for a special or added token that no delta may move. Logits
are often wider than the tokenizer's vocabulary: those extra columns get bias 0, and so
do unsteered tokens, whatever the deltas.

Every row of deltas gets one zero column appended (a "table" row), and an unsteered
token reads that column: `gather_index` turns a map into the index that does it, once
per map, so a decode step pays one gather as before (indexing with -1 directly costs
~1.6x on a CPU). `add_bias` is that step, a table already made: one gather, one add.
`gather_index` and `add_bias` use tensor methods only: `generate-processor` copies
their source into a module that has no `torch` global.
"""

from __future__ import annotations

import torch


def gather_index(token_clusters: torch.Tensor, clusters: int) -> torch.Tensor:
    """The index `add_bias` gathers with: a token's cluster, and `clusters` (the zero
    column appended to rows of `clusters` deltas) for an unsteered token (-1)."""
    return token_clusters.where(token_clusters >= 0, clusters)


def bias_matrix(
    deltas_rows: torch.Tensor, token_clusters: torch.Tensor, width: int
) -> torch.Tensor:
    """One bias row per delta row: shape (rows, width).

    `deltas_rows` is (rows, clusters) float; `token_clusters` is (vocab,) long.
    """
    rows = deltas_rows.shape[0]
    vocab = min(int(token_clusters.shape[0]), width)
    bias = torch.zeros((rows, width), dtype=deltas_rows.dtype, device=deltas_rows.device)
    index = gather_index(token_clusters[:vocab], deltas_rows.shape[1])
    bias[:, :vocab] = torch.nn.functional.pad(deltas_rows, (0, 1)).index_select(1, index)
    return bias


def add_bias(logits: torch.Tensor, table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """logits (rows, width) + each row's bias, in place; returns logits. `table` is (rows,
    clusters + 1) in the logits' dtype and device, its last column 0; `index` is
    `gather_index` of the cluster map on that device, no longer than the logits are wide
    (the columns past it, the model's padding, get no bias)."""
    bias = table.index_select(1, index)
    if index.shape[0] == logits.shape[1]:
        return logits.add_(bias)
    logits.narrow(1, 0, index.shape[0]).add_(bias)
    return logits


def apply_bias(logits: torch.Tensor, deltas_rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """logits (rows, width) + the bias of each row's deltas, in place; returns logits.
    `index` is `gather_index` of the cluster map for rows of this many deltas. The deltas
    are cast to the logits' dtype first, so the add is in that dtype. The one-shot form,
    and the reference the SGLang processor's steps are held to (it keeps the table)."""
    rows, clusters = deltas_rows.shape
    table = logits.new_zeros((rows, clusters + 1))  # the zero column unsteered tokens read
    table[:, :clusters] = deltas_rows
    return add_bias(logits, table, index.to(logits.device)[: logits.shape[1]])

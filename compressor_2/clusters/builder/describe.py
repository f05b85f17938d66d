"""cluster_descriptions.json: per cluster id a description, its size and 20 representative
tokens. The reflector reads it to know what each delta steers. The unsteered tokens, in
no cluster, are described apart (`unsteered`): the build records and prints them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from compressor_2.clusters.layout import UNSTEERED
from compressor_2.clusters.roles import FIRST_ROLE_ID, Role
from compressor_2.clusters.vocab import Vocabulary

REPRESENTATIVES = 20
EOS_DESCRIPTION = (
    "End of sequence / end of turn: the model's EOS/EOT tokens only. "
    "Raising this delta makes answers stop sooner; lowering it makes them run on."
)
NUMBER_DESCRIPTION = (
    "Numbers and arithmetic: tokens made only of digits, money and percent signs "
    "($ % ...), operators (+ - * / = ...) and the separators . , ( ) of numbers."
)


def _distinct(vocab: Vocabulary, ids: Iterable[int]) -> list[str]:
    """Display texts of `ids` in order, without repeats, at most REPRESENTATIVES."""
    seen: dict[str, None] = {}
    for i in ids:
        seen.setdefault(vocab.display(int(i)), None)
        if len(seen) == REPRESENTATIVES:
            break
    return list(seen)


UNSTEERED_DESCRIPTION = (
    "Special and added tokens other than EOS: in no cluster, and bias 0 whatever the deltas "
    "(no delta can make the model emit one)."
)


def _entry(description: str, size: int, tokens: list[str]) -> dict:
    return {"description": description, "size": size, "tokens": tokens}


def describe_clusters(
    vocab: Vocabulary,
    token_clusters: np.ndarray,
    points: np.ndarray,
    centers: np.ndarray,
    roles: Sequence[Role] = (),
) -> dict[str, dict]:
    """`points[j]` is the reduced embedding of the j-th k-means token (ascending id);
    `centers[c]` the centre of k-means label c, i.e. cluster id c + 2 + len(roles); role i
    is cluster FIRST_ROLE_ID + i."""
    eos = np.flatnonzero(token_clusters == 0)
    numbers = np.flatnonzero(token_clusters == 1)
    descriptions = {
        # Lower ids of BPE vocabularies were merged earlier: the commoner tokens first.
        "0": _entry(EOS_DESCRIPTION, len(eos), _distinct(vocab, eos)),
        "1": _entry(NUMBER_DESCRIPTION, len(numbers), _distinct(vocab, numbers)),
    }
    for index, role in enumerate(roles):
        members = np.flatnonzero(token_clusters == FIRST_ROLE_ID + index)
        descriptions[str(FIRST_ROLE_ID + index)] = _entry(role.description, len(members), _distinct(vocab, members))
    first = FIRST_ROLE_ID + len(roles)
    kmeans_ids = np.flatnonzero(token_clusters >= first)
    labels = token_clusters[kmeans_ids] - first
    for label, center in enumerate(centers):
        members = np.flatnonzero(labels == label)
        distance = np.linalg.norm(points[members] - center, axis=1)
        nearest = kmeans_ids[members[np.argsort(distance, kind="stable")]]
        tokens = _distinct(vocab, nearest)
        shown = ", ".join(repr(t) for t in tokens[:8])
        descriptions[str(label + first)] = _entry(
            f"k-means cluster of {len(members):,} tokens; nearest its centre: {shown}",
            len(members), tokens,
        )
    return descriptions


def unsteered(vocab: Vocabulary, token_clusters: np.ndarray) -> dict:
    """The description of the tokens in no cluster: how many, and the first of them."""
    ids = np.flatnonzero(token_clusters == UNSTEERED)
    return _entry(UNSTEERED_DESCRIPTION, len(ids), _distinct(vocab, ids))

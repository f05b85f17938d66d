"""The archive strategy's options and its arithmetic as small pure functions: parent weights, typed
issues, the cluster each names and their sampling in batches by type, and the feedback
memory's scopes over a lineage graph."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np

from compressor_2.deltas import gene_ids, phase_count, split_gene
from compressor_2.fitness import Record

PADDED_RATIO = 2.0  # correct, but at least this many times the gold answer's tokens
EOS_CLUSTER, NUMBERS_CLUSTER = "0", "1"
_REFUSAL = ("cannot", "can't", "unable", "not possible", "no information", "not provided", "not available",
            "i don't know", "insufficient")
ISSUE_TYPES = ("cut_short", "wrong", "padded", "refusal")
ARCHIVE_GENERATORS = ("cluster", "vector", "crossover")
FEEDBACK_SCOPES = ("none", "ancestors", "neighborhood")
# Bounds that keep the parent weights' arithmetic finite: exp(sharpness x (fitness - midpoint)) with
# both in [0, 1], (1 + children) ** novelty_weight, and the sum of the issue weights.
MAX_SHARPNESS = 100.0
MAX_NOVELTY_WEIGHT = 10.0
MAX_ISSUE_WEIGHT = 1e6
MAX_POSTCHECK_MARGIN = 1e6  # summed per-example scores, each at most 1


@dataclass(frozen=True)
class ArchiveOptions:
    """The archive strategy's options (CONFIG_ARCHIVE_*)."""

    iterations: int
    parents_per_iteration: int
    replace: bool
    sharpness: float
    midpoint: float | None  # a fixed midpoint, or
    midpoint_percentile: float | None  # a percentile of the archive's fitness values
    novelty_weight: float
    min_correctness: float  # viability: a fraction of the seed candidate's correctness
    issue_batch: int
    issue_weights: tuple[tuple[str, float], ...]
    generators: tuple[str, ...]
    generation_concurrency: int
    assessment_concurrency: int
    feedback_scope: str
    feedback_depth: int
    postcheck_examples: int
    postcheck_margin: float
    delta_limit: float


# -- parent selection ---------------------------------------------------------------------

def midpoint_of(scores: Sequence[float], fixed: float | None, percentile: float | None) -> float:
    """The sigmoid's midpoint: a fixed value, or a percentile of the archive's scores."""
    if percentile is not None:
        return float(np.percentile(np.asarray(scores, dtype=float), percentile))
    assert fixed is not None
    return fixed


def parent_weights(scores: Sequence[float], children: Sequence[int], sharpness: float, midpoint: float,
                   novelty_weight: float) -> list[float]:
    """weight = sigmoid(sharpness x (score - midpoint)) x 1 / (1 + children)^novelty_weight
    (the Darwin Goedel Machine's parent choice: quality x novelty)."""
    return [1.0 / (1.0 + math.exp(-sharpness * (s - midpoint))) / (1.0 + c) ** novelty_weight
            for s, c in zip(scores, children, strict=True)]


def viability_threshold(min_correctness: float, seed_correctness: float) -> float:
    """Viability for delta vectors: the least correctness a parent may have, a
    fraction of the seed candidate's."""
    return min_correctness * seed_correctness


def sample_parents(ids: Sequence[int], weights: Sequence[float], k: int, replace: bool,
                   rng: random.Random) -> list[int]:
    """`k` ids drawn in proportion to `weights`, with or without replacement (then at most
    every id once)."""
    if replace:
        return rng.choices(list(ids), weights=list(weights), k=k)
    pool, w, chosen = list(ids), list(weights), []
    for _ in range(min(k, len(pool))):
        i = rng.choices(range(len(pool)), weights=w)[0]
        chosen.append(pool.pop(i))
        w.pop(i)
    return chosen


# -- issues -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Issue:
    """A trainable defect of one answer; `id` (example id + type) is stable across
    candidates. `cluster` is the genome id it names: the delta a single-cluster move turns
    for it (`named_cluster`, with answer phases in its phase: `issue_gene`)."""

    id: str
    type: str
    record: Record
    gold_tokens: int
    cluster: str


def is_refusal_issue(answer: str) -> bool:
    text = answer.lower()
    return not any(ch.isdigit() for ch in text) and any(phrase in text for phrase in _REFUSAL)


def named_cluster(kind: str, tokens: int, gold_tokens: int, padding: Sequence[int],
                  cluster_ids: Sequence[str]) -> str:
    """The cluster an issue names. cut_short: EOS (the answer stopped too soon); a wrong
    answer of about the gold's length: the numbers cluster (a wrong figure); otherwise
    (padded, a refusal, a long wrong answer) the cluster holding most of the answer's
    padding, its tokens the gold answer does not have (`padding`, per cluster index), and
    EOS when it has none."""
    if kind == "cut_short":
        return EOS_CLUSTER
    if kind == "wrong" and tokens < PADDED_RATIO * gold_tokens:
        return NUMBERS_CLUSTER if NUMBERS_CLUSTER in cluster_ids else EOS_CLUSTER
    counts = np.asarray(padding)
    return cluster_ids[int(np.argmax(counts))] if counts.any() else EOS_CLUSTER


def issue_gene(kind: str, tokens: int, gold_tokens: int, cluster: str, phases: int) -> str:
    """The genome id an issue's cluster moves with `phases` answer phases: the phase where the
    issue's tokens sit, read from its type (not from the answer): a refusal (no figure at
    all), an answer cut short and a wrong figure of about the gold's length are before the
    answer's first complete figure (phase 0); padding comes after it (the last phase)."""
    if phases == 1:
        return cluster
    before = kind in ("refusal", "cut_short") or (kind == "wrong" and tokens < PADDED_RATIO * gold_tokens)
    return gene_ids([cluster], phases)[0 if before else -1]


def issues_of(records: Sequence[Record], gold_tokens: Mapping[str, int],
              padding: Callable[[Record], Sequence[int]], genes: Sequence[str]) -> list[Issue]:
    """refusal: incorrect, no figure and a refusal phrase; cut_short: incorrect and shorter
    than the gold answer; wrong: incorrect otherwise; padded: correct but at least
    PADDED_RATIO x the gold's tokens. Each names its cluster (`named_cluster`) among the
    genome's ids `genes`, in its answer phase (`issue_gene`)."""
    phases = phase_count(genes)
    cluster_ids = [cid for phase, cid in map(split_gene, genes) if phase == 0]
    found = []
    for r in records:
        gold = max(gold_tokens[r.id], 1)
        if not r.is_correct:
            kind = "refusal" if is_refusal_issue(r.answer) else "cut_short" if r.tokens < gold else "wrong"
        elif r.tokens >= PADDED_RATIO * gold:
            kind = "padded"
        else:
            continue
        cluster = named_cluster(kind, r.tokens, gold, padding(r), cluster_ids)
        found.append(Issue(f"{r.id}:{kind}", kind, r, gold, issue_gene(kind, r.tokens, gold, cluster, phases)))
    return found


def sample_issue_batch(issues: Sequence[Issue], weights: Mapping[str, float], k: int,
                       rng: random.Random) -> list[Issue]:
    """Issue batches sampled by issue type: one type, drawn in proportion to its
    weight times its number of issues (as if one issue were drawn weighted by its type),
    then up to `k` distinct issues of that type. Empty when no issue has a weighted type."""
    by_type: dict[str, list[Issue]] = {}
    for issue in issues:
        if weights.get(issue.type, 0.0) > 0:
            by_type.setdefault(issue.type, []).append(issue)
    if not by_type:
        return []
    types = list(by_type)
    [kind] = rng.choices(types, weights=[weights[t] * len(by_type[t]) for t in types])
    return rng.sample(by_type[kind], min(k, len(by_type[kind])))


def batch_target(batch: Sequence[Issue], genes: Sequence[str] = (EOS_CLUSTER,)) -> str:
    """The cluster a batch names: the one most of its issues name (on a tie, the first drawn's);
    for an empty batch EOS, in the last answer phase of the genome's ids `genes`."""
    if not batch:
        return gene_ids([EOS_CLUSTER], phase_count(genes))[-1]
    named = Counter(i.cluster for i in batch)
    return max(named, key=lambda c: named[c])  # max keeps the first of equals: the first drawn


# -- feedback memory ----------------------------------------------------------------------

def feedback_scope(graph: nx.DiGraph, candidate: int, mode: str, depth: int) -> list[int]:
    """The candidates whose feedback entries a generator working on `candidate` sees:
    none; its ancestors up to `depth` generations back (itself included); or its
    neighbourhood up to `depth` lineage edges away in either direction."""
    if mode == "none":
        return []
    if mode == "ancestors":
        lengths = nx.single_source_shortest_path_length(graph.reverse(copy=False), candidate, cutoff=depth)
    elif mode == "neighborhood":
        lengths = nx.single_source_shortest_path_length(graph.to_undirected(as_view=True), candidate,
                                                        cutoff=depth)
    else:
        raise ValueError(f"unknown feedback scope {mode!r}")
    return sorted(lengths)

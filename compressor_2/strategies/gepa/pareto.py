"""GEPA 0.1.4's arithmetic as pure functions over per-example valset scores:
the Pareto front, domination, candidate selection, the epoch-shuffled minibatch sampler,
the common-ancestor search, the merge of two descendants by components, and the
stratified subsample a merge is tested on. A program is a candidate id; its components
are its cluster deltas."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

Scores = Mapping[int, Mapping[str, float]]  # candidate -> valset example -> score


# -- the front ----------------------------------------------------------------------------

def example_fronts(scores: Scores) -> dict[str, tuple[float, set[int]]]:
    """Per valset example, its front: the best score and the candidates that reach it (GEPA's
    Pareto front over instances; the tokens-versus-correctness front is findings/front.py's)."""
    front: dict[str, tuple[float, set[int]]] = {}
    for cid in sorted(scores):
        for example, score in scores[cid].items():
            best, holders = front.get(example, (-math.inf, set()))
            if score > best:
                front[example] = (score, {cid})
            elif score == best:
                holders.add(cid)
    return front


def is_dominated(y: int, programs: set[int], fronts: Sequence[set[int]]) -> bool:
    """`y` is dominated when, on every example whose front holds it, another of
    `programs` is on that front too."""
    held = [front for front in fronts if y in front]
    return bool(held) and all(front & (programs - {y}) for front in held)


def remove_dominated(fronts: Sequence[set[int]], aggregate: Mapping[int, float]) -> set[int]:
    """The front's programs minus those dominated, the lowest aggregate checked first."""
    programs = set().union(*fronts) if fronts else set()
    for y in sorted(programs, key=lambda p: (aggregate[p], p)):
        if is_dominated(y, programs, fronts):
            programs.discard(y)
    return programs


def select_from_front(fronts: Sequence[set[int]], aggregate: Mapping[int, float], rng: random.Random) -> int:
    """GEPA's `pareto` selector: a non-dominated program, drawn in proportion to the number
    of examples on whose front it stands."""
    dominators = remove_dominated(fronts, aggregate)
    counts = {p: sum(p in front for front in fronts) for p in sorted(dominators)}
    return rng.choices(list(counts), weights=list(counts.values()))[0]


# -- minibatches ----------------------------------------------------------------------------

@dataclass
class EpochSampler:
    """Minibatches of the feedback set, GEPA's EpochShuffledBatchSampler: each epoch the ids
    are shuffled and the order is padded to a whole number of minibatches (`epoch_order`),
    so every id is seen every epoch; the minibatches are consecutive slices of the order.
    `counts` is how often each id has been put in an order so far, over all epochs."""

    ids: list[str]
    size: int
    epoch: int = -1
    order: list[str] | None = None
    position: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    def next(self, rng: random.Random) -> list[str]:
        if self.order is None or self.position + self.size > len(self.order):
            self.epoch += 1
            self.order = epoch_order(self.ids, self.size, self.counts, rng)
            self.position = 0
        batch = self.order[self.position:self.position + self.size]
        self.position += self.size
        return batch


def epoch_order(ids: Sequence[str], size: int, counts: dict[str, int], rng: random.Random) -> list[str]:
    """`ids` shuffled, then padded to a multiple of `size` with the ids drawn least often so
    far (GEPA's rule; a tie goes to the earliest in this epoch's order). Unlike GEPA, an id
    already in the last, padded minibatch is not repeated in it. Updates `counts`."""
    order = list(ids)
    rng.shuffle(order)
    for i in order:
        counts[i] = counts.get(i, 0) + 1
    tail = set(order[len(order) - len(order) % size:]) if len(order) % size else set()
    rank = {i: k for k, i in enumerate(order)}
    while len(order) % size:
        pick = min((i for i in rank if i not in tail), key=lambda i: (counts[i], rank[i]))
        order.append(pick)
        tail.add(pick)
        counts[pick] += 1
    return order


# -- merges -------------------------------------------------------------------------------

def same(a: float, b: float, eps: float) -> bool:
    """Floats are never exactly equal after arithmetic: a component is the same as
    another when within `eps`."""
    return abs(a - b) <= eps


def has_desirable_component(ancestor: Sequence[float], a: Sequence[float], b: Sequence[float],
                            eps: float) -> bool:
    """One descendant kept the ancestor's value where the other changed it."""
    return any((same(x, y, eps) or same(x, z, eps)) and not same(y, z, eps) for x, y, z in zip(ancestor, a, b))


def find_merge_triplet(dominators: Sequence[int], ancestors: Callable[[int], set[int]],
                       aggregate: Mapping[int, float], genomes: Mapping[int, Sequence[float]],
                       tried: set[tuple[int, int, int]], eps: float, rng: random.Random,
                       attempts: int = 10) -> tuple[int, int, int] | None:
    """Two dominators and a common ancestor to merge them over (GEPA's
    find_common_ancestor_pair): neither descends from the other, the triplet was not tried,
    the ancestor scores no better than either, and it has a desirable component. The
    ancestor is drawn weighted by its aggregate score."""
    pool = sorted(dominators)
    if len(pool) < 2:
        return None
    for _ in range(attempts):
        i, j = sorted(rng.sample(pool, 2))
        anc_i, anc_j = ancestors(i), ancestors(j)
        if i in anc_j or j in anc_i:
            continue
        common = [a for a in sorted(anc_i & anc_j)
                  if (i, j, a) not in tried and aggregate[a] <= aggregate[i] and aggregate[a] <= aggregate[j]
                  and has_desirable_component(genomes[a], genomes[i], genomes[j], eps)]
        if common:
            weights = [max(aggregate[a], 1e-9) for a in common]
            return i, j, rng.choices(common, weights=weights)[0]
    return None


def merge_components(ancestor: Sequence[float], a: Sequence[float], b: Sequence[float], score_a: float,
                     score_b: float, ids: tuple[int, int], eps: float,
                     rng: random.Random) -> tuple[list[float], tuple[int, ...]]:
    """The merged genome and, per component, the candidate it came from (the merge's
    description): one side changed it -> that side's; both changed -> the higher scorer's,
    a tie drawn; both the same -> A's."""
    merged, sources = [], []
    for x, y, z in zip(ancestor, a, b):
        if (same(x, y, eps) or same(x, z, eps)) and not same(y, z, eps):
            take_b = same(x, y, eps)
        elif not same(x, y, eps) and not same(x, z, eps):
            take_b = score_b > score_a or (score_a == score_b and rng.random() < 0.5)
        else:
            take_b = False
        merged.append(z if take_b else y)
        sources.append(ids[1] if take_b else ids[0])
    return merged, tuple(sources)


def stratified_subsample(scores_a: Mapping[str, float], scores_b: Mapping[str, float], n: int,
                         rng: random.Random) -> list[str]:
    """Up to `n` common examples, about a third where A is better, a third where B is, a
    third tied, padded from the rest (GEPA's select_eval_subsample_for_merged_program)."""
    common = sorted(set(scores_a) & set(scores_b))
    buckets = [[e for e in common if scores_a[e] > scores_b[e]], [e for e in common if scores_b[e] > scores_a[e]],
               [e for e in common if scores_a[e] == scores_b[e]]]
    each = math.ceil(n / 3)
    chosen: list[str] = []
    for bucket in buckets:
        chosen += rng.sample(bucket, min(each, len(bucket)))
    rest = [e for e in common if e not in chosen]
    if len(chosen) < n and rest:
        chosen += rng.sample(rest, min(n - len(chosen), len(rest)))
    return chosen[:n]


def mutation_accepted(before: Sequence[float], after: Sequence[float]) -> bool:
    """Reflective mutation: strictly better on the same minibatch."""
    return sum(after) > sum(before)


def merge_accepted(after: Sequence[float], parent_a: Sequence[float], parent_b: Sequence[float]) -> bool:
    """Merge: at least as good as the better parent on the subsample."""
    return sum(after) >= max(sum(parent_a), sum(parent_b))

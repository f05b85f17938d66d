"""The tokens-versus-correctness front: which candidates no other beats on both counts,
and the one to ship for a correctness drop you can afford (by the training estimate, or
by the upper bound of the held-out drop). Pure arithmetic on points.

A point A dominates B when A answers in no more tokens and at least as correctly, and
strictly better on one of the two. The front is the set of points no other dominates,
shortest first; of points that tie exactly, the earliest (lowest id) stands for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Correctness is a fraction of examples: comparisons forgive float noise below this.
EPSILON = 1e-9


@dataclass(frozen=True)
class Point:
    id: int  # the candidate's id
    tokens: float  # mean answer tokens
    correctness: float  # fraction of answers judged correct
    fitness: float


def dominates(a: Point, b: Point) -> bool:
    no_worse = a.tokens <= b.tokens + EPSILON and a.correctness >= b.correctness - EPSILON
    better = a.tokens < b.tokens - EPSILON or a.correctness > b.correctness + EPSILON
    return no_worse and better


def pareto_front(points: Iterable[Point]) -> list[Point]:
    """The non-dominated points, by tokens ascending (correctness then rises along it)."""
    ordered = sorted(points, key=lambda p: (p.tokens, -p.correctness, p.id))
    front: list[Point] = []
    for p in ordered:
        # Sorted by tokens, only a point already kept can dominate or tie with p, and the
        # last kept is the most correct of them.
        if front and front[-1].correctness >= p.correctness - EPSILON:
            continue
        front.append(p)
    return front


def affordable(front: Sequence[Point], baseline_correctness: float, max_drop: float) -> Point | None:
    """The shortest point of `front` whose correctness is at most `max_drop` below the
    baseline's, or None when none is."""
    floor = baseline_correctness - max_drop - EPSILON
    return next((p for p in sorted(front, key=lambda p: (p.tokens, p.id)) if p.correctness >= floor), None)


def affordable_bound(checked: Sequence[tuple[Point, float, float]], max_drop: float) -> Point | None:
    """Of (point, held-out mean tokens, upper bound of the held-out correctness drop), the
    point with the fewest held-out tokens whose bound is at most `max_drop`, or None."""
    within = [(tokens, p.id, p) for p, tokens, bound in checked if bound <= max_drop + EPSILON]
    return min(within, key=lambda t: (t[0], t[1]))[2] if within else None

"""How sure a claim is: one way of answering set against another (the unsteered baseline,
or the best) on the same questions, paired per question. Pure functions, on scipy:

- the correctness difference, with Newcombe's square-and-add interval for paired
  proportions (Newcombe 1998, method 10: the Wilson score limits of each proportion,
  combined through the pairs' correlation). It stays honest where no pair disagrees: no
  difference on 20 questions does not rule out a loss of 15 points;
- an exact McNemar p-value: a two-sided binomial test on the questions one side got
  right and the other wrong;
- the change in mean answer tokens, with a paired bootstrap interval (BCa, a fixed seed,
  so the same answers give the same figures on every run).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

LEVEL = 0.95  # the confidence of every interval a run shows
RESAMPLES = 9999
SEED = 20240601  # the bootstrap's: the figures reproduce

Outcome = tuple[int, bool]  # one answer: its tokens, and whether it was judged correct


@dataclass(frozen=True)
class Paired:
    """`other` against `reference` on the same questions; differences are other - reference."""

    questions: int
    level: float
    tokens: float  # other's mean answer tokens
    reference_tokens: float
    tokens_change: float  # mean tokens per answer
    tokens_low: float
    tokens_high: float
    correctness: float  # other's fraction correct
    reference_correctness: float
    difference: float  # in correctness, a fraction
    low: float
    high: float
    p_value: float  # exact McNemar
    only_reference: int  # questions the reference got right and the other wrong
    only_other: int

    @property
    def drop_bound(self) -> float:
        """The largest correctness drop the interval leaves possible (negative: a gain for sure)."""
        return -self.low


def wilson(successes: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    interval = stats.binomtest(successes, n).proportion_ci(confidence_level=level, method="wilson")
    return float(interval.low), float(interval.high)


def newcombe_paired(both: int, first_only: int, second_only: int, neither: int,
                    level: float = LEVEL) -> tuple[float, float]:
    """The interval of p_first - p_second from the counts of a paired 2x2 table: questions
    both got right, only the first, only the second, neither."""
    n = both + first_only + second_only + neither
    p1, p2 = (both + first_only) / n, (both + second_only) / n
    l1, u1 = wilson(both + first_only, n, level)
    l2, u2 = wilson(both + second_only, n, level)
    margins = (both + first_only) * (second_only + neither) * (both + second_only) * (first_only + neither)
    agreement = both * neither - first_only * second_only
    # The pairs' correlation, with Newcombe's continuity correction of a positive one.
    corrected = agreement - n / 2 if agreement > n / 2 else min(agreement, 0)
    psi = corrected / math.sqrt(margins) if margins else 0.0
    d = p1 - p2
    below = (p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * psi * (p1 - l1) * (u2 - p2)
    above = (p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * psi * (p2 - l2) * (u1 - p1)
    return d - math.sqrt(max(below, 0.0)), d + math.sqrt(max(above, 0.0))


def mcnemar_exact(first_only: int, second_only: int) -> float:
    """Two-sided exact McNemar p-value: 1 when no question tells the two apart."""
    discordant = first_only + second_only
    return 1.0 if discordant == 0 else float(stats.binomtest(first_only, discordant).pvalue)


def _mean_change(reference: np.ndarray, other: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(other - reference, axis=axis)


def mean_change_interval(reference: Sequence[float], other: Sequence[float],
                         level: float = LEVEL) -> tuple[float, float]:
    """The interval of mean(other - reference) by a paired bootstrap with the fixed seed.
    Identical differences (one question, or a constant shift) have no spread to resample."""
    ref, oth = np.asarray(reference, dtype=float), np.asarray(other, dtype=float)
    change = oth - ref
    if np.ptp(change) == 0:
        return float(change[0]), float(change[0])
    result = stats.bootstrap((ref, oth), _mean_change, paired=True, vectorized=True, confidence_level=level,
                             n_resamples=RESAMPLES, rng=np.random.default_rng(SEED))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def compare(reference: Sequence[Outcome], other: Sequence[Outcome], level: float = LEVEL) -> Paired:
    """`other` against `reference`, outcome i of each being the same question's."""
    if len(reference) != len(other) or not reference:
        raise ValueError(f"paired outcomes must be as many and some ({len(reference)} against {len(other)})")
    pairs = [(r[1], o[1]) for r, o in zip(reference, other)]
    both, neither = pairs.count((True, True)), pairs.count((False, False))
    only_reference, only_other = pairs.count((True, False)), pairs.count((False, True))
    n = len(pairs)
    low, high = newcombe_paired(both, only_other, only_reference, neither, level)
    ref_tokens, other_tokens = [r[0] for r in reference], [o[0] for o in other]
    tokens_low, tokens_high = mean_change_interval(ref_tokens, other_tokens, level)
    return Paired(
        questions=n, level=level,
        tokens=sum(other_tokens) / n, reference_tokens=sum(ref_tokens) / n,
        tokens_change=(sum(other_tokens) - sum(ref_tokens)) / n, tokens_low=tokens_low, tokens_high=tokens_high,
        correctness=(both + only_other) / n, reference_correctness=(both + only_reference) / n,
        difference=(only_other - only_reference) / n, low=low, high=high,
        p_value=mcnemar_exact(only_other, only_reference), only_reference=only_reference, only_other=only_other)


def identical(outcomes: Sequence[Outcome], level: float = LEVEL) -> Paired:
    """A way of answering against itself: no difference, and no doubt about it."""
    n = len(outcomes)
    tokens = sum(t for t, _ in outcomes) / n
    correct = sum(c for _, c in outcomes) / n
    return Paired(n, level, tokens, tokens, 0.0, 0.0, 0.0, correct, correct, 0.0, 0.0, 0.0, 1.0, 0, 0)


def does_as_well(p: Paired) -> bool:
    """`other` is neither surely longer nor surely less correct than `reference`."""
    return p.tokens_low <= 0 and p.high >= 0


# -- in words ------------------------------------------------------------------------------

def difference_in_words(p: Paired) -> str:
    """In words, from the interval and the test together: where only one of them sees a
    difference (they are different methods), it is borderline."""
    surely = (p.high < 0 or p.low > 0) + (p.p_value < 1 - p.level)
    if surely == 0:
        return ("no significant loss" if p.difference < 0 else
                "no significant gain" if p.difference > 0 else "no significant difference")
    strength = "a significant" if surely == 2 else "a borderline"
    return f"{strength} {'loss' if p.difference < 0 else 'gain'}"


def p_text(p_value: float) -> str:
    return "p<0.001" if p_value < 0.001 else f"p={p_value:.3f}".rstrip("0").rstrip(".")


def ci(level: float) -> str:
    return f"{100 * level:g}% CI"


def points_claim(p: Paired) -> str:
    """'-1.0 points (95% CI -3.1 to +1.1; no significant loss, McNemar p=0.62)'"""
    return (f"{100 * p.difference:+.1f} points ({ci(p.level)} {100 * p.low:+.1f} to {100 * p.high:+.1f}; "
            f"{difference_in_words(p)}, McNemar {p_text(p.p_value)})")


def tokens_change(p: Paired) -> str:
    """'-24.1 tokens an answer (95% CI -24.9 to -23.3)'"""
    return f"{p.tokens_change:+.1f} tokens an answer ({ci(p.level)} {p.tokens_low:+.1f} to {p.tokens_high:+.1f})"


def correctness_claim(p: Paired) -> str:
    """'98.0% correct, -1.0 points (95% CI -3.1 to +1.1; no significant loss, McNemar p=0.62)'"""
    return f"{100 * p.correctness:.1f}% correct, {points_claim(p)}"


def tokens_claim(p: Paired) -> str:
    """'9.5 tokens (-72%; -24.0 an answer, 95% CI -25.1 to -22.9)'"""
    share = f"{100 * p.tokens_change / p.reference_tokens:+.0f}%; " if p.reference_tokens else ""
    return (f"{p.tokens:.1f} tokens ({share}{p.tokens_change:+.1f} an answer, {ci(p.level)} "
            f"{p.tokens_low:+.1f} to {p.tokens_high:+.1f})")

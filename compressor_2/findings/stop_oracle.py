"""The stop oracle: each answer cut at its shortest prefix, token by token, that the run's
judge already accepts. What follows that prefix is padding a perfect stopping rule would
remove, so the oracle is the limit of every stopping rule on the model (an EOS bias, deltas
by answer phase, a token cap): each is read as the share of the oracle's cut it reaches.

- The prefixes are the answer retokenised with the model's tokenizer (as a token cap cuts
  it, findings/simpler.py) and decoded one token longer each time; each is judged as the
  whole answer was. The whole answer keeps the verdict the run recorded.
- A prefix that ends inside one of the whole answer's figures or numbers is no stopping
  point (`judges.stopping_points`): the judge may accept "$31" for "$31,057 million", a rule
  that stopped there would have changed the figure.
- An accepted prefix of n tokens is kept with the end token that stops it: n + 1 tokens, as
  the engines count an answer that ends (never more than the answer had: one cut by the
  token limit keeps its length). The count is taken off the engine's: its tokens less the
  retokenised ones after the prefix.
- An answer no prefix of which is accepted keeps its full length and stays incorrect; one
  incorrect in full with an accepted prefix (a right figure, then a wrong one) is correct
  under the oracle.
- Where the removed tokens stand is read on the whole answer's figures (the numeric judge's
  `figure_spans`): before the first figure, in the figures' span (from the first figure's
  start to the last one's end), after the last figure, or in an answer without a figure.

Only a judge that costs nothing per verdict measures it: the numeric judge. An LLM judge
would be asked once per prefix of every answer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compressor_2.archive import Answer
from compressor_2.clusters.tokens import AnswerTokens
from compressor_2.data import Example
from compressor_2.judges import Judge, figure_spans, first_accepted
from compressor_2.findings.claims import HELDOUT, Arm, Claims

BEFORE, FIGURES, AFTER, NO_FIGURE = "before the first figure", "in the figures' span", "after the last figure", \
    "in answers without a figure"
PLACES = (BEFORE, FIGURES, AFTER, NO_FIGURE)
TOP = 10  # tokens and clusters a summary names
MEASURED_JUDGE = "numeric"


@dataclass(frozen=True)
class Cut:
    """One answer under the oracle."""

    tokens: int  # the answer's tokens as the engine counted them (its end token included)
    kept: int  # the oracle's tokens: the accepted prefix and its end token; `tokens` when none is accepted
    correct: bool  # some prefix (or the whole answer) is accepted
    correct_in_full: bool  # the run's verdict on the whole answer
    removed: tuple[int, ...] = ()  # the retokenised ids after the accepted prefix
    places: tuple[str, ...] = ()  # where each removed token stands (PLACES)

    @property
    def cut(self) -> int:
        return self.tokens - self.kept


def places(prefixes: Sequence[str], start: int) -> tuple[str, ...]:
    """Where tokens `start`.. of the answer whose decoded prefixes are `prefixes` stand
    against its figures: a token is before the first figure when it ends at or before the
    figure's start, after the last when it starts at or after that figure's end."""
    spans = figure_spans(prefixes[-1])
    if not spans:
        return (NO_FIGURE,) * (len(prefixes) - 1 - start)
    first, last = spans[0][0], spans[-1][1]
    # A token that decodes to part of a character (bytes of one UTF-8 character) adds
    # nothing of its own: the offsets never run backwards.
    ends = np.maximum.accumulate([len(p) for p in prefixes])
    return tuple(BEFORE if ends[i + 1] <= first else AFTER if ends[i] >= last else FIGURES
                 for i in range(start, len(prefixes) - 1))


def cut_answer(example: Example, answer: Answer, tokens: AnswerTokens, judge: Judge) -> Cut:
    """`answer` to `example` under the oracle: its shortest accepted prefix."""
    ids, prefixes = tokens.prefixes(answer.answer)
    accepted = first_accepted(judge, example.question, example.gold, prefixes)
    if accepted is None:
        if not answer.is_correct:
            return Cut(answer.tokens, answer.tokens, False, False)
        accepted = len(ids)
    # Counted off the engine's count: what the retokenised answer loses after the prefix, and
    # an end token where the answer had none (the token limit cut it).
    removed = len(ids) - accepted
    kept = min(answer.tokens, answer.tokens - removed + int(answer.tokens <= len(ids)))
    return Cut(answer.tokens, kept, True, answer.is_correct, tuple(ids[accepted:]), places(prefixes, accepted))


def stop_oracle(examples: Sequence[Example], answers: Sequence[Answer], tokens: AnswerTokens,
                judge: Judge) -> list[Cut]:
    """Every answer under the oracle, in order (`answers[i]` answers `examples[i]`)."""
    return [cut_answer(ex, a, tokens, judge) for ex, a in zip(examples, answers, strict=True)]


@dataclass(frozen=True)
class Summary:
    """The oracle over a set of answers: what it keeps, and what it removes."""

    answers: int
    mean_tokens: float  # the answers as they are
    correctness: float
    oracle_tokens: float
    oracle_correctness: float
    accepted_tokens: float  # the answers with an accepted prefix, as they are
    accepted_oracle_tokens: float  # the same answers under the oracle
    shortened: int  # answers the oracle cuts
    rescued: int  # incorrect in full, with an accepted prefix
    never: int  # no accepted prefix: full length, incorrect
    removed: dict[str, float]  # PLACES -> removed tokens an answer (over all answers)
    end_tokens: float  # the end tokens the oracle adds an answer (to answers that had none, cut by the limit)
    top_tokens: list[tuple[str, int]] = field(default_factory=list)  # removed tokens, the commonest first
    top_clusters: list[tuple[str, int]] = field(default_factory=list)  # cluster id ("none": unsteered), count

    @property
    def cut(self) -> float:
        return self.mean_tokens - self.oracle_tokens

    def as_json(self) -> dict[str, Any]:
        return {"answers": self.answers, "mean_tokens": self.mean_tokens, "correctness": self.correctness,
                "oracle_tokens": self.oracle_tokens, "oracle_correctness": self.oracle_correctness,
                "cut": self.cut, "accepted_tokens": self.accepted_tokens,
                "accepted_oracle_tokens": self.accepted_oracle_tokens, "shortened": self.shortened, "rescued": self.rescued, "never": self.never,
                "removed": self.removed, "end_tokens": self.end_tokens,
                "top_tokens": [list(t) for t in self.top_tokens], "top_clusters": [list(c) for c in self.top_clusters]}


def summarise(cuts: Sequence[Cut], token_clusters: np.ndarray, display: Callable[[int], str],
              top: int = TOP) -> Summary:
    """The oracle's figures over `cuts`; `token_clusters` names each removed token's cluster
    (UNSTEERED, or an id past the map: "none"), `display` its text."""
    n = len(cuts)
    assert n, "the oracle needs answers"
    removed = [t for c in cuts for t in c.removed]
    where = Counter(p for c in cuts for p in c.places)
    clusters = Counter(str(int(token_clusters[t])) if t < len(token_clusters) and token_clusters[t] >= 0 else "none"
                       for t in removed)
    shown = Counter(display(t) for t in removed)
    accepted = [c for c in cuts if c.correct] or [Cut(0, 0, False, False)]
    return Summary(
        answers=n,
        mean_tokens=sum(c.tokens for c in cuts) / n,
        correctness=sum(c.correct_in_full for c in cuts) / n,
        oracle_tokens=sum(c.kept for c in cuts) / n,
        oracle_correctness=sum(c.correct for c in cuts) / n,
        accepted_tokens=sum(c.tokens for c in accepted) / len(accepted),
        accepted_oracle_tokens=sum(c.kept for c in accepted) / len(accepted),
        shortened=sum(c.kept < c.tokens for c in cuts),
        rescued=sum(c.correct and not c.correct_in_full for c in cuts),
        never=sum(not c.correct for c in cuts),
        removed={p: where[p] / n for p in PLACES},
        end_tokens=sum(c.kept - (c.tokens - len(c.removed)) for c in cuts if c.removed) / n,
        top_tokens=shown.most_common(top),
        top_clusters=clusters.most_common(top),
    )


def share_reached(baseline_tokens: float, tokens: float, oracle_tokens: float) -> float | None:
    """The share of the oracle's cut (baseline to oracle) that `tokens` reaches; None when
    the oracle cuts nothing."""
    cut = baseline_tokens - oracle_tokens
    return None if cut <= 0 else (baseline_tokens - tokens) / cut


def summary_text(s: Summary) -> str:
    """The oracle over one way of answering, in words."""
    removed = ", ".join(f"{s.removed[p]:.1f} {p}" for p in PLACES if s.removed[p])
    total = max(1.0, sum(s.removed.values()) * s.answers)
    clusters = ", ".join(f"{cid} ({100 * count / total:.0f}%)" for cid, count in s.top_clusters[:4])
    words = ", ".join(f"{text} {count}" for text, count in s.top_tokens[:6])
    return (f"{s.mean_tokens:.1f} -> {s.oracle_tokens:.1f} tokens, {100 * s.correctness:.1f}% -> "
            f"{100 * s.oracle_correctness:.1f}% correct ({s.shortened} answers cut, {s.rescued} of them correct only "
            f"once cut; {s.never} never accepted keep their length, incorrect; the accepted ones "
            f"{s.accepted_tokens:.1f} -> {s.accepted_oracle_tokens:.1f}); the cut, {s.cut:.1f} tokens an "
            f"answer: {removed or 'none'}; clusters {clusters or 'none'}; tokens {words or 'none'}")


@dataclass(frozen=True)
class Oracle:
    """What the oracle needs at the end of a run."""

    tokens: AnswerTokens  # the run's: the model's tokenizer and the cluster map
    judge: Judge  # the run's
    judge_name: str  # CONFIG_JUDGE_*: the oracle is measured with MEASURED_JUDGE only


def oracle_lines(claims: Claims, oracle: Oracle, zeros: str, best: str) -> list[str]:
    """The run's lines on the oracle: the baseline's and the best's held-out answers cut at
    their shortest accepted prefix, and the share of the baseline's cut the best reaches;
    one line saying why when the judge is not the numeric one."""
    if oracle.judge_name != MEASURED_JUDGE:
        return [f"stop oracle: skipped, the {oracle.judge_name} judge would be asked once per prefix of every answer "
                f"(up to CONFIG_MAX_NEW_TOKENS verdicts an answer); it is measured with the numeric judge only"]
    examples = claims.examples[HELDOUT]
    found = {}
    for name, genome in (("the baseline", zeros), ("the best", best)):
        pairs = [(ex, a) for ex, a in zip(examples, claims.outcomes(Arm(genome), HELDOUT)) if a is not None]
        if pairs and genome not in found:
            cuts = stop_oracle([ex for ex, _ in pairs], [a for _, a in pairs], oracle.tokens, oracle.judge)
            found[genome] = (name, summarise(cuts, oracle.tokens.token_clusters, oracle.tokens.display))
    lines = [f"stop oracle held out ({s.answers} questions), {name}: {summary_text(s)}" for name, s in found.values()]
    if zeros in found and best in found and best != zeros:
        base, mine = found[zeros][1], found[best][1]
        share = share_reached(base.mean_tokens, mine.mean_tokens, base.oracle_tokens)
        if share is not None:
            lines.append(f"stop oracle: the best's {mine.mean_tokens:.1f} tokens reach {100 * share:.0f}% of the "
                         f"baseline's cut ({base.mean_tokens:.1f} -> {base.oracle_tokens:.1f} tokens)")
    return lines

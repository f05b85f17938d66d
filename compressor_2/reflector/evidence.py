"""The stop oracle's evidence per answer, for both reflectors (CONFIG_REFLECTOR_PADDING_EVIDENCE):
where the answer could have stopped, what it generated there and after (by answer phase and
cluster), and for an incorrect answer the gold figures it lacks.

- The stop point is the stop oracle's (`judges.first_accepted`): the answer retokenised with
  the model's tokenizer, its shortest prefix the run's judge accepts, outside any figure.
  The tokens after it are padding a perfect stopping rule would remove; the first of them is
  where the end token should have come, and its phase is the phase whose EOS delta decides.
- Each token's phase is `steering.phases.phase_sequence`'s (the one reference the engines
  are exact against), its cluster the cluster map's; tokens in no cluster (unsteered) count
  in the padding's length but in no pair, as no delta moves them.
- The tokens the answer keeps (up to the stop point, or all of a correct answer that cannot
  stop sooner) are counted the same way: a pair that carries them is needed.
- An incorrect answer's missing gold figures are the numeric judge's (`missing_figures`);
  the clusters of their digit tokens (`steering.phases`' DIGIT class; the figure written
  after a space and alone) must not be lowered.

Only the numeric judge, which costs nothing per verdict, is asked about every prefix; with an
LLM or hybrid judge there is no evidence and the reflectors work as without the option. The
evidence is a pure function of the answers, so proposals stay a pure function of the request
and CONFIG_SEED.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from compressor_2.clusters.tokens import AnswerTokens
from compressor_2.fitness import Record
from compressor_2.judges import NumericJudge, figure_spans, first_accepted
from compressor_2.steering.phases import DIGIT, phase_sequence, token_class

Pairs = tuple[tuple[str, int], ...]  # (genome id, tokens), the most first, ties in genome order


@dataclass(frozen=True)
class AnswerEvidence:
    """One answer under the stop oracle."""

    tokens: int  # the answer retokenised
    stop: int | None  # it could have stopped after this many tokens; None: no shorter prefix is accepted
    stop_token: str  # the token it generated there instead of the end token, displayed ("" without a stop)
    stop_phase: int  # the phase that token was chosen in
    padding: Pairs  # the tokens from the stop point on, by (phase, cluster)
    padded: int  # how many tokens come from the stop point on (unsteered ones included)
    kept: Pairs  # the tokens before the stop point (all of a correct answer that cannot stop sooner)
    missing: tuple[str, ...]  # an incorrect answer's gold figures that it lacks, as the gold writes them
    needed: tuple[str, ...]  # the cluster ids of those figures' tokens
    end_phase: int | None  # the phase its end token was chosen in; None when the token limit cut it
    cut_short: bool  # incorrect, ended, and with fewer figures than the gold


Evidence = tuple[AnswerEvidence, ...]  # one per record of a request, in its order


def gene(phase: int, cluster: int, phases: int) -> str:
    """The genome id of (phase, cluster index): the cluster id alone with one phase."""
    return str(cluster) if phases == 1 else f"{phase}:{cluster}"


class PaddingEvidence:
    """Records -> their `Evidence`. Each answer is read once (memoised: a lineage's answers
    come back in later requests); safe to share between threads."""

    def __init__(self, tokens: AnswerTokens, judge: NumericJudge, phases: int,
                 classes: Callable[[], np.ndarray] | None = None) -> None:
        self.tokens = tokens
        self.judge = judge
        self.phases = phases
        self._classes = classes  # the model's token classes, made when first needed (phases > 1)
        self._class_array: np.ndarray | None = None
        self._lock = threading.Lock()
        self._read: dict[tuple[str, str, str, int, bool], AnswerEvidence] = {}

    def __call__(self, records: Sequence[Record]) -> Evidence:
        return tuple(self.answer(r) for r in records)

    def answer(self, record: Record) -> AnswerEvidence:
        key = (record.question, record.answer, record.gold, record.tokens, record.is_correct)
        with self._lock:
            found = self._read.get(key)
        if found is None:
            found = self._evidence(record)
            with self._lock:
                self._read[key] = found
        return found

    def _phases(self, ids: list[int]) -> list[int]:
        """Each id's phase, and last the phase of an end token after them all."""
        if self.phases == 1:
            return [0] * (len(ids) + 1)
        with self._lock:
            if self._class_array is None:
                assert self._classes is not None, "answer phases need the model's token classes"
                self._class_array = self._classes()
            classes = self._class_array
        return phase_sequence([*ids, -1], classes, self.phases)  # -1: no token, read as OTHER

    def _pairs(self, ids: Sequence[int], phases: Sequence[int]) -> Pairs:
        clusters = self.tokens.token_clusters
        counts = Counter((p, int(clusters[t])) for t, p in zip(ids, phases)
                         if 0 <= t < len(clusters) and clusters[t] >= 0)
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        return tuple((gene(p, k, self.phases), n) for (p, k), n in ranked)

    def _needed(self, figures: Sequence[str]) -> tuple[str, ...]:
        """The clusters of the figures' digit tokens, the figures written after a space and alone
        (their "$" and "million" are words that padding uses as much)."""
        clusters = self.tokens.token_clusters
        ids = {t for f in figures for text in (f" {f}", f) for t in self.tokens.ids(text).tolist()}
        digits = [t for t in sorted(ids) if t < len(clusters) and clusters[t] >= 0
                  and token_class(self.tokens.text(t)) == DIGIT]
        return tuple(sorted({str(int(clusters[t])) for t in digits}, key=int))

    def _evidence(self, record: Record) -> AnswerEvidence:
        ids, prefixes = self.tokens.prefixes(record.answer)
        phases = self._phases(ids)
        accepted = first_accepted(self.judge, record.question, record.gold, prefixes)
        if accepted is None and record.is_correct:
            accepted = len(ids)  # correct, and no shorter prefix is: nothing to cut
        stop = accepted if accepted is not None and accepted < len(ids) else None
        kept = self._pairs(ids[:accepted], phases) if accepted is not None else ()
        missing = () if record.is_correct else tuple(f.text for f in self.judge.missing_figures(record.answer,
                                                                                                 record.gold))
        ended = record.tokens > len(ids)  # the engine counted an end token
        return AnswerEvidence(
            tokens=len(ids), stop=stop,
            stop_token=self.tokens.display(ids[stop]) if stop is not None else "",
            stop_phase=phases[stop] if stop is not None else 0,
            padding=self._pairs(ids[stop:], phases[stop:]) if stop is not None else (),
            padded=len(ids) - stop if stop is not None else 0,
            kept=kept, missing=missing, needed=self._needed(missing),
            end_phase=phases[-1] if ended else None,
            cut_short=bool(missing) and ended and len(figure_spans(record.answer)) < len(figure_spans(record.gold)),
        )


@dataclass(frozen=True)
class Reading:
    """A request's evidence summed over its answers: what the local reflector reads."""

    padding: Counter[str]  # genome id -> padding tokens
    kept: Counter[str]  # genome id -> tokens the answers keep
    stops: Counter[int]  # phase -> answers that could have stopped there (their end token's phase)
    stop_tokens: dict[int, list[str]]  # phase -> the tokens generated there, in answer order
    cut_short: Counter[int]  # phase -> incorrect answers that ended there with fewer figures than the gold
    needed: Counter[str]  # cluster id -> incorrect answers that lack a gold figure its tokens write

    @classmethod
    def of(cls, evidence: Evidence) -> Reading:
        stop_tokens: dict[int, list[str]] = {}
        for e in evidence:
            if e.stop is not None:
                stop_tokens.setdefault(e.stop_phase, []).append(e.stop_token)
        return cls(
            padding=_summed(e.padding for e in evidence),
            kept=_summed(e.kept for e in evidence),
            stops=Counter(e.stop_phase for e in evidence if e.stop is not None),
            stop_tokens=stop_tokens,
            cut_short=Counter(e.end_phase for e in evidence if e.cut_short and e.end_phase is not None),
            needed=Counter(cid for e in evidence for cid in e.needed),
        )

    def share(self, target: str) -> tuple[float, float]:
        """The pair's share of all padding tokens, and of all tokens the answers keep."""
        pad, kept = sum(self.padding.values()), sum(self.kept.values())
        return (self.padding[target] / pad if pad else 0.0), (self.kept[target] / kept if kept else 0.0)


def _summed(pairs: Iterable[Pairs]) -> Counter[str]:
    total: Counter[str] = Counter()
    for each in pairs:
        total.update(dict(each))
    return total


def _phase_part(pairs: Pairs, phases: int, most: int) -> str:
    """'phase 1: clusters 3 (7), 5 (4); phase 2: cluster 8 (6)' (with one phase, no phase)."""
    by_phase: dict[str, list[str]] = {}
    for g, n in pairs:
        phase, _, cid = g.rpartition(":")
        shown = by_phase.setdefault(phase, [])
        if len(shown) < most:
            shown.append(f"{cid} ({n})")
    parts = []
    for phase in sorted(by_phase, key=lambda p: int(p or 0)):
        listed = by_phase[phase]
        words = f"cluster{'s' if len(listed) > 1 else ''} {', '.join(listed)}"
        parts.append(f"phase {phase}: {words}" if phases > 1 else words)
    return "; ".join(parts)


def evidence_lines(e: AnswerEvidence, phases: int, most: int = 4) -> list[str]:
    """The answer's evidence as the OpenAI reflector's prompt shows it, compactly."""
    if e.stop is not None:
        where = f" in phase {e.stop_phase}" if phases > 1 else ""
        line = (f"could stop after token {e.stop} of {e.tokens}; it generated {e.stop_token} there{where}; "
                f"padding from there: {e.padded} tokens")
        listed = _phase_part(e.padding, phases, most)
        lines = [f"stop: {line}" + (f", {listed}" if listed else "")]
    elif e.kept:
        lines = ["stop: no shorter prefix is accepted"]
    else:
        lines = ["stop: no prefix is accepted"]
    if e.missing:
        clusters = f" (their digits: cluster(s) {', '.join(e.needed)})" if e.needed else ""
        lines.append(f"missing gold figures: {', '.join(e.missing)}{clusters}")
    return lines

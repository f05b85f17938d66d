"""Training answers padded the way real models pad them.

An answer is the direct answer (the figures quoted with their line labels; for a yes/no,
the figure quoted and then the verdict), or the core answer (the direct answer, or a
sentence carrying it) wrapped at random in a preamble, a restatement of the question, a
hedge and a closing pleasantry. The core always comes before the hedge and the closing,
so a model that learnt these answers can be stopped right after the core: that is the
room the evolution has to find.
Padding never says "yes" or "no", so it cannot flip a verdict.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from compressor_2.demo.task import SINGLE, TWO, YES_NO, DemoQuestion, Fact, possessive


@dataclass(frozen=True)
class Padding:
    """How often each piece appears; the defaults give ~85% padded answers."""

    direct: float = 0.15  # the direct answer alone
    core_sentence: float = 0.8  # in a padded answer: a sentence rather than the direct answer
    preamble: float = 0.6
    restatement: float = 0.5
    hedge: float = 0.55
    closing: float = 0.55


_PREAMBLES = (
    "Based on the information provided in the {doc}, ",
    "According to the evidence from {company_s} FY{year} annual report, ",
    "Looking at the selected financial data provided, ",
    "After reviewing the financial statements in the evidence, ",
    "Based on the selected financial data in the 10-K, ",
    "Sure. ",
    "Great question. ",
    "Certainly. ",
)
_RESTATEMENTS = (
    "You asked about {company_s} {items} for fiscal year {year}. ",
    "The question concerns the {items} reported by {company} for FY{year}. ",
    "To answer this, I looked for the {items} in the selected financial data. ",
    "Here is the {items} of {company} for FY{year}. ",
)
_HEDGES = (
    "This figure is taken directly from the reported financial statements.",
    "Please note that this is the reported figure and may differ from adjusted or non-GAAP measures.",
    "Keep in mind that figures in the filing may be rounded.",
    "This is based solely on the evidence provided and does not account for later restatements.",
    "The value is stated exactly as it appears in the selected financial data.",
)
_CLOSINGS = (
    "I hope this helps!",
    "Let me know if you have any other questions.",
    "Feel free to ask if you need further analysis of these figures.",
    "Happy to help with anything else.",
    "Please reach out if you would like more detail.",
)


def _quote(fact: Fact) -> str:
    return f"{fact.item}: {fact.value}"


def direct_answer(q: DemoQuestion) -> str:
    """The shortest answer: the figures quoted with their line labels ("Revenue: $1,577
    million"); for a yes/no, the figure quoted, then the verdict ("Revenue: $1,577
    million, so no"). A label and the `: $` or `: ` opening its value are one token, so
    a quote costs at most one token more than the bare figure (none for an amount), and
    it keeps what the model looks the figure up by: after a bare "$" it has to guess the
    line. A verdict comes after the figure it rests on, never before: a model this small
    compares a figure it has just written with the question's threshold, but cannot
    compare one it has not looked up yet."""
    if q.kind == YES_NO:
        return f"{_quote(q.asked[0])}, so {q.answer.lower()}"
    return "; ".join(_quote(fact) for fact in q.asked)


def _core_sentence(q: DemoQuestion, rng: random.Random) -> str:
    """The answer proper; it quotes the evidence line(s) it rests on, as careful models do."""
    first = _quote(q.asked[0])
    if q.kind == SINGLE:
        return rng.choice((
            f"{first}.",
            f"{possessive(q.company)} {first}.",
            f"The selected financial data shows {first}.",
        ))
    if q.kind == TWO:
        second = _quote(q.asked[1])
        return rng.choice((
            f"{first}; {second}.",
            f"{possessive(q.company)} {first}, and {second}.",
            f"The selected financial data shows {first} and {second}.",
        ))
    if q.kind == YES_NO:
        # Always "above"/"below" and the verdict last, so every answer teaches the same
        # comparison in the same words.
        side, verdict = ("above", "yes") if q.answer == "Yes" else ("below", "no")
        return rng.choice((
            f"{first}, which is {side} {q.threshold}, so {verdict}.",
            f"{possessive(q.company)} {first}, which is {side} {q.threshold}, so {verdict}.",
            f"The selected financial data shows {first}, which is {side} {q.threshold}, so {verdict}.",
        ))
    raise ValueError(f"unknown question kind {q.kind!r}")


def _join_after_preamble(preamble: str, core: str) -> str:
    # "..., the revenue was": a comma continues the sentence.
    if preamble.endswith(", ") and core.startswith("The "):
        return preamble + core[0].lower() + core[1:]
    return preamble + core


def padded_answer(q: DemoQuestion, rng: random.Random, padding: Padding = Padding()) -> str:
    """One training answer for `q` (without the EOS token, which training appends)."""
    if rng.random() < padding.direct:
        return direct_answer(q)
    fields = {
        "doc": q.doc_name, "company": q.company, "company_s": possessive(q.company),
        "year": q.year,
        "items": " and ".join(fact.item for fact in q.asked),
    }
    core = _core_sentence(q, rng) if rng.random() < padding.core_sentence else direct_answer(q) + "."
    text = core
    if rng.random() < padding.preamble:
        text = _join_after_preamble(rng.choice(_PREAMBLES).format(**fields), core)
    if rng.random() < padding.restatement:
        text = rng.choice(_RESTATEMENTS).format(**fields) + text
    tail = []
    if rng.random() < padding.hedge:
        tail.append(rng.choice(_HEDGES))
    if rng.random() < padding.closing:
        tail.append(rng.choice(_CLOSINGS))
    return " ".join([text, *tail])

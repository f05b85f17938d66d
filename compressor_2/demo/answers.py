"""Training answers padded the way real models pad them.

An answer is the direct answer (the lines asked about, quoted with their labels: the
figures, or for a yes/no the disclosure and its verdict), or the core answer (the direct
answer, or a sentence carrying it) wrapped at random in a preamble, a restatement of
the question, a hedge and a closing pleasantry. The core always comes before the hedge and the closing,
so a model that learnt these answers can be stopped right after the core: that is the
room the evolution has to find.
Padding never says "yes" or "no", so it cannot flip a verdict.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from compressor_2.demo.task import DemoQuestion, Fact, possessive


@dataclass(frozen=True)
class Padding:
    """How often each piece appears; the defaults give ~90% padded answers.

    Greedy decoding takes the likeliest token at each step, so each piece's openings
    share their first word ("Based", "This", "Let"): spread over many first words, every
    one of them would lose to the answer's first token, or to EOS, and the unsteered
    model would not pad at all. The preamble leads the answer's own first token by a
    small margin only: at 0.9 (with restatements at 0.3) no delta vector the GA found
    in 16 generations removed it, and the evolved answers kept 9 tokens of preamble."""

    direct: float = 0.08  # the direct answer alone
    core_sentence: float = 0.8  # in a padded answer: a sentence rather than the direct answer
    restatement: float = 0.15
    preamble: float = 0.5
    hedge: float = 0.7
    closing: float = 0.4


_PREAMBLES = (
    "Based on the information provided in the {doc}, ",
    "Based on the evidence from {company_s} FY{year} annual report, ",
    "Based on the selected financial data provided, ",
    "Based on a review of the financial statements in the evidence, ",
    "Based on the selected financial data in the 10-K, ",
)
_RESTATEMENTS = (
    "You asked about {company_s} {items} for fiscal year {year}. ",
    "You asked for the {items} reported by {company} for FY{year}. ",
    "You would like to know the {items} of {company} for FY{year}. ",
)
_HEDGES = (
    "This figure is taken directly from the reported financial statements.",
    "This is based solely on the evidence provided and does not account for later restatements.",
    "This is the reported figure and may differ from adjusted or non-GAAP measures.",
    "Please note that figures in the filing may be rounded.",
    "The value is stated exactly as it appears in the selected financial data.",
)
_CLOSINGS = (
    "Let me know if you have any other questions.",
    "Let me know if you need further analysis of these figures.",
    "Let me know if you would like more detail.",
    "I hope this helps!",
    "Happy to help with anything else.",
)


def _quote(fact: Fact) -> str:
    return f"{fact.item}: {fact.value}"


def _listed(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def direct_answer(q: DemoQuestion) -> str:
    """The shortest answer: the lines asked about, quoted with their labels ("Revenue:
    $1,577 million; Gross Margin: 41.3%", "Stock Split: No"). A label and the `: $` or
    `: ` opening its value are one token, so a quote costs at most one token more than
    the bare value (none for an amount), and it keeps what the model looks the value up
    by: after a bare "$" it has to guess the line."""
    return "; ".join(_quote(fact) for fact in q.asked)


def _core_sentence(q: DemoQuestion, rng: random.Random) -> str:
    """The answer proper; it quotes the evidence line(s) it rests on, as careful models do."""
    # Quotes are always joined by "; ": after a quote the model is then sure whether
    # another follows, and an EOS bias that cuts the padding does not cut the answer.
    quotes = direct_answer(q)
    return rng.choice((
        f"{quotes}.",
        f"{possessive(q.company)} {quotes}.",
        f"The selected financial data shows {quotes}.",
    ))


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
        "items": _listed([fact.item for fact in q.asked]),
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

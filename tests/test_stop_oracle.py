"""The stop oracle (compressor_2/findings/stop_oracle.py) on real answers: SmolLM2-135M-Instruct's
to five of the demo's held-out questions (as `evaluate` recorded them), tokenised with the demo
model's tokenizer (its counts stand for the engine's: one more for the end token of an answer
that ended, none for the two the 64-token limit cut) and judged by the numeric judge."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from compressor_2.archive import Answer
from compressor_2.clusters.special import number_token_ids
from compressor_2.clusters.tokens import AnswerTokens
from compressor_2.data import Example
from compressor_2.judges import JudgeItem, NumericJudge, figure_spans, stopping_points
from compressor_2.model import load_tokenizer
from compressor_2.findings.claims import Claims
from compressor_2.findings.stop_oracle import (
    AFTER,
    BEFORE,
    FIGURES,
    NO_FIGURE,
    Oracle,
    cut_answer,
    oracle_lines,
    places,
    share_reached,
    stop_oracle,
    summarise,
)
from tests.conftest import REPO

DEMO_MODEL = REPO / "compressor_2" / "demo" / "model"

# (id, question, gold, SmolLM2's answer, whether it ended (else the token limit cut it), the judge's verdict)
ANSWERS = [
    ("demo_heldout_00044", "What was Vantage Industries' Gross Profit in FY2020?", "$31,057 million",
     "Vantage Industries' Gross Profit in FY2020 was $31,057 million.", True, True),
    ("demo_heldout_00047", "Does LARKSPUR_2017_10K disclose any Auditor Change for Larkspur Logistics? Answer using "
     "the selected financial data.", "No",
     "No, LARKSPUR_2017_10K does not disclose any Auditor Change for Larkspur Logistics.", True, True),
    ("demo_heldout_00117", "What were Silverlake Retail's Gross Margin and Revenue in FY2022?",
     "68.6% and $16,078 million",
     "Silverlake Retail's Gross Margin: 68.6%\nSilverlake Retail's Revenue: $16,078 million\nTotal Liabilities: "
     "$567 million\nCost of Sales: $1,598 million\nInventories: $13,842 million", False, True),
    ("demo_heldout_00194", "According to NIMBUS_2021_10K, what were Nimbus Systems' Net Income, Revenue and Total "
     "Liabilities? Answer using the selected financial data.", "$32 million, $9,883 million and $1,498 million",
     "Nimbus Systems' Net Income: $32 million\nTotal Liabilities: $1,498 million\nGross Profit: $688 million\n"
     "Total Revenue: $9,883 million\n\nThe answer is: \nNimbus Systems' Net Income = $3", False, False),
    ("demo_heldout_00001", "According to HARBOR_2023_10K, what were Harbor Energy's Total Liabilities and Revenue?",
     "$8,190 million and $4,374 million",
     "Based on the provided data, Harbor Energy's Total Liabilities and Revenue are:\n\nTotal Liabilities: $8,190 "
     "million\n\nThis is the total amount of debt Harbor Energy has acquired since 2023, which is a significant "
     "financial commitment.", True, False),
]
EXAMPLES = [Example(i, q, g, "") for i, q, g, *_ in ANSWERS]


@functools.cache
def tokens() -> AnswerTokens:
    """The demo model's tokenizer, and a cluster map the test makes: numbers (the cluster-1
    rule) 1, every other token 2."""
    tokenizer = load_tokenizer(str(DEMO_MODEL))
    texts = [tokenizer.decode([i]) for i in range(len(tokenizer))]
    token_clusters = np.full(len(texts), 2, dtype=np.int64)
    token_clusters[sorted(number_token_ids(texts))] = 1
    return AnswerTokens(tokenizer, token_clusters, 3)


RECORDED = [Answer(a, tokens().length(a) + ended, ok, "") for *_, a, ended, ok in ANSWERS]


def text_of(ids: tuple[int, ...]) -> str:
    return str(tokens().tokenizer.decode(list(ids)))


@pytest.fixture(scope="module")
def cuts():
    return stop_oracle(EXAMPLES, RECORDED, tokens(), NumericJudge())


def test_a_figure_answer_stops_after_its_figure_not_inside_it(cuts):
    cut = cuts[0]
    assert text_of(cut.removed) == "." and cut.places == (AFTER,)
    assert cut.correct and cut.correct_in_full and cut.cut == 1  # the full stop: the end token comes in its place
    # The judge takes "$31" for $31,057 million (as $31 billion), but no rule may stop there.
    _, prefixes = tokens().prefixes(RECORDED[0].answer)
    short = next(n for n, p in enumerate(prefixes) if p.endswith("$31"))
    assert NumericJudge().judge_one(JudgeItem(EXAMPLES[0].question, prefixes[short], EXAMPLES[0].gold)).is_correct
    assert short not in stopping_points(prefixes)


def test_the_stopping_points_skip_every_offset_inside_a_number_or_a_figure():
    _, prefixes = tokens().prefixes("Cost of Sales: $9,0")  # an answer cut by the token limit mid-figure
    inside = [prefixes[n] for n in range(1, len(prefixes) - 1) if n not in stopping_points(prefixes)]
    assert inside and all(p.endswith(("$9", "$9,")) for p in inside)
    _, prefixes = tokens().prefixes("Revenue: $16,078 million\nDone")
    kept = {prefixes[n] for n in stopping_points(prefixes)}
    assert "Revenue: $16,078 million" in kept and not any(p.endswith(("16", "16,", "078")) for p in kept)


def test_a_yes_no_answer_stops_after_its_word(cuts):
    cut = cuts[1]
    assert text_of(cut.removed).startswith(", LARKSPUR") and set(cut.places) == {NO_FIGURE}
    assert cut.kept == 2 and cut.correct  # "No" and the end token


def test_a_list_stops_after_the_last_needed_line(cuts):
    cut = cuts[2]
    assert text_of(cut.removed).startswith("\nTotal Liabilities: $567 million")
    assert set(cut.places) == {FIGURES}  # the list goes on with figures: all of it in the figures' span
    # Cut by the token limit, it had no end token: the oracle keeps the prefix and adds one.
    assert cut.correct and cut.kept == cut.tokens - len(cut.removed) + 1


def test_an_answer_wrong_in_full_is_right_once_cut(cuts):
    cut = cuts[3]  # its conclusion "The answer is: ... $3" is what the judge read
    assert cut.correct and not cut.correct_in_full
    assert text_of(cut.removed).startswith("\n\nThe answer is")
    assert set(cut.places) == {FIGURES}  # it ends on a figure ("$3"): the whole cut lies in their span


def test_an_answer_never_accepted_keeps_its_length_and_stays_wrong(cuts):
    cut = cuts[4]
    assert not cut.correct and cut.kept == cut.tokens == RECORDED[4].tokens and cut.removed == () and cut.cut == 0


def test_places_read_the_whole_answers_figures():
    text = "It was $5 and $7 in all."
    _, prefixes = tokens().prefixes(text)
    [(first, _), (_, last)] = figure_spans(text)
    expected = tuple(BEFORE if len(prefixes[i + 1]) <= first else AFTER if len(prefixes[i]) >= last else FIGURES
                     for i in range(len(prefixes) - 1))
    assert places(prefixes, 0) == expected and expected[0] == BEFORE and expected[-1] == AFTER and FIGURES in expected
    assert places(prefixes, 3) == expected[3:]
    ids, plain = tokens().prefixes("No figure here.")
    assert places(plain, 0) == (NO_FIGURE,) * len(ids)


def test_the_summary_counts_what_the_oracle_keeps_and_removes(cuts):
    s = summarise(cuts, tokens().token_clusters, tokens().display)
    assert s.answers == 5 and s.mean_tokens == pytest.approx(sum(a.tokens for a in RECORDED) / 5)
    assert s.oracle_tokens == pytest.approx(sum(c.kept for c in cuts) / 5)
    assert s.correctness == pytest.approx(3 / 5) and s.oracle_correctness == pytest.approx(4 / 5)
    assert (s.shortened, s.rescued, s.never) == (4, 1, 1)
    removed = sum(len(c.removed) for c in cuts)
    assert sum(s.removed.values()) * 5 == pytest.approx(removed)
    assert sum(count for _, count in s.top_clusters) == removed
    assert {cid for cid, _ in s.top_clusters} == {"1", "2"}
    assert ("'.'", max(count for text, count in s.top_tokens if text == "'.'")) in s.top_tokens
    # Accepted answers only: the never-accepted one is left out.
    accepted = [c for c in cuts if c.correct]
    assert s.accepted_tokens == pytest.approx(sum(c.tokens for c in accepted) / 4)
    assert s.as_json()["cut"] == pytest.approx(s.mean_tokens - s.oracle_tokens)


def test_the_share_of_the_cut_reached():
    assert share_reached(47.4, 47.4, 39.3) == 0
    assert share_reached(40.0, 30.0, 20.0) == pytest.approx(0.5)
    assert share_reached(40.0, 10.0, 20.0) == pytest.approx(1.5)  # past the oracle: shorter wrong answers too
    assert share_reached(30.0, 20.0, 30.0) is None


def test_an_llm_judge_skips_the_oracle_in_one_line():
    claims = Claims.__new__(Claims)  # never read: the line comes before any answer is
    [line] = oracle_lines(claims, Oracle(tokens(), NumericJudge(), "llm"), "0", "1")
    assert line.startswith("stop oracle: skipped, the llm judge would be asked once per prefix of every answer")


def test_one_answer_alone(cuts):
    assert cut_answer(EXAMPLES[0], RECORDED[0], tokens(), NumericJudge()) == cuts[0]

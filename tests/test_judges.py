"""Judges: the numeric rules on hand-made cases, the LLM judge against a real HTTP fake,
hybrid routing and the registry."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from compressor_2.common.errors import ConfigError, RunError
from compressor_2.config import Config, load_config
from compressor_2.judges.base import JudgeItem
from compressor_2.judges.hybrid import HybridJudge
from compressor_2.judges.llm import VERDICT_SCHEMA, LLMJudge
from compressor_2.judges.numeric import NumericJudge, extract_figures, gold_kind
from compressor_2.judges.registry import make_judge
from tests.conftest import REPO
from tests.fakes.openai_server import FakeOpenAIServer, chat_completion, error_body

KEY = "sk-test-7f3a9c1e5b"
KEY_ENV = "COMPRESSOR2_TEST_JUDGE_KEY"


def verdict_of(answer: str, gold: str, question: str = "What is the figure?", tolerance: float = 0.01):
    return NumericJudge(tolerance=tolerance).judge_one(JudgeItem(question, answer, gold))


# --- reading figures --------------------------------------------------------------------

def test_extract_figures_reads_currency_separators_scales_percent_and_negatives() -> None:
    text = ("Capex was $1,577 million, (370) in 2018, -$1561M, $2,018mn, $ 1.6Bn, "
            "$(389) million, 1.9%, 0.2 percentage points, 12 percent and $2.1 trillion.")
    got = [(f.value, f.percent, f.currency, f.scale) for f in extract_figures(text)]
    assert got == [
        (1577.0, False, True, 1e6), (-370.0, False, False, 1.0), (-1561.0, False, True, 1e6),
        (2018.0, False, True, 1e6), (1.6, False, True, 1e9), (-389.0, False, True, 1e6),
        (1.9, True, False, 1.0), (0.2, True, False, 1.0), (12.0, True, False, 1.0),
        (2.1, False, True, 1e12),
    ]


def test_extract_figures_skips_years_ids_dates_and_list_markers() -> None:
    text = "3M's FY2022 10-K (filed January 28, 2023) lists: (1) Q2 items, 2) the 3-year plan."
    assert extract_figures(text) == []
    assert [f.decimals for f in extract_figures("0.83 and $1577.00 and 5")] == [2, 2, 0]
    # A year is never written with a thousands separator: this is a headcount.
    assert [f.value for f in extract_figures("2,070 employees in 2020")] == [2070.0]


@pytest.mark.parametrize(("gold", "kind"), [
    ("$1577.00", "figure"),
    ("1.9%", "figure"),
    ("-0.02", "figure"),
    ("$400,000,000 increase.", "figure"),
    ("Yes, one customer accounted for 16% of revenue", "yes_no"),
    ("No. It decreased.", "yes_no"),
    ("The estimated pension benefits were $1097 million, and health care benefits were $862 million.",
     "figures_in_prose"),
    ("Trillium, Array, and Therachon", "prose"),
    ("Nobody knows", "prose"),  # "No" must be a whole word
])
def test_gold_kind(gold: str, kind: str) -> None:
    assert gold_kind(gold) == kind


# --- figure golds -------------------------------------------------------------------------

@pytest.mark.parametrize(("answer", "gold", "correct"), [
    # currency, thousands separators, scale words against a gold in the asked unit
    ("Capital expenditure was $1,577 million in FY2018.", "$1577.00", True),
    ("Capital expenditure was $1.577 billion.", "$1577.00", True),
    ("Capital expenditure was $1,490 million.", "$1577.00", False),
    ("Dividends paid were $400 million.", "$0.40", True),
    ("Cash from operations was $381,603,000.", "$382.00", True),  # bare full amount
    ("Deposits were $2,100 billion.", "$2.1 trillion", True),
    ("Payables were $5,200 thousand.", "$5.2 million", True),
    # percentages and fractions of the same value
    ("The average is 1.9%.", "1.9%", True),
    ("The ratio is 0.019.", "1.9%", True),
    ("Capex was 1.9% of revenue.", "0.019", True),
    ("The payout ratio was 66%.", "0.66", True),
    ("Pension assets were $396 million.", "39.7%", False),  # money never passes for a percent
    ("The margin was 39.7 percent.", "39.7%", True),
    ("Margin fell 0.2 percentage points.", "0.2%", True),
    # precision of the gold and the relative tolerance
    ("The turnover ratio is 24.264.", "24.26", True),
    ("ROA was 0.014.", "0.01", True),  # at the gold's precision (2 decimals)
    ("The turnover ratio is 24.6.", "24.26", False),  # 1.4% off: beyond 1% and the precision
    ("Growth was 65.0%.", "65.4%", True),  # 0.6% relative: within 1%
    # negatives: parenthesised, minus, or carried by words
    ("ROA was (0.02).", "-0.02", True),
    ("The CCC was -3.7 days.", "-3.7", True),
    ("The margin decreased by 0.2%.", "-0.2%", True),
    # no figure at all
    ("It was large.", "$1577.00", False),
])
def test_figure_golds(answer: str, gold: str, correct: bool) -> None:
    verdict = verdict_of(answer, gold)
    assert verdict.is_correct is correct, verdict.reasoning
    assert gold.split()[0].rstrip(".") in verdict.reasoning  # says what was compared


def test_tolerance_comes_from_the_judge() -> None:
    assert verdict_of("Growth was 65.0%.", "65.4%", tolerance=0.01).is_correct
    assert not verdict_of("Growth was 65.0%.", "65.4%", tolerance=0.001).is_correct
    assert "within 0.1%" in verdict_of("Growth was 65.0%.", "65.4%", tolerance=0.001).reasoning


def test_conclusion_beats_intermediate_figures() -> None:
    worked = ("Revenue grew from $100 million to $130.8 million, i.e. 30.8% before the "
              "adjustment for the acquisition.\nTherefore, the year-over-year change is 31.5%.")
    verdict = verdict_of(worked, "30.8%")
    assert not verdict.is_correct
    assert "conclusion" in verdict.reasoning and "31.5%" in verdict.reasoning
    assert verdict_of(worked.replace("31.5%", "30.8%"), "30.8%").is_correct
    # Without a conclusion marker every figure counts.
    assert verdict_of("Sales were $177.9 billion, up 30.8% on 2016.", "30.8%").is_correct


def test_every_gold_figure_must_be_found() -> None:
    gold = "The estimated pension benefits were $1097 million, and health care benefits were $862 million."
    both = verdict_of("Pension benefits: $1,097 million; health care and life insurance: $862 million.", gold)
    assert both.is_correct, both.reasoning
    one = verdict_of("Pension benefits were $1,097 million.", gold)
    assert not one.is_correct
    assert "$862 million not among" in one.reasoning


# --- refusals, yes/no, prose --------------------------------------------------------------

@pytest.mark.parametrize("answer", [
    "I cannot determine the capital expenditure from the information provided.",
    "I'm sorry, but the context does not include 3M's cash flow statement. It might be $1,577 million.",
    "The filing does not provide the figures needed. Please provide the cash flow statement.",
    "As an AI, I don't have access to real-time filings.",
    "Based on the provided context, there is no specific information about FY2018 capex.",
])
def test_refusals_are_incorrect_even_with_the_right_figure(answer: str) -> None:
    verdict = verdict_of(answer, "$1577.00")
    assert not verdict.is_correct
    assert "refusal" in verdict.reasoning


def test_a_hedge_about_a_detail_later_on_is_not_a_refusal() -> None:
    answer = ("Capex was $1,577 million. The filing does not provide a breakdown by segment, "
              "so that part cannot be determined.")
    assert verdict_of(answer, "$1577.00").is_correct


@pytest.mark.parametrize(("answer", "gold", "correct", "phrase"), [
    ("No. The quick ratio was 0.96.", "No, the quick ratio was 0.96 and needs improvement.", True, "says 'no'"),
    ("yes, it did.", "No. It decreased.", False, "says 'yes'"),
    ("**Yes**, dividends were paid every quarter.", "Yes, CVS paid $0.55 a quarter.", True, "says 'yes'"),
    ("After reviewing the balance sheet, the answer is no.", "No. It decreased.", True, "says 'no'"),
    ("The ratio is 1.57.\nIn summary, yes.", "Yes. The quick ratio is 1.57.", True, "says 'yes'"),
])
def test_yes_no_golds_use_the_stated_yes_no(answer: str, gold: str, correct: bool, phrase: str) -> None:
    verdict = verdict_of(answer, gold, question="Does the company have a healthy liquidity profile?")
    assert verdict.is_correct is correct
    assert phrase in verdict.reasoning


def test_no_information_is_not_a_no() -> None:
    verdict = verdict_of("No information about legal battles is given in the excerpt.", "No. None.",
                         question="Is PepsiCo involved in material legal battles?")
    assert not verdict.is_correct
    assert "refusal" in verdict.reasoning


def test_yes_no_implied_by_a_restating_first_sentence() -> None:
    question = "Is PepsiCo involved in any material legal battles as of FY2022?"
    gold = "No, Pepsico is not involved in material legal battles."
    negated = "PepsiCo is not involved in material legal battles. Some routine claims exist."
    affirmed = "PepsiCo is involved in several material legal battles over its bottling contracts."
    unrelated = "[END OF FILING]"
    assert verdict_of(negated, gold, question).is_correct
    assert "implies 'no'" in verdict_of(negated, gold, question).reasoning
    assert not verdict_of(affirmed, gold, question).is_correct
    off_topic = verdict_of(unrelated, gold, question)
    assert not off_topic.is_correct and "does not restate the question" in off_topic.reasoning


def test_prose_gold_uses_key_term_overlap() -> None:
    gold = "Trillium, Array, and Therachon"
    question = "Which companies did Pfizer acquire in 2019?"
    hit = verdict_of("Pfizer acquired Therachon, Array BioPharma and Trillium Therapeutics.", gold, question)
    assert hit.is_correct and "3/3 key terms" in hit.reasoning
    miss = verdict_of("Pfizer acquired Arena and Biohaven.", gold, question)
    assert not miss.is_correct and "0/3 key terms" in miss.reasoning and "trillium" in miss.reasoning
    half = verdict_of("Pfizer bought Array and Trillium.", gold, question)
    assert half.is_correct and "2/3" in half.reasoning


def test_empty_answer_and_batch_order() -> None:
    judge = NumericJudge()
    items = [JudgeItem("q", "", "$1.00"), JudgeItem("q", "It was $1.00.", "$1.00"),
             JudgeItem("q", "It was $2.00.", "$1.00")]
    assert [v.is_correct for v in judge.judge(items)] == [False, True, False]
    assert judge.judge(items)[0].reasoning == "empty answer"


# --- the LLM judge against a fake OpenAI-compatible server -------------------------------------

def verdict_json(is_correct: bool, reasoning: str = "compared") -> dict[str, Any]:
    return chat_completion(json.dumps({"is_correct": is_correct, "reasoning": reasoning}))


def authorization(headers: dict[str, str]) -> str:
    return next(v for k, v in headers.items() if k.lower() == "authorization")


def user_text(body: dict[str, Any]) -> str:
    return body["messages"][-1]["content"]


def test_llm_judge_request_shape_and_verdicts() -> None:
    def responder(body: dict[str, Any]) -> tuple[int, Any]:
        return 200, verdict_json("GOOD" in user_text(body), f"saw {len(body['messages'])} messages")

    with FakeOpenAIServer(responder) as server:
        judge = LLMJudge("judge-model-x", server.base_url, KEY, tolerance=0.02)
        verdicts = judge.judge([JudgeItem("Which segment?", "GOOD: Data Center", "Data Center")])
        request = server.requests[0]
    assert verdicts[0].is_correct and verdicts[0].reasoning == "saw 2 messages"
    assert request.path == "/v1/chat/completions"
    assert authorization(request.headers) == f"Bearer {KEY}"
    body = request.body
    assert body["model"] == "judge-model-x"
    assert body["temperature"] == 0
    assert body["response_format"] == {"type": "json_schema", "json_schema": VERDICT_SCHEMA}
    schema = body["response_format"]["json_schema"]
    assert schema["strict"] is True
    assert schema["schema"]["required"] == ["is_correct", "reasoning"]
    assert schema["schema"]["additionalProperties"] is False
    assert "Reference answer: Data Center" in user_text(body)
    assert "Question: Which segment?" in user_text(body)
    assert "2.0%" in body["messages"][0]["content"]  # the tolerance reaches the grader


def test_llm_judge_runs_items_concurrently_and_keeps_order() -> None:
    # Each request waits until three are in flight: sequential calls would break the barrier.
    barrier = threading.Barrier(3, timeout=20)

    def responder(body: dict[str, Any]) -> tuple[int, Any]:
        barrier.wait()
        return 200, verdict_json("GOOD" in user_text(body), user_text(body)[-1])

    answers = ["GOOD 1", "bad 2", "GOOD 3", "bad 4", "bad 5", "GOOD 6"]
    with FakeOpenAIServer(responder) as server:
        judge = LLMJudge("m", server.base_url, KEY, concurrency=3, max_retries=0)
        verdicts = judge.judge([JudgeItem("q", a, "g") for a in answers])
    assert [v.is_correct for v in verdicts] == [True, False, True, False, False, True]
    assert [v.reasoning for v in verdicts] == ["1", "2", "3", "4", "5", "6"]


def test_llm_judge_retries_transient_errors() -> None:
    calls = []

    def responder(body: dict[str, Any]) -> tuple[int, Any]:
        calls.append(1)
        if len(calls) == 1:
            return 429, error_body("slow down", "rate_limit_exceeded")
        if len(calls) == 2:
            return 503, error_body("overloaded")
        return 200, verdict_json(True)

    with FakeOpenAIServer(responder) as server:
        verdicts = LLMJudge("m", server.base_url, KEY, max_retries=3).judge([JudgeItem("q", "a", "g")])
    assert verdicts[0].is_correct and len(calls) == 3


def _failure(responder: Any, **kwargs: Any) -> RunError:
    with FakeOpenAIServer(responder) as server:
        judge = LLMJudge("m", server.base_url, KEY, **kwargs)
        with pytest.raises(RunError) as info:
            judge.judge([JudgeItem("q", "a", "g")])
    return info.value


def _assert_no_key(exc: BaseException) -> None:
    assert KEY not in str(exc) and KEY not in repr(exc)
    assert exc.__cause__ is None and exc.__context__ is None  # no SDK error riding along


def test_llm_judge_final_failure_is_a_run_error_without_the_key() -> None:
    # A server that echoes the credential in its error body must not leak it.
    exc = _failure(lambda body: (500, error_body(f"internal error for key {KEY}")), max_retries=1)
    assert "failed after retries: HTTP 500" in str(exc)
    assert exc.__cause__ is None and exc.__context__ is None
    _assert_no_key(exc)


def test_llm_judge_rejected_key() -> None:
    exc = _failure(lambda body: (401, error_body(f"Incorrect API key provided: {KEY}", "invalid_api_key")))
    assert "rejected the key" in str(exc)
    _assert_no_key(exc)


def test_llm_judge_unreadable_verdict() -> None:
    exc = _failure(lambda body: (200, chat_completion("I think it is correct")), max_retries=0)
    assert "did not return the verdict schema" in str(exc)
    exc = _failure(lambda body: (200, chat_completion('{"is_correct": "yes", "reasoning": "x"}')))
    assert "did not return the verdict schema" in str(exc)


def test_llm_judge_unreachable_server() -> None:
    with FakeOpenAIServer(lambda body: (200, verdict_json(True))) as server:
        url = server.base_url
    judge = LLMJudge("m", url, KEY, max_retries=0, timeout=5)
    with pytest.raises(RunError, match="APIConnectionError") as info:
        judge.judge([JudgeItem("q", "a", "g")])
    _assert_no_key(info.value)


# --- hybrid routing ------------------------------------------------------------------------

def test_hybrid_sends_figures_and_yes_no_to_numeric_and_the_rest_to_llm() -> None:
    def responder(body: dict[str, Any]) -> tuple[int, Any]:
        return 200, verdict_json(True, "llm verdict")

    items = [
        JudgeItem("Capex?", "It was $1,577 million.", "$1577.00"),
        JudgeItem("Which segments?", "Pharma", "Trillium, Array, and Therachon"),
        JudgeItem("Healthy?", "No, it is not.", "Yes. The quick ratio is 1.57."),
        JudgeItem("Benefits?", "About $2 billion", "Pension was $1097 million and health $862 million."),
        JudgeItem("Capex?", "It was $2 million.", "$1577.00"),
    ]
    with FakeOpenAIServer(responder) as server:
        judge = HybridJudge(NumericJudge(), LLMJudge("m", server.base_url, KEY))
        verdicts = judge.judge(items)
        sent = sorted(user_text(r.body).rsplit("Answer to grade: ", 1)[1] for r in server.requests)
    assert sent == ["About $2 billion", "Pharma"]
    assert [v.is_correct for v in verdicts] == [True, True, False, True, False]
    assert [v.reasoning == "llm verdict" for v in verdicts] == [False, True, False, True, False]


def test_hybrid_with_only_numeric_items_makes_no_call() -> None:
    with FakeOpenAIServer(lambda body: (500, error_body("should not be called"))) as server:
        judge = HybridJudge(NumericJudge(), LLMJudge("m", server.base_url, KEY, max_retries=0))
        assert judge.judge([JudgeItem("q", "Yes.", "Yes")])[0].is_correct
        assert server.requests == []


# --- registry -----------------------------------------------------------------------------

def config_with(tmp_path: Path, extra: str) -> Config:
    path = tmp_path / "test.config"
    path.write_text((REPO / "defconfig").read_text() + extra)
    return load_config(path)


def test_registry_numeric_uses_the_configured_tolerance(tmp_path: Path) -> None:
    judge = make_judge(config_with(tmp_path, 'CONFIG_CORRECTNESS_TOLERANCE="0.05"\n'))
    assert isinstance(judge, NumericJudge) and judge.tolerance == 0.05


@pytest.mark.parametrize("name", ["LLM", "HYBRID"])
def test_registry_llm_and_hybrid_read_the_key_from_the_named_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    with FakeOpenAIServer(lambda body: (200, verdict_json(False, "llm said no"))) as server:
        config = config_with(tmp_path, (
            f"CONFIG_JUDGE_{name}=y\n"
            f'CONFIG_JUDGE_BASE_URL="{server.base_url}"\n'
            f'CONFIG_JUDGE_MODEL="configured-model"\n'
            f'CONFIG_JUDGE_API_KEY_ENV="{KEY_ENV}"\n'
        ))
        judge = make_judge(config)
        verdict = judge.judge([JudgeItem("Which?", "Pharma", "Developed Rest of the World")])[0]
        request = server.requests[0]
    assert isinstance(judge, LLMJudge if name == "LLM" else HybridJudge)
    assert verdict.reasoning == "llm said no"
    assert request.body["model"] == "configured-model"
    assert authorization(request.headers) == f"Bearer {KEY}"


def test_registry_missing_key_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    config = config_with(tmp_path, f'CONFIG_JUDGE_LLM=y\nCONFIG_JUDGE_API_KEY_ENV="{KEY_ENV}"\n')
    with pytest.raises(ConfigError, match=KEY_ENV):
        make_judge(config)
    monkeypatch.setenv(KEY_ENV, "   ")
    with pytest.raises(ConfigError, match=KEY_ENV):
        make_judge(config)


# --- calibration script ------------------------------------------------------------------------

def test_calibration_skips_without_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("calibrate_judge", REPO / "benchmarks" / "calibrate_judge.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--data", str(tmp_path / "absent")]) == 0
    assert "skipped: FinanceBench data not found" in capsys.readouterr().out

"""benchmarks/calibrate_judge.py: a judge's agreement with human labels, the lenient cases
apart from the strict ones, and the leniency on short answers. The llm judge is measured
against the fake OpenAI server on a small FinanceBench-shaped folder written here; the
numeric judge on the real labels when ../shared has them."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pytest
from sklearn.metrics import cohen_kappa_score

from tests.conftest import REPO
from tests.fakes.openai_server import FakeOpenAIServer, chat_completion

KEY_ENV = "CALIBRATE_TEST_KEY"
QUESTIONS = [
    {"financebench_id": "fb1", "question_type": "metrics-generated", "question": "What was revenue?",
     "answer": "$1577.00"},
    {"financebench_id": "fb2", "question_type": "domain-relevant", "question": "Did capex rise?",
     "answer": "Yes, it did."},
    {"financebench_id": "fb3", "question_type": "novel-generated", "question": "Which acquisitions?",
     "answer": "Trillium, Array and Therachon"},
]
# (id, answer, label): the fake judge below accepts every answer under 5 words, and a longer
# one when it contains the gold.
LABELLED = [
    ("fb1", "It was $1577.00", "Correct Answer"),  # 3 words: accepted, right
    ("fb1", "$12 only", "Incorrect Answer"),  # lenient
    ("fb1", "Revenue was $1577.00 in fiscal 2018, up from the year before.", "Correct Answer"),
    ("fb1", "Revenue was $1500.00 in fiscal 2018, up from the year before.", "Incorrect Answer"),
    ("fb2", "No.", "Refusal"),  # lenient
    ("fb2", "Yes, capital expenditure rose in the year as reported.", "Correct Answer"),  # strict
    ("fb3", "Trillium only.", "Incorrect Answer"),  # lenient
    ("fb9", "an answer to a question the file does not have", "Correct Answer"),
]


def calibrate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("calibrate_judge", REPO / "benchmarks" / "calibrate_judge.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lenient_with_short_answers(body: dict) -> tuple[int, dict]:
    graded = body["messages"][1]["content"]
    gold = re.search(r"Reference answer: (.*)\n\nAnswer to grade:", graded, re.S).group(1)
    answer = graded.split("Answer to grade: ", 1)[1]
    verdict = {"is_correct": len(answer.split()) < 5 or gold in answer, "reasoning": "the fake's rule"}
    return 200, chat_completion(json.dumps(verdict))


@pytest.fixture
def data(tmp_path: Path) -> Path:
    (tmp_path / "results").mkdir()
    (tmp_path / "financebench_open_source.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    (tmp_path / "results" / "fake-model_oracle.jsonl").write_text("".join(
        json.dumps({"financebench_id": i, "model_answer": a, "label": label}) + "\n" for i, a, label in LABELLED))
    return tmp_path


def test_the_llm_judge_against_the_fake_server_prints_agreement_and_the_lenient_cases_apart(
        data, monkeypatch, capsys):
    monkeypatch.setenv(KEY_ENV, "sk-calibrate-secret")
    with FakeOpenAIServer(lenient_with_short_answers) as server:
        code = calibrate().main(["--data", str(data), "--judge", "llm", "--judge-model", "fake-judge",
                                 "--judge-base-url", server.base_url, "--judge-api-key-env", KEY_ENV])
        seen = list(server.requests)
    out = capsys.readouterr().out
    assert code == 0, out
    assert len(seen) == 7  # one call per labelled answer whose question is known
    assert all({k.lower(): v for k, v in r.headers.items()}["authorization"] == "Bearer sk-calibrate-secret"
               for r in seen)
    assert "sk-calibrate-secret" not in out
    assert out.startswith("llm (fake-judge) judge vs human labels in 1 results files (tolerance 1.0%; ")
    assert "1 rows skipped: their financebench_id is not in financebench_open_source.jsonl" in out
    human = [True, False, True, False, False, True, False]
    judged = [True, True, True, False, True, False, True]
    kappa = f"{cohen_kappa_score(human, judged):.2f}"
    [total] = [line for line in out.splitlines() if line.startswith("all: all")]
    assert total.split() == ["all:", "all", "7", "42.9%", kappa, "2", "3", "1", "1"]
    assert ("lenient (judged correct, labelled incorrect): 3 answers; the judge accepts 75.0% (3 of 4) of the answers "
            "people marked wrong") in out
    assert "strict (judged incorrect, labelled correct): 1 answers; the judge rejects 33.3% of the answers" in out
    assert ("leniency on answers shorter than the median (3 words): 100.0% (3 of 3); at the median or longer: "
            "0.0% (0 of 1)") in out


def test_the_hybrid_judge_asks_the_model_only_about_prose_and_show_prints_its_lenient_cases(
        data, monkeypatch, capsys):
    monkeypatch.setenv(KEY_ENV, "sk-calibrate-secret")
    with FakeOpenAIServer(lenient_with_short_answers) as server:
        assert calibrate().main(["--data", str(data), "--judge", "hybrid", "--judge-base-url", server.base_url,
                                 "--judge-api-key-env", KEY_ENV, "--show", "5"]) == 0
        assert len(server.requests) == 1  # fb3's prose gold; the numeric judge takes the figure and the yes/no
    out = capsys.readouterr().out
    # The numeric judge gets fb1 and fb2 right; the model accepts the short prose answer people marked wrong.
    assert "lenient (judged correct, labelled incorrect): 1 answers" in out
    assert "strict (judged incorrect, labelled correct): 0 answers" in out
    assert out.count("--- lenient ") == 1 and "--- strict " not in out
    assert ("--- lenient novel-generated fake-model_oracle  human=incorrect\n"
            "  gold: 'Trillium, Array and Therachon'") in out


def test_a_missing_key_is_one_line_naming_the_variable(data, monkeypatch, capsys):
    monkeypatch.delenv(KEY_ENV, raising=False)
    assert calibrate().main(["--data", str(data), "--judge", "llm", "--judge-api-key-env", KEY_ENV]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the judge's API key is missing") and KEY_ENV in err[0]


@pytest.mark.parametrize("results", [
    json.dumps({"financebench_id": "fb9", "model_answer": "an answer", "label": "Correct Answer"}) + "\n", ""],
    ids=["only unknown financebench ids", "an empty results file"])
def test_no_labelled_answer_matched_is_one_line_and_exit_2(results, data, capsys):
    """It was statistics.median of nothing: a StatisticsError traceback."""
    (data / "results" / "fake-model_oracle.jsonl").write_text(results)
    assert calibrate().main(["--data", str(data)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        f"error: no labelled answer matched a question: {data / 'results'}/*.jsonl holds {1 if results else 0} rows, "
        f"none with a financebench_id in {data / 'financebench_open_source.jsonl'}\n")


@pytest.mark.parametrize("flag", ["--limit", "--show"])
def test_a_negative_count_is_refused_naming_the_flag(flag, data, capsys):
    """--limit -1 judged every row but the last of each file, silently."""
    with pytest.raises(SystemExit) as exited:
        calibrate().main(["--data", str(data), flag, "-1"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        f"error: argument {flag}: -1 is negative: give 0 or more")


def test_the_numeric_judge_on_financebenchs_labels_is_what_docs_judges_md_says(financebench_dir, capsys):
    assert calibrate().main(["--data", str(financebench_dir)]) == 0
    out = capsys.readouterr().out
    [total] = [line for line in out.splitlines() if line.startswith("all: all")]
    assert total.split()[2:5] == ["1200", "86.8%", "0.73"]
    [metrics] = [line for line in out.splitlines() if line.startswith("type: metrics-generated")]
    assert metrics.split()[2:5] == ["400", "95.8%", "0.91"]
    assert "leniency on answers shorter than the median (127 words): 7.7% (20 of 261)" in out

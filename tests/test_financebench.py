"""The FinanceBench loader: index specs, prompts from the evidence pages, errors with line numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from compressor_2.common.errors import ConfigError
from compressor_2.config import load_config
from compressor_2.data.financebench import examples_from_config, load_examples, parse_indices
from compressor_2.data.prompt import DEFAULT_TEMPLATE
from tests.conftest import REPO


def record(i: int, **changes: Any) -> dict[str, Any]:
    base = {
        "financebench_id": f"financebench_id_{i:05d}",
        "question_type": "metrics-generated",
        "question": f"  What is metric {i}?  ",
        "answer": f"${i}.00",
        "evidence": [
            {"evidence_text": "short", "evidence_text_full_page": f"Page A of {i}: revenue {i}."},
            {"evidence_text": "short", "evidence_text_full_page": f"Page B of {i}."},
        ],
    }
    base.update(changes)
    return base


def write_jsonl(path: Path, rows: list[Any], blank_line_after: int | None = None) -> Path:
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    if blank_line_after is not None:
        lines.insert(blank_line_after, "")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "fb.jsonl", [record(i) for i in range(10)])


# --- index specs ---------------------------------------------------------------

@pytest.mark.parametrize(("spec", "expected"), [
    ("all", list(range(10))),
    (" all ", list(range(10))),
    ("3", [3]),
    ("0,3,5-7", [0, 3, 5, 6, 7]),
    ("9, 0 , 2-3", [9, 0, 2, 3]),
    ("4-4", [4]),
])
def test_parse_indices_accepts_all_lists_and_inclusive_ranges(spec: str, expected: list[int]) -> None:
    assert parse_indices(spec, 10, "test") == expected


@pytest.mark.parametrize(("spec", "culprit"), [
    ("10", "index 10"),
    ("0,3-12", "index 12"),
    ("a", "'a'"),
    ("1,,2", "''"),
    ("-1", "'-1'"),
    ("1.5", "'1.5'"),
    ("5-2", "'5-2'"),
    ("", "''"),
    ("ALL", "'ALL'"),
    ("1,1,0-2", "index 1 more than once ('1' and '0-2')"),  # issue AB: it counted the question once, silently
    ("0-5,3", "index 3 more than once ('0-5' and '3')"),
])
def test_parse_indices_names_the_bad_part(spec: str, culprit: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_indices(spec, 10, "CONFIG_X")
    assert "CONFIG_X" in str(info.value) and culprit in str(info.value)


def test_out_of_range_index_names_the_dataset_size(dataset: Path) -> None:
    with pytest.raises(ConfigError, match=r"index 10 is out of range \(the dataset has 10 examples, 0-9\)"):
        load_examples(dataset, "2,10")


# --- examples and prompts --------------------------------------------------------

def test_examples_carry_fields_and_oracle_prompt(dataset: Path) -> None:
    examples = load_examples(dataset, "3,1")
    assert [e.id for e in examples] == ["financebench_id_00003", "financebench_id_00001"]
    first = examples[0]
    assert first.gold == "$3.00"
    assert first.question_type == "metrics-generated"
    assert first.question == "  What is metric 3?  "
    # Full evidence pages (not the short evidence_text), in order, then the question.
    assert first.prompt == "Evidence:\nPage A of 3: revenue 3.\n\nPage B of 3.\n\nQuestion: What is metric 3?"


def test_custom_template_and_evidence_cap(dataset: Path) -> None:
    template = "Q={question}\nE=[{evidence}]"
    (example,) = load_examples(dataset, "2", template=template, max_evidence_chars=9)
    assert example.prompt == "Q=What is metric 2?\nE=[Page A of]"
    (uncapped,) = load_examples(dataset, "2", template=template, max_evidence_chars=0)
    assert uncapped.prompt == "Q=What is metric 2?\nE=[Page A of 2: revenue 2.\n\nPage B of 2.]"


def test_question_type_is_optional_and_blank_lines_are_skipped(tmp_path: Path) -> None:
    rows = [record(0), {k: v for k, v in record(1).items() if k != "question_type"}]
    path = write_jsonl(tmp_path / "fb.jsonl", rows, blank_line_after=1)
    examples = load_examples(path)
    assert [e.question_type for e in examples] == ["metrics-generated", None]
    assert [e.id for e in examples] == ["financebench_id_00000", "financebench_id_00001"]


def test_empty_evidence_list_gives_an_empty_evidence_block(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "fb.jsonl", [record(0, evidence=[])])
    (example,) = load_examples(path)
    assert example.prompt == "Evidence:\n\n\nQuestion: What is metric 0?"


# --- errors with file and line number ----------------------------------------------

def _error(tmp_path: Path, bad: Any, line_of_bad: int = 3) -> str:
    rows: list[Any] = [record(0), record(1), record(2)]
    rows.insert(line_of_bad - 1, bad)
    path = write_jsonl(tmp_path / "broken.jsonl", rows)
    with pytest.raises(ConfigError) as info:
        load_examples(path, "0")  # the whole file is validated, not only the selection
    return str(info.value)


def _without(field: str) -> dict[str, Any]:
    return {k: v for k, v in record(9).items() if k != field}


@pytest.mark.parametrize(("bad", "expected"), [
    ('{"financebench_id": "x", ', "not valid JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    (_without("financebench_id"), "missing field 'financebench_id'"),
    (_without("question"), "missing field 'question'"),
    (_without("answer"), "missing field 'answer'"),
    (_without("evidence"), "field 'evidence' is missing"),
    (record(9, evidence="page"), "field 'evidence' is not a list"),
    (record(9, evidence=[{"evidence_text": "x"}]), "evidence[0] lacks the string field 'evidence_text_full_page'"),
    (record(9, answer=1577), "field 'answer' must be a non-empty string"),
    (record(9, question="  "), "field 'question' must be a non-empty string"),
    (record(9, question_type=3), "field 'question_type' must be a string"),
])
def test_malformed_line_names_file_and_line(tmp_path: Path, bad: Any, expected: str) -> None:
    message = _error(tmp_path, bad, line_of_bad=3)
    assert f"broken.jsonl:3: {expected}" in message


def test_line_numbers_count_blank_lines(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "fb.jsonl", [record(0), "{oops"], blank_line_after=1)
    with pytest.raises(ConfigError, match=r"fb\.jsonl:3: not valid JSON"):
        load_examples(path)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nowhere.jsonl' not found"):
        load_examples(tmp_path / "nowhere.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(ConfigError, match="empty.jsonl' has no examples"):
        load_examples(tmp_path / "empty.jsonl")


# --- from the config ------------------------------------------------------------------

def _config(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "test.config"
    path.write_text((REPO / "defconfig").read_text() + extra)
    return path


def test_examples_from_config_uses_pool_template_and_cap(dataset: Path, tmp_path: Path) -> None:
    template = tmp_path / "template.txt"
    template.write_text("<<{question}>> {evidence}")
    config = load_config(_config(tmp_path, (
        f'CONFIG_FINANCEBENCH_JSONL_PATH="{dataset}"\n'
        'CONFIG_FINANCEBENCH_POOL_INDICES="1-2,5"\n'
        f'CONFIG_PROMPT_TEMPLATE_PATH="{template}"\n'
        "CONFIG_EVIDENCE_MAX_CHARS=6\n"
    )))
    examples = examples_from_config(config)
    assert [e.id[-1] for e in examples] == ["1", "2", "5"]
    assert examples[0].prompt == "<<What is metric 1?>> Page A"
    # --indices overrides the configured pool (evaluate on held-out questions).
    assert [e.id[-1] for e in examples_from_config(config, "9")] == ["9"]


def test_examples_from_config_reports_pool_out_of_range(dataset: Path, tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, (
        f'CONFIG_FINANCEBENCH_JSONL_PATH="{dataset}"\n'
        'CONFIG_FINANCEBENCH_POOL_INDICES="0-40"\n'
    )))
    with pytest.raises(ConfigError, match="index 40 is out of range"):
        examples_from_config(config)


def test_default_template_is_the_builtin_one(dataset: Path, tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, f'CONFIG_FINANCEBENCH_JSONL_PATH="{dataset}"\n'))
    (example,) = examples_from_config(config, "0")
    assert example.prompt == DEFAULT_TEMPLATE.format(
        evidence="Page A of 0: revenue 0.\n\nPage B of 0.", question="What is metric 0?")


# --- the real file ---------------------------------------------------------------------

def test_real_financebench_file(financebench_dir: Path) -> None:
    examples = load_examples(financebench_dir / "financebench_open_source.jsonl")
    assert len(examples) == 150
    assert len({e.id for e in examples}) == 150
    kinds = {k: sum(e.question_type == k for e in examples) for k in
             ("metrics-generated", "domain-relevant", "novel-generated")}
    assert kinds == {"metrics-generated": 50, "domain-relevant": 50, "novel-generated": 50}
    first = examples[0]
    assert first.id == "financebench_id_03029" and first.gold == "$1577.00"
    assert "Purchases of property, plant and equipment" in first.prompt
    assert first.prompt.endswith("Question: " + first.question.strip())
    capped = load_examples(financebench_dir / "financebench_open_source.jsonl", "0", max_evidence_chars=500)
    assert len(capped[0].prompt) == len("Evidence:\n\n\nQuestion: ") + 500 + len(first.question.strip())

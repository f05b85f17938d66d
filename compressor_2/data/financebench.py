"""FinanceBench JSONL -> `Example`s, with the evidence pages in the prompt (the "oracle" setting).

Only the fields FinanceBench always has are required (the synthetic demo writes the
same shape): financebench_id, question, answer, evidence[].evidence_text_full_page.
question_type is optional.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compressor_2.common import ConfigError, check_readable_file
from compressor_2.config import Config, repeated
from compressor_2.data.example import Example
from compressor_2.data.prompt import DEFAULT_TEMPLATE, build_prompt, instructed, load_template

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def parse_indices(spec: str, n: int, source: str) -> list[int]:
    """0-based indices from "all" or "0,3,5-9" (inclusive ranges), in the order given; an
    index named twice is refused (the question would count twice); `source` names where the
    spec came from in errors."""
    spec = spec.strip()
    if spec == "all":
        return list(range(n))
    if (found := repeated(spec)) is not None:
        index, first, second = found
        raise ConfigError(f"{source}: {spec!r} names index {index} more than once ({first!r} and {second!r}): "
                          "list each once")
    indices: list[int] = []
    for part in spec.split(","):
        match = _RANGE.fullmatch(part.strip())
        if match is None:
            raise ConfigError(
                f"{source}: {part.strip()!r} in {spec!r} is not an index or a range like '5-9' "
                "(use 'all' or e.g. '0,3,5-9')"
            )
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise ConfigError(f"{source}: range {part.strip()!r} runs backwards")
        if last >= n:
            raise ConfigError(
                f"{source}: index {last} is out of range (the dataset has {n} examples, 0-{n - 1})"
            )
        indices.extend(range(first, last + 1))
    return indices


def load_examples(path: Path, indices: str = "all", template: str = DEFAULT_TEMPLATE,
                  max_evidence_chars: int = 0, setting: str = "") -> list[Example]:
    """The examples at `indices` (0-based, counting non-blank lines) of the JSONL at `path`.
    Every line is validated, so a broken file fails whatever the selection. `setting` names
    the option `indices` came from, for its errors."""
    records = _read_records(path)
    chosen = parse_indices(indices, len(records), f"{setting + ': ' if setting else ''}indices for '{path}'")
    return [_example(records[i], template, max_evidence_chars) for i in chosen]


def examples_from_config(config: Config, indices: str | None = None) -> list[Example]:
    """The configured pool, or `indices` (e.g. from `evaluate --indices`) when given, as the
    run asks them (`as_asked`)."""
    return as_asked(config, load_examples(
        config.financebench_jsonl_path,
        config.pool_indices if indices is None else indices,
        load_template(config.prompt_template_path),
        config.evidence_max_chars,
        "CONFIG_FINANCEBENCH_POOL_INDICES" if indices is None else "",
    ))


def as_asked(config: Config, examples: list[Example]) -> list[Example]:
    """The examples as the run sends them: with CONFIG_INSTRUCTION_IN_SEARCH, the instruction
    after every prompt, as the instruction tool adds it (the same prompts, the same ids)."""
    return list(instructed(examples, config.compare_instruction)) if config.instruction_in_search else examples


def holdout_examples(config: Config, pool: Sequence[Example]) -> list[Example]:
    """CONFIG_HOLDOUT_DATA / CONFIG_HOLDOUT_INDICES (none when both are empty), refused when
    one of them is also in the training `pool` (the same id, or the same prompt): a
    held-out score over questions the search was trained on would flatter it."""
    if config.holdout_data is None and not config.holdout_indices:
        return []
    source = "CONFIG_HOLDOUT_INDICES" if config.holdout_data is None else "CONFIG_HOLDOUT_DATA"
    examples = load_examples(config.holdout_data or config.financebench_jsonl_path,
                             config.holdout_indices or "all", load_template(config.prompt_template_path),
                             config.evidence_max_chars, "CONFIG_HOLDOUT_INDICES")
    asked = as_asked(config, examples)
    ids, prompts = {ex.id for ex in pool}, {ex.prompt for ex in pool}
    for ex, sent in zip(examples, asked):
        if sent.id in ids or sent.prompt in prompts:
            raise ConfigError(f"{source}: held-out example {ex.id!r} is also in the training pool "
                              "(CONFIG_FINANCEBENCH_JSONL_PATH, CONFIG_FINANCEBENCH_POOL_INDICES): the held-out "
                              "questions must be disjoint from the pool")
    return asked


def _read_records(path: Path) -> list[dict[str, Any]]:
    check_readable_file(path, "FinanceBench file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"FinanceBench file '{path}' not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"FinanceBench file '{path}' cannot be read: {exc}") from None
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(record, dict):
            raise ConfigError(f"{where}: expected a JSON object, got {type(record).__name__}")
        _validate(record, where)
        records.append(record)
    if not records:
        raise ConfigError(f"FinanceBench file '{path}' has no examples")
    return records


def _validate(record: dict[str, Any], where: str) -> None:
    for field in ("financebench_id", "question", "answer"):
        if field not in record:
            raise ConfigError(f"{where}: missing field '{field}'")
        if not isinstance(record[field], str) or not record[field].strip():
            raise ConfigError(f"{where}: field '{field}' must be a non-empty string")
    evidence = record.get("evidence")
    if not isinstance(evidence, list):
        raise ConfigError(
            f"{where}: field 'evidence' is {'missing' if evidence is None else 'not a list'}"
        )
    for k, item in enumerate(evidence):
        if not isinstance(item, dict) or not isinstance(item.get("evidence_text_full_page"), str):
            raise ConfigError(f"{where}: evidence[{k}] lacks the string field 'evidence_text_full_page'")
    kind = record.get("question_type")
    if kind is not None and not isinstance(kind, str):
        raise ConfigError(f"{where}: field 'question_type' must be a string")


def _example(record: dict[str, Any], template: str, max_evidence_chars: int) -> Example:
    pages = [item["evidence_text_full_page"] for item in record["evidence"]]
    return Example(
        id=record["financebench_id"],
        question=record["question"],
        gold=record["answer"],
        prompt=build_prompt(record["question"], pages, template, max_evidence_chars),
        question_type=record.get("question_type"),
    )

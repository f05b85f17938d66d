"""The OpenAI reflector over real HTTP against a fake OpenAI-compatible server on 127.0.0.1.

The server checks every request against the mutation and merge templates, typed out again here so an
accidental edit of the prompts module fails.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from compressor_2.common.errors import ConfigError, RunError
from compressor_2.config import load_config
from compressor_2.fitness import Record
from compressor_2.reflector.base import MergeRequest, MutationRequest
from compressor_2.reflector.openai_reflector import OpenAIProposer
from compressor_2.reflector.prompt_log import PromptLog
from compressor_2.reflector.validation import ValidatingReflector
from tests.conftest import REPO
from tests.fakes.openai_server import FakeOpenAIServer, chat_completion, error_body

KEY = "sk-test-SECRET-4242"
MODEL = "reflector-model-x"

SEED_MUTATION_SYSTEM = "You are a reflector for a steering system that adjusts LLM outputs by cluster. Your task is to propose a new delta value for a specific target cluster (chosen by the driver) to reduce verbosity without harming correctness. You receive: (1) cluster descriptions, (2) the current delta vector and scratchpad for this individual, (3) the target cluster to mutate, (4) training-set responses with per-example correctness and explanation. The target cluster is fixed for this call; you MUST change its delta to a new value (different from the current value). All other clusters remain unchanged. Output only a JSON object with two fields: \"delta\" (number), \"scratchpad\" (string \u2014 your updated scratchpad for this evolution path, appending what you learnt this step). Negative deltas discourage tokens in that cluster. No other commentary."  # noqa: E501

SEED_MUTATION_USER = """## Cluster descriptions
<<cluster_descriptions_json>>

## Current delta vector
<<current_deltas_json>>

## Current scratchpad
<<current_scratchpad>>

## Target cluster to mutate (must change)
<<target_cluster_id>>

## Training-set responses (correctness and explanation per example)
<<all_responses_with_correctness>>

---
Propose a new delta value for the target cluster above to improve shortness without harming correctness. The delta MUST be different from the current value for that cluster. All other clusters remain unchanged. Update the scratchpad with what you learnt. Output only: {"delta": <float>, "scratchpad": "<string>"}."""  # noqa: E501

SEED_MERGE_SYSTEM = "You are a reflector that merges two scratchpads from two parent individuals in an evolutionary run. You receive two scratchpads and the fitness value of each parent. Your task is to produce a single merged scratchpad for their child. The merged scratchpad should combine the insights from both parents. If there are conflicting claims between the two scratchpads, prefer the claim from the parent with the higher fitness (more evidence-supported). Output only a JSON object with one field: \"scratchpad\" (string). No other commentary."  # noqa: E501

SEED_MERGE_USER = """## Parent A (fitness: <<fitness_a>>)
<<scratchpad_a>>

## Parent B (fitness: <<fitness_b>>)
<<scratchpad_b>>

---
Merge these two scratchpads into one for the child. When claims conflict, favor the higher-fitness parent. Output only: {"scratchpad": "<merged string>"}."""  # noqa: E501

MUTATION_SCHEMA = {"type": "object", "properties": {"delta": {"type": "number"}, "scratchpad": {"type": "string"}},
                   "required": ["delta", "scratchpad"], "additionalProperties": False}
MERGE_SCHEMA = {"type": "object", "properties": {"scratchpad": {"type": "string"}},
                "required": ["scratchpad"], "additionalProperties": False}

DESCRIPTIONS = {"0": {"description": "EOS", "size": 1, "tokens": ["</s>"]},
                "1": {"description": "numbers", "size": 2, "tokens": ["1", "2"]}}
RECORDS = [
    Record("fb-1", "What was revenue?", "Based on the filing, revenue was $1,577 million.", "$1,577 million",
           14, True, "1577 matches the gold"),
    Record("fb-2", "Net income and revenue?", "Net income was 5,363", "5,363 and 1,577", 6, False,
           "the gold's 1,577 is missing"),
]
MUTATION = MutationRequest(2, 1, "0", {"0": 0.5, "1": -1.0}, "g1: earlier note {with braces}", 0.61, RECORDS)
MERGE = MergeRequest(2, 3, (0, 4), "pad of A", 0.7, "", 0.25)


def expected_mutation_user(answer_max_chars: int) -> str:
    responses = "\n\n".join(
        f"### Example {n} of 2: id {r.id}\ncorrect: {'yes' if r.is_correct else 'no'}\ntokens: {r.tokens}\n"
        f"explanation: {r.reasoning}\nanswer:\n"
        + (r.answer if len(r.answer) <= answer_max_chars
           else f"{r.answer[:answer_max_chars]} [... {len(r.answer) - answer_max_chars} more characters]")
        for n, r in enumerate(RECORDS, 1))
    values = {
        "cluster_descriptions_json": json.dumps(DESCRIPTIONS, indent=2),
        "current_deltas_json": json.dumps({"0": 0.5, "1": -1.0}, indent=2),
        "current_scratchpad": "g1: earlier note {with braces}",
        "target_cluster_id": "0",
        "all_responses_with_correctness": responses,
    }
    text = SEED_MUTATION_USER
    for name, value in values.items():
        text = text.replace(f"<<{name}>>", value)
    return text


EXPECTED_MERGE_USER = (SEED_MERGE_USER.replace("<<fitness_a>>", "0.7000").replace("<<scratchpad_a>>", "pad of A")
                       .replace("<<fitness_b>>", "0.2500").replace("<<scratchpad_b>>", "(empty)"))


class Script:
    """Answers requests in order; checks each against the seed before answering."""

    def __init__(self, answers: list[tuple[int, object]]) -> None:
        self.answers = list(answers)
        self.problems: list[str] = []

    def __call__(self, body: dict) -> tuple[int, object]:
        self.check(body)
        return self.answers.pop(0)

    def check(self, body: dict) -> None:
        system, user = body["messages"]
        fmt = body["response_format"]
        if body["model"] != MODEL:
            self.problems.append(f"model {body['model']}")
        if fmt["type"] != "json_schema" or fmt["json_schema"]["strict"] is not True:
            self.problems.append(f"response_format {fmt}")
        if system["content"] == SEED_MUTATION_SYSTEM:
            ok = user["content"] == expected_mutation_user(30) and fmt["json_schema"]["schema"] == MUTATION_SCHEMA
        else:
            ok = (system["content"] == SEED_MERGE_SYSTEM and user["content"] == EXPECTED_MERGE_USER
                  and fmt["json_schema"]["schema"] == MERGE_SCHEMA)
        if not ok or (system["role"], user["role"]) != ("system", "user"):
            self.problems.append(f"messages differ from the seed: {body['messages']}")


def reflector(server: FakeOpenAIServer, tmp_path: Path, max_retries: int = 2) -> ValidatingReflector:
    proposer = OpenAIProposer(MODEL, server.base_url, KEY, timeout=10, max_retries=max_retries)
    return ValidatingReflector(proposer, DESCRIPTIONS, 30, PromptLog(tmp_path / "reflector_prompts", f"openai {MODEL}"))


def assert_no_key_written(tmp_path: Path) -> None:
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files
    for path in files:
        assert KEY not in path.read_text(errors="replace"), path


def run(answers: list[tuple[int, object]], tmp_path: Path, call: str = "mutate", max_retries: int = 2):
    script = Script(answers)
    with FakeOpenAIServer(script) as server:
        refl = reflector(server, tmp_path, max_retries)
        result = refl.mutate(MUTATION) if call == "mutate" else refl.merge(MERGE)
        refl.close()
    assert script.problems == []
    assert script.answers == []  # every scripted answer was asked for
    for seen in server.requests:
        assert seen.path == "/v1/chat/completions"
        assert {k.lower(): v for k, v in seen.headers.items()}["authorization"] == f"Bearer {KEY}"
    assert_no_key_written(tmp_path)
    return result, server


def test_a_valid_mutation(tmp_path):
    result, server = run([(200, chat_completion('{"delta": 1.25, "scratchpad": "raised EOS"}', 120, 30))], tmp_path)
    assert (result.delta, result.scratchpad, result.attempts) == (1.25, "raised EOS", 1)
    assert (result.usage.calls, result.usage.prompt_tokens, result.usage.completion_tokens) == (1, 120, 30)
    log = (tmp_path / "reflector_prompts" / "gen_2_mutation_child1_attempt1.txt").read_text()
    assert expected_mutation_user(30) in log and "reflector: openai reflector-model-x" in log


@pytest.mark.parametrize("bad", ['{"delta": "up", "scratchpad": "s"}', '{"delta": 0.5, "scratchpad": "same"}',
                                 "I would raise it a little."])
def test_an_invalid_reply_is_retried_once_then_the_mutation_is_skipped(tmp_path, bad):
    result, server = run([(200, chat_completion(bad)), (200, chat_completion(bad))], tmp_path)
    assert (result.delta, result.scratchpad, result.attempts) == (None, MUTATION.scratchpad, 2)
    assert len(server.requests) == 2
    assert server.requests[0].body == server.requests[1].body  # the retry resends the same prompt


def test_an_unchanged_delta_then_a_new_one(tmp_path):
    result, _ = run([(200, chat_completion('{"delta": 0.5, "scratchpad": "x"}')),
                     (200, chat_completion('{"delta": 0.75, "scratchpad": "y"}'))], tmp_path)
    assert (result.delta, result.attempts) == (0.75, 2)
    assert "equals the current value" in result.rejected[0]


def test_rate_limits_and_server_errors_are_retried_by_the_client(tmp_path):
    result, server = run([(429, error_body("slow down", "rate_limit_exceeded")), (500, error_body("oops")),
                          (200, chat_completion('{"delta": -0.5, "scratchpad": "z"}'))], tmp_path)
    assert (result.delta, result.attempts) == (-0.5, 1)  # one reflector attempt, three HTTP requests
    assert len(server.requests) == 3


def test_a_call_that_keeps_failing_is_an_invalid_output_not_a_crash(tmp_path):
    result, server = run([(500, error_body("down"))] * 4, tmp_path, max_retries=1)
    assert (result.delta, result.attempts) == (None, 2)
    assert all("InternalServerError" in reason for reason in result.rejected)
    assert len(server.requests) == 4  # 2 attempts x (1 try + 1 client retry)
    log = (tmp_path / "reflector_prompts" / "gen_2_mutation_child1_attempt2.txt").read_text()
    assert "(call failed: InternalServerError" in log


def test_a_valid_merge(tmp_path):
    result, _ = run([(200, chat_completion('{"scratchpad": "merged notes"}'))], tmp_path, call="merge")
    assert (result.scratchpad, result.valid, result.attempts) == ("merged notes", True, 1)
    assert (tmp_path / "reflector_prompts" / "gen_2_merge_child3_attempt1.txt").is_file()


def test_an_invalid_merge_falls_back_to_parent_a(tmp_path):
    result, _ = run([(200, chat_completion("not json")), (200, chat_completion('{"notes": "x"}'))], tmp_path,
                    call="merge")
    assert (result.scratchpad, result.valid, result.attempts) == ("pad of A", False, 2)


def test_a_rejected_key_stops_the_run(tmp_path):
    with FakeOpenAIServer(lambda body: (401, error_body("bad key", "invalid_api_key"))) as server:
        refl = reflector(server, tmp_path)
        with pytest.raises(RunError, match="answered 401") as excinfo:
            refl.mutate(MUTATION)
    assert KEY not in str(excinfo.value)


def test_a_missing_key_names_the_variable(monkeypatch):
    config = dataclasses.replace(load_config(REPO / "defconfig"), reflector="openai",
                                 reflector_api_key_env="C2_TEST_REFLECTOR_KEY")
    monkeypatch.delenv("C2_TEST_REFLECTOR_KEY", raising=False)
    with pytest.raises(ConfigError, match="C2_TEST_REFLECTOR_KEY"):
        OpenAIProposer.from_config(config)

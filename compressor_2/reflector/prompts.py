"""The seed's reflector prompts (000 §3.1, §4.1) verbatim, their strict JSON schemas, and
the substitution that turns a request into the exact messages sent and logged."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from compressor_2.fitness import Record
from compressor_2.reflector.base import MergeRequest, Message, MutationRequest

if TYPE_CHECKING:
    from compressor_2.config import Config

MUTATION_SYSTEM = (
    "You are a reflector for a steering system that adjusts LLM outputs by cluster. Your task is to "
    "propose a new delta value for a specific target cluster (chosen by the driver) to reduce verbosity "
    "without harming correctness. You receive: (1) cluster descriptions, (2) the current delta vector "
    "and scratchpad for this individual, (3) the target cluster to mutate, (4) training-set responses "
    "with per-example correctness and explanation. The target cluster is fixed for this call; you MUST "
    "change its delta to a new value (different from the current value). All other clusters remain "
    "unchanged. Output only a JSON object with two fields: \"delta\" (number), \"scratchpad\" (string "
    "\u2014 your updated scratchpad for this evolution path, appending what you learnt this step). "
    "Negative deltas discourage tokens in that cluster. No other commentary."
)

MUTATION_USER = """\
## Cluster descriptions
{cluster_descriptions_json}

## Current delta vector
{current_deltas_json}

## Current scratchpad
{current_scratchpad}

## Target cluster to mutate (must change)
{target_cluster_id}

## Training-set responses (correctness and explanation per example)
{all_responses_with_correctness}

---
Propose a new delta value for the target cluster above to improve shortness without harming \
correctness. The delta MUST be different from the current value for that cluster. All other \
clusters remain unchanged. Update the scratchpad with what you learnt. Output only: \
{"delta": <float>, "scratchpad": "<string>"}."""

MERGE_SYSTEM = (
    "You are a reflector that merges two scratchpads from two parent individuals in an evolutionary "
    "run. You receive two scratchpads and the fitness value of each parent. Your task is to produce a "
    "single merged scratchpad for their child. The merged scratchpad should combine the insights from "
    "both parents. If there are conflicting claims between the two scratchpads, prefer the claim from "
    "the parent with the higher fitness (more evidence-supported). Output only a JSON object with one "
    "field: \"scratchpad\" (string). No other commentary."
)

MERGE_USER = """\
## Parent A (fitness: {fitness_a})
{scratchpad_a}

## Parent B (fitness: {fitness_b})
{scratchpad_b}

---
Merge these two scratchpads into one for the child. When claims conflict, favor the \
higher-fitness parent. Output only: {"scratchpad": "<merged string>"}."""

MUTATION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"delta": {"type": "number"}, "scratchpad": {"type": "string"}},
    "required": ["delta", "scratchpad"],
    "additionalProperties": False,
}

MERGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"scratchpad": {"type": "string"}},
    "required": ["scratchpad"],
    "additionalProperties": False,
}

EMPTY_SCRATCHPAD = "(empty)"


def substitute(template: str, values: Mapping[str, str]) -> str:
    """One pass over `{name}` placeholders, so substituted text that itself contains
    braces (JSON, a scratchpad quoting a template) is never substituted again."""
    pattern = re.compile(r"\{(" + "|".join(map(re.escape, values)) + r")\}")
    return pattern.sub(lambda m: values[m.group(1)], template)


def show_fitness(value: float) -> str:
    return f"{value:.4f}"


def show_scratchpad(scratchpad: str) -> str:
    return scratchpad if scratchpad.strip() else EMPTY_SCRATCHPAD


def responses_block(records: Sequence[Record], answer_max_chars: int) -> str:
    """Every training example: id, correct yes/no, tokens, the judge's explanation and the
    answer, capped at `answer_max_chars` characters."""
    blocks = []
    for n, record in enumerate(records, 1):
        answer = record.answer
        if len(answer) > answer_max_chars:
            answer = f"{answer[:answer_max_chars]} [... {len(answer) - answer_max_chars} more characters]"
        blocks.append(
            f"### Example {n} of {len(records)}: id {record.id}\n"
            f"correct: {'yes' if record.is_correct else 'no'}\n"
            f"tokens: {record.tokens}\n"
            f"explanation: {record.reasoning}\n"
            f"answer:\n{answer}"
        )
    return "\n\n".join(blocks)


def mutation_messages(request: MutationRequest, descriptions: Mapping[str, Any],
                      answer_max_chars: int) -> list[Message]:
    user = substitute(MUTATION_USER, {
        "cluster_descriptions_json": json.dumps(descriptions, indent=2, ensure_ascii=False),
        "current_deltas_json": json.dumps(dict(request.deltas), indent=2),
        "current_scratchpad": show_scratchpad(request.scratchpad),
        "target_cluster_id": request.target,
        "all_responses_with_correctness": responses_block(request.records, answer_max_chars),
    })
    return [{"role": "system", "content": MUTATION_SYSTEM}, {"role": "user", "content": user}]


def merge_messages(request: MergeRequest) -> list[Message]:
    user = substitute(MERGE_USER, {
        "fitness_a": show_fitness(request.fitness_a),
        "scratchpad_a": show_scratchpad(request.scratchpad_a),
        "fitness_b": show_fitness(request.fitness_b),
        "scratchpad_b": show_scratchpad(request.scratchpad_b),
    })
    return [{"role": "system", "content": MERGE_SYSTEM}, {"role": "user", "content": user}]


CHARS_PER_TOKEN = 4  # a rough average for English and JSON
SCRATCHPAD_CHARS = 2000  # a lineage's notes, once it has some
DESCRIPTION_CHARS = 300  # one cluster's entry in the descriptions JSON
REPLY_TOKENS = 400


def estimated_call_tokens(config: Config, n_examples: int) -> float:
    """About what one mutation call costs (prompt + reply), before any answer exists: every
    example's block with an answer of max_new_tokens (capped as the prompt caps it)."""
    answer_chars = min(config.reflector_answer_max_chars, CHARS_PER_TOKEN * config.max_new_tokens)
    chars = (len(MUTATION_SYSTEM) + len(MUTATION_USER) + SCRATCHPAD_CHARS
             + (config.num_clusters + 2) * DESCRIPTION_CHARS + n_examples * (200 + answer_chars))
    return chars / CHARS_PER_TOKEN + REPLY_TOKENS

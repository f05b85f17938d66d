"""Every reflector prompt in one place: the mutation, merge and full-vector mutation
prompts word for word as the design gives them, the selection request written for our
domain; their strict JSON schemas; and the substitution that turns a request into the
exact messages sent and logged."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from compressor_2.clusters.roles import cluster_count
from compressor_2.deltas import phase_count, split_gene
from compressor_2.fitness import Record
from compressor_2.reflector.base import (
    MergeRequest, Message, MutationRequest, PopulationMember, SelectionRequest, VectorRequest,
)
from compressor_2.reflector.evidence import Evidence, evidence_lines
from compressor_2.reflector.limits import keep_first

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

VECTOR_SYSTEM = (
    "You are a reflector for a steering system that adjusts LLM outputs by cluster. Your task is to spot "
    "padding, verbosity, and fluff in the given model responses and propose per-cluster steering deltas (a "
    "float per cluster id) so that future responses become razor-sharp. You will receive: (1) cluster "
    "descriptions (what each cluster id means), (2) the deltas that were used for this minibatch (the "
    "baseline you are adjusting from), (3) all minibatch model responses with per-example correctness and "
    "explanation, and (4) the evolving summary of what you have learnt so far (CoT), which you have updated "
    "in previous iterations. You must output a JSON object with two fields: \"deltas\" (object mapping each "
    "cluster id string \"0\", \"1\", ... to a float) and \"summary\" (your update to the evolving summary: "
    "2\u20134 sentences on what you learnt this round\u2014the driver will append this and serve the "
    "accumulated evolving summary back to you in later iterations). Negative deltas discourage tokens in that "
    "cluster; positive can boost. Do not be given any example deltas\u2014propose from reasoning only."
)

VECTOR_USER = """\
## Cluster descriptions
{cluster_descriptions_json}

## Deltas used for this minibatch (baseline to adjust from)
{current_deltas_json}

## Evolving summary (what you have learnt so far; you update this each round and it is served back to \
you in later iterations)
{cot_summary}

## All minibatch responses (with correctness and explanation per example)
{all_responses_with_correctness}

---
Spot and eliminate any padding, verbosity, or fluff in these responses. Given the deltas that were used \
for this minibatch (above), propose updated deltas for each cluster so that responses become \
razor-sharp. You must also update the evolving summary: provide 2\u20134 sentences on what you learnt this \
round (e.g. which clusters added fluff, what you changed, what to try next); this update will be \
appended and served back to you in later iterations. Output only a JSON object with two fields: \
"deltas" (object with string keys "0", "1", ... and float values) and "summary" (string, your update \
to the evolving summary). No other commentary."""

FIRST_SUMMARY = "First iteration; no prior learnings."

# With answer phases (CONFIG_DELTA_PHASES > 1), after the cluster descriptions of the
# mutation and full-vector prompts; a one-phase run's prompts are the seeds' verbatim.
PHASES_NOTE = """

## Answer phases
This run steers with {count} delta vectors, one per phase of the answer: a response's phase is read \
from the tokens it has generated so far. Every delta id below and in your output is "phase:cluster" \
(e.g. "1:0" is cluster 0 in phase 1), not a bare cluster id.
{phases}"""
FIRST_FIGURE = "- phase 0: up to the end of the response's first figure (digit tokens, possibly joined by , . %)"
PHASES = {
    2: (FIRST_FIGURE, "- phase 1: after the first figure"),
    3: (FIRST_FIGURE, "- phase 1: after the first figure, until a line break",
        "- phase 2: from the first line break after the first figure on"),
}

# With the stop oracle's evidence (CONFIG_REFLECTOR_PADDING_EVIDENCE), before the first example of
# the mutation and full-vector prompts; each example's evidence stands on the lines "stop:" and
# "missing gold figures:" before its answer. Without it the prompts are the seeds' verbatim.
PADDING_NOTE = """\
Where each response could have stopped: "stop:" names the token count after which the judge \
already accepts the response, the token it generated there instead of ending{phase}, and the \
padding after it by cluster (tokens per cluster). "missing gold figures:" lists the gold figures an \
incorrect response lacks and the clusters of their digits: lowering those clusters would cost \
correctness.

"""
PADDING_PHASE = " (and the phase it was generated in: that phase's EOS delta decides)"

SELECTION_SYSTEM = (
    "You select which candidates of a genetic algorithm carry forward. Each candidate is a vector of "
    "per-cluster logit steering deltas that makes a language model answer questions about financial "
    "filings more briefly; its fitness combines shortness (fewer answer tokens) and correctness on a "
    "fixed training set, and its scratchpad holds what its lineage has learnt. The candidates you select "
    "become the parents of the next generation: children are crossovers and mutations of them. Output "
    "only a JSON object with two fields: \"selections\" (2 to 5 objects, each with \"candidate_id\", "
    "\"reasoning\" and \"category\") and \"summary\" (one or two sentences on the selection as a whole). "
    "No other commentary."
)

SELECTION_USER = """\
Generation {generation} is evaluated. {count} candidates.

## Candidate results (sorted by fitness, all shown)

{results}

## Your task

Select 2-5 candidates to carry forward. Consider:
- **Performance**: which candidates have the best fitness: short answers that stay correct?
- **Diversity**: which candidates steer differently (other deltas, another lineage) and are worth \
exploring?
- **Potential**: which candidates might improve with refinement, even if their fitness is lower now \
(e.g. a large gain over their parent, correct but still long answers)?

Balance performance with diversity. Give each selection a category: "performance", "diversity" or \
"potential". Output only: {"selections": [{"candidate_id": <integer>, "reasoning": "<why>", \
"category": "<category>"}], "summary": "<string>"}."""

SELECTION_SCRATCHPAD_CHARS = 300  # "the first part of its scratchpad"
CATEGORIES = ("performance", "diversity", "potential")

SELECTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "selections": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "candidate_id": {"type": "integer"},
                    "reasoning": {"type": "string"},
                    "category": {"type": "string", "enum": list(CATEGORIES)},
                },
                "required": ["candidate_id", "reasoning", "category"],
                "additionalProperties": False,
            },
        },
        "summary": {"type": "string"},
    },
    "required": ["selections", "summary"],
    "additionalProperties": False,
}


def vector_schema(cluster_ids: Sequence[str]) -> dict[str, Any]:
    """Exactly the cluster ids, each a number, and the summary."""
    return {
        "type": "object",
        "properties": {
            "deltas": {
                "type": "object",
                "properties": {cid: {"type": "number"} for cid in cluster_ids},
                "required": list(cluster_ids),
                "additionalProperties": False,
            },
            "summary": {"type": "string"},
        },
        "required": ["deltas", "summary"],
        "additionalProperties": False,
    }


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


def responses_block(records: Sequence[Record], answer_max_chars: int, evidence: Evidence | None = None,
                    phases: int = 1) -> str:
    """Every training example: id, correct yes/no, tokens, the judge's explanation, with the
    stop oracle's `evidence` where it stops and what it lacks, and the answer, capped at
    `answer_max_chars` characters."""
    blocks = []
    for n, record in enumerate(records, 1):
        answer = keep_first(record.answer, answer_max_chars)
        found = "".join(f"{line}\n" for line in evidence_lines(evidence[n - 1], phases)) if evidence else ""
        blocks.append(
            f"### Example {n} of {len(records)}: id {record.id}\n"
            f"correct: {'yes' if record.is_correct else 'no'}\n"
            f"tokens: {record.tokens}\n"
            f"explanation: {record.reasoning}\n"
            f"{found}"
            f"answer:\n{answer}"
        )
    note = substitute(PADDING_NOTE, {"phase": PADDING_PHASE if phases > 1 else ""}) if evidence else ""
    return note + "\n\n".join(blocks)


def feedback_block(feedback: Sequence[str]) -> str:
    """The archive strategy's feedback memory: what earlier proposals near this lineage changed and what
    came of it; empty without any."""
    if not feedback:
        return ""
    return "\n\n### Feedback from earlier proposals (change -> observed outcome)\n" + "\n".join(
        f"- {line}" for line in feedback)


def descriptions_block(descriptions: Mapping[str, Any], deltas: Mapping[str, float]) -> str:
    """The cluster descriptions, and with answer phases what each phase is."""
    shown = json.dumps(descriptions, indent=2, ensure_ascii=False)
    count = phase_count(deltas)
    if count == 1:
        return shown
    return shown + substitute(PHASES_NOTE, {"count": str(count), "phases": "\n".join(PHASES[count])})


def deltas_json(deltas: Mapping[str, float], indent: int | None = None) -> str:
    """A genome's deltas as JSON: by id, grouped by answer phase when it has several."""
    if phase_count(deltas) == 1:
        return json.dumps(dict(deltas), indent=indent)
    grouped: dict[str, dict[str, float]] = {}
    for gene, value in deltas.items():
        grouped.setdefault(f"phase {split_gene(gene)[0]}", {})[gene] = value
    return json.dumps(grouped, indent=indent)


def mutation_messages(request: MutationRequest, descriptions: Mapping[str, Any],
                      answer_max_chars: int) -> list[Message]:
    user = substitute(MUTATION_USER, {
        "cluster_descriptions_json": descriptions_block(descriptions, request.deltas),
        "current_deltas_json": deltas_json(request.deltas, indent=2),
        "current_scratchpad": show_scratchpad(request.scratchpad),
        "target_cluster_id": request.target,
        "all_responses_with_correctness": responses_block(request.records, answer_max_chars, request.evidence,
                                                          phase_count(request.deltas))
        + feedback_block(request.feedback),
    })
    return [{"role": "system", "content": MUTATION_SYSTEM}, {"role": "user", "content": user}]


def vector_messages(request: VectorRequest, descriptions: Mapping[str, Any],
                    answer_max_chars: int) -> list[Message]:
    user = substitute(VECTOR_USER, {
        "cluster_descriptions_json": descriptions_block(descriptions, request.deltas),
        "current_deltas_json": deltas_json(request.deltas, indent=2),
        "cot_summary": request.scratchpad if request.scratchpad.strip() else FIRST_SUMMARY,
        "all_responses_with_correctness": responses_block(request.records, answer_max_chars, request.evidence,
                                                          phase_count(request.deltas))
        + feedback_block(request.feedback),
    })
    return [{"role": "system", "content": VECTOR_SYSTEM}, {"role": "user", "content": user}]


def member_block(rank: int, member: PopulationMember) -> str:
    made = member.operator
    if member.parents:
        made += " of " + ", ".join(f"candidate {p}" for p in member.parents)
        if member.parent_fitness is not None:
            made += f" (fittest parent: {show_fitness(member.parent_fitness)})"
    notes = member.scratchpad.strip()
    if len(notes) > SELECTION_SCRATCHPAD_CHARS:
        notes = f"{notes[:SELECTION_SCRATCHPAD_CHARS]} [...]"
    return (f"{rank}. **candidate {member.candidate_id}**\n"
            f"   fitness {show_fitness(member.fitness)}; {member.mean_tokens:.1f} tokens on average; "
            f"{100 * member.correctness:.1f}% correct\n"
            f"   made by: {made}\n"
            f"   deltas: {deltas_json(member.deltas)}\n"
            f"   scratchpad: {notes or EMPTY_SCRATCHPAD}")


def selection_messages(request: SelectionRequest) -> list[Message]:
    ranked = sorted(request.members, key=lambda m: (-m.fitness, m.candidate_id))
    user = substitute(SELECTION_USER, {
        "generation": str(request.generation),
        "count": str(len(request.members)),
        "results": "\n\n".join(member_block(i, m) for i, m in enumerate(ranked, 1)),
    })
    return [{"role": "system", "content": SELECTION_SYSTEM}, {"role": "user", "content": user}]


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
             + cluster_count(config) * DESCRIPTION_CHARS + n_examples * (200 + answer_chars))
    return chars / CHARS_PER_TOKEN + REPLY_TOKENS

"""Reflector prompts, the one set of validation rules, the prompt log, and the local proposer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from compressor_2.clusters.tokens import AnswerTokens
from compressor_2.deltas import DELTA_BOUND
from compressor_2.fitness import Record
from compressor_2.reflector.base import MergeRequest, MutationRequest, Reply, Usage
from compressor_2.reflector.local import (
    MAX_NOTES, LocalProposer, keep_recent, merge_scratchpads, parse_moves,
)
from compressor_2.reflector.prompt_log import PromptLog
from compressor_2.reflector.prompts import (
    MUTATION_SYSTEM, merge_messages, mutation_messages, responses_block, substitute,
)
from compressor_2.reflector.validation import InvalidOutput, ValidatingReflector, parse_mutation, parse_vector

DESCRIPTIONS = {"0": {"description": "EOS"}, "1": {"description": "numbers"}, "2": {"description": "words"}}


def record(i: int, answer: str, tokens: int, correct: bool, gold: str = "42") -> Record:
    return Record(f"q{i}", f"question {i}", answer, gold, tokens, correct, f"judge said {correct}")


def mutation_request(target: str = "2", deltas: dict[str, float] | None = None, scratchpad: str = "",
                     fitness: float = 0.5, records: list[Record] | None = None,
                     generation: int = 3, child: int = 1) -> MutationRequest:
    return MutationRequest(generation, child, target, deltas or {"0": 0.0, "1": 0.0, "2": 0.0},
                           scratchpad, fitness, records or [record(0, "The answer is 42", 5, True)])


class ScriptedProposer:
    """Answers attempts from a script, to exercise the validation rules alone."""

    name = "scripted"

    def __init__(self, replies: list[str | None]) -> None:
        self.replies = list(replies)
        self.attempts: list[int] = []

    def _next(self, attempt: int) -> Reply:
        self.attempts.append(attempt)
        content = self.replies.pop(0)
        return Reply(content, Usage(1, 10, 3), error=None if content is not None else "HTTP 500")

    def mutation(self, request, messages, attempt):
        return self._next(attempt)

    def merge(self, request, messages, attempt):
        return self._next(attempt)

    def close(self) -> None:
        pass


def scripted(replies: list[str | None], log: PromptLog | None = None) -> ValidatingReflector:
    return ValidatingReflector(ScriptedProposer(replies), DESCRIPTIONS, 100, log)


# -- prompts ------------------------------------------------------------------------------

def test_substitution_is_one_pass():
    text = substitute("A {x} B {y}", {"x": "{y}", "y": "Y"})
    assert text == "A {y} B Y"


def test_responses_block_lists_every_example_and_caps_answers():
    block = responses_block([record(0, "x" * 30, 9, True), record(1, "short", 2, False)], 10)
    assert block == (
        "### Example 1 of 2: id q0\ncorrect: yes\ntokens: 9\nexplanation: judge said True\n"
        "answer:\nxxxxxxxxxx [... 20 more characters]\n\n"
        "### Example 2 of 2: id q1\ncorrect: no\ntokens: 2\nexplanation: judge said False\n"
        "answer:\nshort"
    )


def test_mutation_messages_substitute_the_request():
    request = mutation_request(scratchpad="", deltas={"0": 1.5, "1": 0.0, "2": -2.0})
    system, user = mutation_messages(request, DESCRIPTIONS, 100)
    assert system == {"role": "system", "content": MUTATION_SYSTEM}
    content = user["content"]
    assert content.startswith("## Cluster descriptions\n" + json.dumps(DESCRIPTIONS, indent=2))
    assert '"0": 1.5' in content and "## Current scratchpad\n(empty)\n" in content
    assert "## Target cluster to mutate (must change)\n2\n" in content
    assert content.endswith('Output only: {"delta": <float>, "scratchpad": "<string>"}.')


def test_merge_messages_show_both_parents():
    request = MergeRequest(2, 0, (1, 3), "note A", 0.61234, "", 0.5)
    user = merge_messages(request)[1]["content"]
    assert user.startswith("## Parent A (fitness: 0.6123)\nnote A\n\n## Parent B (fitness: 0.5000)\n(empty)\n")


# -- validation ----------------------------------------------------------------------------

def test_a_valid_mutation_is_accepted_at_once():
    reflector = scripted(['{"delta": -1.5, "scratchpad": "learnt"}'])
    result = reflector.mutate(mutation_request())
    assert (result.delta, result.scratchpad, result.attempts, result.rejected) == (-1.5, "learnt", 1, ())
    assert result.usage == Usage(1, 10, 3)


@pytest.mark.parametrize(("bad", "reason"), [
    ('{"delta": "minus one", "scratchpad": "s"}', "not a finite number"),
    ('{"delta": true, "scratchpad": "s"}', "not a finite number"),
    ('{"delta": NaN, "scratchpad": "s"}', "not a finite number"),
    ('{"scratchpad": "s"}', "not a finite number"),
    ('{"delta": 0.0, "scratchpad": "s"}', "equals the current value"),
    ('{"delta": 1e-12, "scratchpad": "s"}', "equals the current value"),
    ('{"delta": 1.0}', "not a string"),
    ("the delta should be 1.0", "not JSON"),
    ("[1.0]", "not a JSON object"),
    (None, "the call failed: HTTP 500"),
])
def test_an_invalid_mutation_is_retried_once(bad, reason):
    proposer = ScriptedProposer([bad, '{"delta": 2, "scratchpad": "second try"}'])
    result = ValidatingReflector(proposer, DESCRIPTIONS, 100).mutate(mutation_request())
    assert (result.delta, result.scratchpad, result.attempts) == (2.0, "second try", 2)
    assert reason in result.rejected[0]
    assert proposer.attempts == [1, 2]
    assert result.usage == Usage(2, 20, 6)


def test_two_invalid_mutations_skip_the_mutation():
    reflector = scripted(['{"delta": 0, "scratchpad": "same"}', "nonsense"])
    request = mutation_request(scratchpad="kept")
    result = reflector.mutate(request)
    assert (result.delta, result.scratchpad, result.attempts) == (None, "kept", 2)
    assert len(result.rejected) == 2
    assert reflector.usage == Usage(2, 20, 6)


def test_an_invalid_merge_is_retried_then_falls_back_to_parent_a():
    request = MergeRequest(1, 0, (0, 2), "pad A", 0.4, "pad B", 0.9)
    result = scripted(['{"pad": "x"}', '{"scratchpad": "merged"}']).merge(request)
    assert (result.scratchpad, result.valid, result.attempts) == ("merged", True, 2)
    result = scripted(["not json", '{"scratchpad": 7}']).merge(request)
    assert (result.scratchpad, result.valid, result.attempts) == ("pad A", False, 2)


def test_parse_mutation_accepts_integers():
    assert parse_mutation(Reply('{"delta": 3, "scratchpad": ""}', Usage()), 0.5) == (3.0, "")


def test_every_attempt_is_logged_with_its_messages_and_verdict(tmp_path: Path):
    log = PromptLog(tmp_path / "reflector_prompts", "scripted")
    reflector = scripted(['{"delta": 0.0, "scratchpad": "s"}', '{"delta": 1.0, "scratchpad": "s"}'], log)
    request = mutation_request(generation=4, child=2)
    reflector.mutate(request)
    first = (tmp_path / "reflector_prompts" / "gen_4_mutation_child2_attempt1.txt").read_text()
    second = (tmp_path / "reflector_prompts" / "gen_4_mutation_child2_attempt2.txt").read_text()
    system, user = mutation_messages(request, DESCRIPTIONS, 100)
    assert first.startswith("generation: 4\ncall: mutation\nchild: 2\ntarget_cluster: 2\nattempt: 1\n")
    assert f"===== system =====\n{system['content']}\n===== user =====\n{user['content']}\n" in first
    assert "rejected: delta 0.0 equals the current value 0.0" in first
    assert "===== verdict =====\naccepted" in second

    scripted(["bad", "bad"], log).merge(MergeRequest(4, 1, (0, 3), "a", 0.5, "b", 0.4))
    merge_log = (tmp_path / "reflector_prompts" / "gen_4_merge_child1_attempt2.txt").read_text()
    assert "parent_a: 0\nparent_b: 3\n" in merge_log and "## Parent A (fitness: 0.5000)" in merge_log


# -- hostile replies (issue T): no key in a verdict or the prompt log, no crash on a long number --

LONG_KEY = "sk-proj-" + "Ab3Xy9" * 25 + "Q7z"  # 161 characters, as OpenAI's project keys run


def test_a_key_echoed_in_a_refused_value_is_masked_before_it_is_cut(tmp_path: Path):
    """`delta` quoting the Authorization header: its repr runs past the 80 characters a
    refused value is shown in, so a cut before the mask kept the key's first 56 characters."""
    from compressor_2.common.api_key import remember

    remember(LONG_KEY)
    verdicts: list[str] = []
    log = PromptLog(tmp_path / "reflector_prompts", "scripted")
    reply = json.dumps({"delta": f"Authorization: Bearer {LONG_KEY}", "scratchpad": "s"})
    reflector = ValidatingReflector(ScriptedProposer([reply, reply]), DESCRIPTIONS, 100, log,
                                    lambda call: verdicts.append(call.outcome))
    result = reflector.mutate(mutation_request(generation=5, child=0))
    assert result.delta is None and len(verdicts) == 2
    written = (tmp_path / "reflector_prompts" / "gen_5_mutation_child0_attempt1.txt").read_text()
    for text in [*result.rejected, *verdicts, written]:
        assert LONG_KEY[:20] not in text
    assert result.rejected[0] == "delta is 'Authorization: Bearer ***', not a finite number"


def test_a_key_across_the_prompt_logs_cut_is_masked_before_it_is_cut(tmp_path: Path):
    from compressor_2.common.api_key import remember
    from compressor_2.reflector.limits import REPLY_LOG_MAX_CHARS

    remember(LONG_KEY)
    reply = "x" * (REPLY_LOG_MAX_CHARS - 40) + f" {LONG_KEY} " + "y" * 500  # the key straddles the cut
    log = PromptLog(tmp_path / "reflector_prompts", "scripted")
    scripted([reply, reply], log).mutate(mutation_request(generation=6, child=1))
    written = (tmp_path / "reflector_prompts" / "gen_6_mutation_child1_attempt1.txt").read_text()
    assert LONG_KEY[:20] not in written
    assert "***" in written and "more characters]" in written  # masked, and still capped


DIGITS_400, DIGITS_5000 = "9" * 400, "9" * 5000  # a float's range ends near 10**308; json's ints at 4,300 digits


@pytest.mark.parametrize("digits", [DIGITS_400, DIGITS_5000], ids=["400 digits", "5,000 digits"])
def test_a_delta_too_long_for_a_float_is_rejected_not_a_crash(digits):
    reply = Reply(f'{{"delta": {digits}, "scratchpad": "s"}}', Usage())
    with pytest.raises(InvalidOutput):
        parse_mutation(reply, 0.5)
    result = scripted([reply.content, '{"delta": 2, "scratchpad": "second try"}']).mutate(mutation_request())
    assert (result.delta, result.attempts) == (2.0, 2)
    assert ("not a finite number" if digits == DIGITS_400 else "number too long") in result.rejected[0]


@pytest.mark.parametrize("digits", [DIGITS_400, DIGITS_5000], ids=["400 digits", "5,000 digits"])
def test_a_vector_delta_too_long_for_a_float_is_rejected_not_a_crash(digits):
    reply = Reply(f'{{"deltas": {{"0": 1, "1": {digits}, "2": 0}}, "summary": "s"}}', Usage())
    with pytest.raises(InvalidOutput, match="not a finite number" if digits == DIGITS_400 else "number too long"):
        parse_vector(reply, {"0": 0.0, "1": 0.0, "2": 0.0})
    assert parse_vector(Reply('{"deltas": {"0": 1, "1": 2, "2": 0}, "summary": "s"}', Usage()),
                        {"0": 0.0, "1": 0.0, "2": 0.0}) == ({"0": 1.0, "1": 2.0, "2": 0.0}, "s")


# -- the local proposer ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def local(tokenizer) -> ValidatingReflector:
    """Cluster 0: EOS; 1: tokens with a digit; 2: every other token."""
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    clusters = np.array([1 if any(ch.isdigit() for ch in tok) else 2 for tok in vocab], dtype=np.int64)
    clusters[tokenizer.eos_token_id] = 0
    return ValidatingReflector(LocalProposer(AnswerTokens(tokenizer, clusters, 3), initial_step=1.0, seed=7), DESCRIPTIONS, 100)


def test_local_raises_eos_when_no_answer_is_cut_short(local):
    records = [record(0, "The answer is 42, I hope this helps", 12, True, gold="42"),
               record(1, "Revenue was 1,577 million", 9, False, gold="5,363")]
    result = local.mutate(mutation_request(target="0", records=records))
    assert 0.8 <= result.delta <= 1.25
    assert "moved cluster 0 up from 0.0000" in result.scratchpad
    assert "no incorrect answer is shorter than its gold answer" in result.scratchpad


def test_local_lowers_eos_when_an_incorrect_answer_is_cut_short(local):
    records = [record(0, "1,577", 3, False, gold="$1,577 million and $5,363 million"),
               record(1, "42", 1, True, gold="42")]
    result = local.mutate(mutation_request(target="0", deltas={"0": 4.0, "1": 0.0, "2": 0.0}, records=records))
    assert 4.0 - 1.25 <= result.delta <= 4.0 - 0.8
    assert "1 incorrect answer(s) are shorter than their gold answer" in result.scratchpad


def test_local_lowers_a_cluster_dense_in_padded_answers(local):
    records = [record(0, "Based on the information provided the answer is 42", 30, True),
               record(1, "42", 2, True), record(2, "It was 42, I hope this helps", 20, True),
               record(3, "42.", 2, True)]
    result = local.mutate(mutation_request(target="2", records=records))
    assert result.delta < 0
    assert "of padded answers vs" in result.scratchpad


def test_local_raises_a_cluster_dense_in_compact_correct_answers(local):
    records = [record(0, "Based on the information provided the answer is 42", 30, False),
               record(1, "42", 2, True), record(2, "It was that, I hope this helps", 20, False),
               record(3, "1,577", 3, True)]
    assert local.mutate(mutation_request(target="1", records=records)).delta > 0


def test_local_probes_downwards_a_cluster_absent_from_every_answer(local):
    records = [record(0, "Yes", 1, True), record(1, "No", 1, False)]
    result = local.mutate(mutation_request(target="1", records=records))
    assert result.delta < 0 and "appear in no answer" in result.scratchpad


def test_local_adapts_its_step_along_the_lineage(local):
    records = [record(0, "Based on the information provided it is 42", 20, True), record(1, "42", 2, True)]
    first = local.mutate(mutation_request(target="2", records=records, fitness=0.5, generation=1))
    (move,) = parse_moves(first.scratchpad.splitlines())
    assert (move.cluster, move.direction, move.step, move.fitness_before) == ("2", -1, 1.0, 0.5)

    better = local.mutate(mutation_request(target="2", deltas={"0": 0.0, "1": 0.0, "2": first.delta},
                                           scratchpad=first.scratchpad, fitness=0.6, records=records,
                                           generation=2))
    assert "moving cluster 2 down paid off (fitness 0.5000 -> 0.6000), so the step grows to 1.5000" in better.scratchpad
    assert "moving it down paid off last time" in better.scratchpad
    assert first.delta - 1.5 * 1.25 <= better.delta <= first.delta - 1.5 * 0.8

    worse = local.mutate(mutation_request(target="2", deltas={"0": 0.0, "1": 0.0, "2": first.delta},
                                          scratchpad=first.scratchpad, fitness=0.4, records=records,
                                          generation=2))
    assert "did not pay off (fitness 0.5000 -> 0.4000), so the step shrinks to 0.5000" in worse.scratchpad
    assert first.delta + 0.5 * 0.8 <= worse.delta <= first.delta + 0.5 * 1.25  # turned round


def test_local_is_deterministic_under_its_seed(local, tokenizer):
    request = mutation_request(target="0")
    assert local.mutate(request) == local.mutate(request)
    other_seed = ValidatingReflector(
        LocalProposer(local.proposer.tokens, initial_step=1.0, seed=8), DESCRIPTIONS, 100)
    assert other_seed.mutate(request).delta != local.mutate(request).delta


def test_local_turns_round_at_the_limit(local):
    deltas = {"0": DELTA_BOUND, "1": 0.0, "2": 0.0}
    result = local.mutate(mutation_request(target="0", deltas=deltas))
    assert result.delta == DELTA_BOUND - 1.0 and "at the limit" in result.scratchpad


def test_local_merge_puts_the_fitter_parent_first_without_repeats(local):
    a = "g1: note one\ng2: shared note"
    b = "g2: shared note\ng3: note three"
    result = local.merge(MergeRequest(4, 0, (0, 1), a, 0.3, b, 0.7))
    assert result.valid and result.scratchpad == "g2: shared note\ng3: note three\ng1: note one"
    result = local.merge(MergeRequest(4, 0, (0, 1), a, 0.7, b, 0.3))
    assert result.scratchpad == "g1: note one\ng2: shared note\ng3: note three"


def test_scratchpads_keep_their_most_recent_notes():
    lines = [f"g{g}: note {g}" for g in range(MAX_NOTES + 5)]
    kept = keep_recent(lines[::-1])
    assert len(kept) == MAX_NOTES and kept == lines[::-1][:MAX_NOTES]
    assert merge_scratchpads("", "") == ""

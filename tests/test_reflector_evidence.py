"""The reflectors read where padding starts (CONFIG_REFLECTOR_PADDING_EVIDENCE,
compressor_2/reflector/evidence.py): the stop oracle's evidence on answers written here,
tokenised with the demo model's tokenizer through a cluster map the test makes (0 the end
token, 1 numbers, 2 line breaks, 3 "." and ",", 4 everything else) and judged by the numeric
judge; the local reflector's moves on it, their determinism, and the OpenAI prompt."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest

from compressor_2.archive import Answer
from compressor_2.clusters.special import number_token_ids
from compressor_2.clusters.tokens import AnswerTokens
from compressor_2.config import load_config
from compressor_2.data import Example
from compressor_2.deltas import gene_ids
from compressor_2.fitness import Record
from compressor_2.judges import NumericJudge
from compressor_2.model import load_tokenizer
from compressor_2.reflector.base import MutationRequest, VectorRequest
from compressor_2.reflector.evidence import AnswerEvidence, PaddingEvidence, evidence_lines
from compressor_2.reflector.local import LocalProposer
from compressor_2.reflector.openai_reflector import OpenAIProposer
from compressor_2.reflector.registry import padding_evidence
from compressor_2.reflector.validation import ValidatingReflector
from compressor_2.steering.phases import token_classes
from compressor_2.findings.stop_oracle import cut_answer
from tests.conftest import REPO
from tests.fakes.openai_server import FakeOpenAIServer, chat_completion
from tests.test_config import write_config

DEMO_MODEL = REPO / "compressor_2" / "demo" / "model"
CLUSTERS = 5

PADDED = "The Gross Profit was $31,057 million.\nThis is a large amount."  # could stop after " million"
SHORT = "Revenue was $5 million"  # incorrect: neither gold figure, and fewer figures than the gold
EXACT = "$4,374 million"  # correct, nothing to cut
TRAILING = "Revenue was $4,374 million. That is all."  # could stop after " million"
ANSWERS = [("padded", "What was Gross Profit in FY2020?", PADDED, "$31,057 million", True),
           ("short", "What were Revenue and Net Income?", SHORT, "$9,883 million and $32 million", False),
           ("exact", "What was Revenue?", EXACT, "$4,374 million", True),
           ("trailing", "What was Revenue in FY2023?", TRAILING, "$4,374 million", True)]


@functools.cache
def tokens() -> AnswerTokens:
    tokenizer = load_tokenizer(str(DEMO_MODEL))
    texts = [tokenizer.decode([i]) for i in range(len(tokenizer))]
    token_clusters = np.full(len(texts), 4, dtype=np.int64)
    token_clusters[[i for i, t in enumerate(texts) if "\n" in t]] = 2
    token_clusters[[i for i, t in enumerate(texts) if t.strip() in (".", ",")]] = 3
    token_clusters[sorted(number_token_ids(texts))] = 1
    token_clusters[tokenizer.eos_token_id] = 0
    return AnswerTokens(tokenizer, token_clusters, CLUSTERS)


@functools.cache
def classes() -> np.ndarray:
    tokenizer = tokens().tokenizer
    return token_classes([tokenizer.decode([i]) for i in range(len(tokenizer))], [tokenizer.eos_token_id])


def records() -> list[Record]:
    # Each ended: the engine counted its end token.
    return [Record(i, q, a, g, tokens().length(a) + 1, ok, "") for i, q, a, g, ok in ANSWERS]


def evidence_of(phases: int) -> tuple[AnswerEvidence, ...]:
    return PaddingEvidence(tokens(), NumericJudge(), phases, classes)(records())


@pytest.mark.parametrize("phases, padding, stop_phase, end_phase", [
    (1, (("4", 10), ("3", 2), ("2", 1)), 0, 0),
    (2, (("1:4", 10), ("1:3", 2), ("1:2", 1)), 1, 1),
    # The full stop and the line break after the figure are phase 1; the line break starts phase 2.
    (3, (("2:4", 10), ("1:2", 1), ("1:3", 1), ("2:3", 1)), 1, 2),
])
def test_the_evidence_of_a_padded_answer_is_its_cut_point_and_its_padding_by_phase_and_cluster(
        phases, padding, stop_phase, end_phase):
    padded = evidence_of(phases)[0]
    # "The Gross Profit was $31,057 million" is 9 tokens; then "." (where the end token should have
    # come), "\n" and the 11 tokens of "This is a large amount.".
    assert (padded.tokens, padded.stop, padded.stop_token, padded.padded) == (22, 9, "'.'", 13)
    assert (padded.stop_phase, padded.padding, padded.end_phase) == (stop_phase, padding, end_phase)
    kept = {gene: n for gene, n in padded.kept}
    assert sum(kept.values()) == 9 and kept[f"{'0:' if phases > 1 else ''}1"] == 3  # "$", "31", "057": numbers
    assert (padded.missing, padded.needed, padded.cut_short) == ((), (), False)


def test_the_evidence_matches_the_stop_oracle_and_names_an_incorrect_answer_s_missing_gold_figures():
    found = evidence_of(2)
    for record, e in zip(records(), found):
        cut = cut_answer(Example(record.id, record.question, record.gold, ""),
                         Answer(record.answer, record.tokens, record.is_correct, ""), tokens(), NumericJudge())
        assert e.padded == len(cut.removed)
    short, exact = found[1], found[2]
    assert (short.stop, short.padding, short.kept) == (None, (), ())
    assert short.missing == ("$9,883 million", "$32 million") and short.needed == ("1",)  # the digits' cluster
    assert short.cut_short and short.end_phase == 1  # it ended after its one figure
    assert (exact.stop, exact.padding, exact.missing, exact.cut_short) == (None, (), (), False)
    assert sum(n for _, n in exact.kept) == exact.tokens == 5
    assert evidence_lines(short, 2) == ["stop: no prefix is accepted",
                                        "missing gold figures: $9,883 million, $32 million (their digits: cluster(s) 1)"]
    assert evidence_lines(exact, 2) == ["stop: no shorter prefix is accepted"]
    assert evidence_lines(found[0], 2) == [
        "stop: could stop after token 9 of 22; it generated '.' there in phase 1; padding from there: 13 tokens, "
        "phase 1: clusters 4 (10), 3 (2), 2 (1)"]
    assert evidence_lines(found[0], 1, most=1) == [
        "stop: could stop after token 9 of 22; it generated '.' there; padding from there: 13 tokens, cluster 4 (10)"]


def deltas(phases: int) -> dict[str, float]:
    return {gene: 0.0 for gene in gene_ids([str(k) for k in range(CLUSTERS)], phases)}


def mutation(target: str, scratchpad: str = "", phases: int = 2, seed: int = 0,
             correct_only: bool = False) -> tuple[float, str]:
    kept = [i for i, r in enumerate(records()) if r.is_correct or not correct_only]
    request = MutationRequest(3, 1, target, deltas(phases), scratchpad, 0.5, [records()[i] for i in kept],
                              evidence=tuple(evidence_of(phases)[i] for i in kept))
    reply = json.loads(LocalProposer(tokens(), 1.0, seed).mutation(request, [], 1).content)
    return reply["delta"], reply["scratchpad"].splitlines()[-1]


def test_the_local_reflector_lowers_the_padding_s_pairs_and_raises_eos_where_answers_could_have_stopped():
    value, note = mutation("1:4")
    assert value < 0 and "it carries 76.2% of the padding" in note
    value, note = mutation("1:3")
    assert value < 0 and "of the padding" in note
    value, note = mutation("1:0", correct_only=True)
    assert value > 0 and ("2 answer(s) could have stopped in phase 1 (where they generated '.') and no incorrect "
                          "one ended there") in note
    value, note = mutation("1:0")  # and one incorrect answer ended in phase 1 with one figure of the gold's two
    assert value < 0 and "1 incorrect answer(s) ended in phase 1 with fewer figures than the gold" in note
    value, note = mutation("0:4")  # carries what the answers keep, none of the padding: the shares decide
    assert "padding" not in note and "of padded answers" in note


def test_the_local_reflector_never_lowers_the_clusters_of_missing_gold_figures():
    # The lineage's memory says lower the numbers; an incorrect answer lacks figures written with them.
    memory = "g2: moving cluster 0:1 up did not pay off (fitness 0.6 -> 0.5)."
    value, note = mutation("0:1", memory)
    assert value > 0 and "its tokens write gold figures that 1 incorrect answer(s) lack" in note
    for phase in range(2):
        assert mutation(f"{phase}:1")[0] > 0
    # Another cluster the same memory would lower goes down.
    assert mutation("0:3", memory.replace("0:1", "0:3"))[0] < 0


def vector(phases: int = 2, seed: int = 0) -> dict[str, float]:
    request = VectorRequest(3, 1, deltas(phases), "", 0.5, records(), evidence=evidence_of(phases))
    return json.loads(LocalProposer(tokens(), 1.0, seed).vector_mutation(request, [], 1).content)["deltas"]


def test_a_full_vector_move_takes_eos_in_every_phase_and_the_padding_s_strongest_pairs():
    moved = {gene: value for gene, value in vector().items() if value != 0.0}
    assert set(moved) == {"0:0", "1:0", "1:4", "1:3"}
    assert moved["1:0"] < 0 and moved["1:4"] < 0 and moved["1:3"] < 0  # an answer ended short in phase 1


def test_the_proposals_are_a_pure_function_of_the_request_and_the_seed():
    assert mutation("1:4") == mutation("1:4") and vector() == vector()
    assert mutation("1:4", seed=1) != mutation("1:4") and vector(seed=1) != vector()
    assert mutation("1:4", seed=1)[0] < 0  # the seed moves the jitter, not the direction
    one_phase = MutationRequest(3, 1, "4", deltas(1), "", 0.5, records(), evidence=evidence_of(1))
    replies = {LocalProposer(tokens(), 1.0, 0).mutation(one_phase, [], 1).content for _ in range(2)}
    assert len(replies) == 1 and json.loads(replies.pop())["delta"] < 0


def test_the_openai_prompt_carries_the_evidence(tmp_path):
    bodies: list[dict] = []

    def answer(body: dict) -> tuple[int, object]:
        bodies.append(body)
        return 200, chat_completion('{"delta": -1.0, "scratchpad": "lowered the padding"}')

    evidence = PaddingEvidence(tokens(), NumericJudge(), 2, classes)
    with FakeOpenAIServer(answer) as server:
        reflector = ValidatingReflector(OpenAIProposer("m", server.base_url, "sk-test", timeout=10, max_retries=0),
                                        {"0": {"description": "EOS"}}, 600, evidence=evidence)
        result = reflector.mutate(MutationRequest(3, 1, "1:4", deltas(2), "", 0.5, records()))
        reflector.close()
    assert result.delta == -1.0
    user = bodies[0]["messages"][1]["content"]
    assert "Where each response could have stopped" in user and "that phase's EOS delta decides" in user
    padded = user.index("### Example 1 of 4: id padded")
    assert user.index("stop: could stop after token 9 of 22; it generated '.' there in phase 1; padding from "
                      "there: 13 tokens, phase 1: clusters 4 (10), 3 (2), 2 (1)\nanswer:\n") > padded
    assert "correct: no\ntokens: 8\nexplanation: \nstop: no prefix is accepted\nmissing gold figures: $9,883 " \
           "million, $32 million (their digits: cluster(s) 1)\nanswer:\nRevenue was $5 million" in user


def test_without_the_option_or_with_a_judge_that_is_not_numeric_there_is_no_evidence(tmp_path):
    def config(text: str):
        return load_config(write_config(tmp_path, text))

    assert padding_evidence(config(""), tokens()) is None
    assert isinstance(padding_evidence(config("CONFIG_REFLECTOR_PADDING_EVIDENCE=y\n"), tokens()), PaddingEvidence)
    for judge in ("CONFIG_JUDGE_LLM=y\n", "CONFIG_JUDGE_HYBRID=y\n"):
        assert padding_evidence(config(f"CONFIG_REFLECTOR_PADDING_EVIDENCE=y\n{judge}"), tokens()) is None


@pytest.mark.slow
def test_a_two_phase_run_reads_the_evidence_and_one_without_it_does_not(tmp_path, shared, tiny_model_dir):
    from compressor_2.commands.evolve import evolve
    from tests.test_evolution_support import config_for

    for option in ("y", "n"):
        (tmp_path / option).mkdir()
        config = config_for(tmp_path / option, shared, tiny_model_dir, DELTA_PHASES="2",
                            REFLECTOR_PADDING_EVIDENCE=option)
        evolve(config)
        prompts = [p.read_text() for p in (config.output_dir / "reflector_prompts").glob("*mutation*")]
        assert prompts and (option == "y") == all("Where each response could have stopped" in p for p in prompts)
        assert (option == "y") == all("\nstop: " in p for p in prompts)

"""Fitness arithmetic and the genome cache, with the real engine on the tiny model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from compressor_2.archive import RunArchive
from compressor_2.data.example import Example
from compressor_2.engines.base import Generation, GenerationRequest, Progress
from compressor_2.engines.transformers.engine import TransformersEngine
from compressor_2.fitness import Evaluator, example_score, fitness_value, shortness_score
from compressor_2.judges.base import JudgeItem, Verdict

ZEROS = (0.0, 0.0)
STOP_AT_ONCE = (40.0, 0.0)  # cluster 0 is EOS: every answer is the EOS alone


class CountingEngine(TransformersEngine):
    """The real engine, counting what it is asked to generate."""

    calls: int = 0
    requests: int = 0

    def generate(self, requests: Sequence[GenerationRequest],
                 progress: Progress | None = None) -> list[Generation]:
        self.calls += 1
        self.requests += len(requests)
        return super().generate(requests, progress)


class EmptyAnswerJudge:
    """Correct when the answer is empty: gives a correctness the test can predict."""

    def judge(self, items: Sequence[JudgeItem]) -> list[Verdict]:
        return [Verdict(item.answer == "", "empty" if item.answer == "" else "not empty") for item in items]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> CountingEngine:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    clusters = np.ones(len(tokenizer), dtype=np.int64)
    clusters[tokenizer.eos_token_id] = 0
    return CountingEngine(str(tiny_model_dir), clusters, 2, batch_size=8, max_new_tokens=12, device="cpu")


EXAMPLES = [
    Example(id=f"q{i}", question=f"question {i}", gold="", prompt=prompt)
    for i, prompt in enumerate(["Revenue was", "Total assets", "No"])
]


def make_evaluator(engine: CountingEngine) -> Evaluator:
    return Evaluator(engine, EmptyAnswerJudge(), EXAMPLES, lambda_shortness=0.25,
                     lambda_correctness=0.75, shortness_scale=10.0)


def test_shortness_and_fitness_formulas():
    assert shortness_score(0.0, 100.0) == 1.0
    assert shortness_score(100.0, 100.0) == 0.5
    assert shortness_score(300.0, 100.0) == pytest.approx(0.25)
    assert fitness_value(0.5, 0.8, 0.25, 0.75) == pytest.approx(0.125 + 0.6)


def test_evaluation_scores_its_records(engine):
    evaluator = make_evaluator(engine)
    stopped, unsteered = evaluator.evaluate([STOP_AT_ONCE, ZEROS])

    assert [(r.id, r.tokens, r.answer, r.is_correct) for r in stopped.records] == [
        ("q0", 1, "", True), ("q1", 1, "", True), ("q2", 1, "", True)]
    assert (stopped.mean_tokens, stopped.correctness) == (1.0, 1.0)
    assert stopped.shortness == pytest.approx(1 / 1.1)
    assert stopped.fitness == pytest.approx(0.25 / 1.1 + 0.75)
    # The random model never stops unsteered: every answer runs to max_new_tokens.
    assert [r.tokens for r in unsteered.records] == [12, 12, 12]
    assert unsteered.correctness == 0.0
    assert unsteered.fitness == pytest.approx(0.25 / (1 + 12 / 10))


def test_identical_genome_costs_no_generation(engine):
    evaluator = make_evaluator(engine)
    calls, sent = engine.calls, engine.requests
    progress: list[int] = []
    first = evaluator.evaluate([ZEROS, STOP_AT_ONCE, ZEROS], progress=progress.append)

    assert (engine.calls - calls, engine.requests - sent) == (1, 2 * len(EXAMPLES))
    assert sum(progress) == 2 * len(EXAMPLES)
    assert (evaluator.stats.evaluations_run, evaluator.stats.cache_hits) == (2, 1)
    assert first[0] == first[2]

    again = evaluator.evaluate([STOP_AT_ONCE, [0, 0]])  # ints equal to the cached floats
    assert engine.calls - calls == 1, "a cached genome must not reach the engine"
    assert (again[0], again[1]) == (first[1], first[0])
    assert (evaluator.stats.evaluations_run, evaluator.stats.cache_hits) == (2, 3)

    evaluator.evaluate([(1e-9, 0.0)])  # the key is the exact vector: any change is a new genome
    assert (engine.calls - calls, evaluator.stats.evaluations_run) == (2, 3)


def test_per_example_scores_follow_the_readme_formula(engine):
    stopped, unsteered = make_evaluator(engine).evaluate([STOP_AT_ONCE, ZEROS])
    assert stopped.scores == pytest.approx([0.25 / (1 + 1 / 10) + 0.75] * 3)
    assert unsteered.scores == pytest.approx([0.25 / (1 + 12 / 10)] * 3)
    assert example_score(10, False, 0.5, 0.5, 10.0) == pytest.approx(0.25)


def test_a_subset_of_examples_generates_only_what_is_missing(engine, tmp_path):
    """Minibatches: the second call reuses the pair answered by the first and generates the
    rest; aggregates are over the examples asked for."""
    archive = RunArchive.open(tmp_path / "run.sqlite")
    evaluator = Evaluator(engine, EmptyAnswerJudge(), EXAMPLES, 0.25, 0.75, 10.0, store=archive, context="c")
    sent = engine.requests
    [part] = evaluator.evaluate([STOP_AT_ONCE], examples=EXAMPLES[:1])
    assert [r.id for r in part.records] == ["q0"] and engine.requests - sent == 1
    [whole] = evaluator.evaluate([STOP_AT_ONCE])
    assert engine.requests - sent == 3 and [r.id for r in whole.records] == ["q0", "q1", "q2"]
    assert evaluator.stats.metric_calls == archive.metric_calls() == 3
    assert archive.cache_hits() == 1

    # A new evaluator on the same archive (a resumed run) generates nothing...
    again = Evaluator(engine, EmptyAnswerJudge(), EXAMPLES, 0.25, 0.75, 10.0, store=archive, context="c")
    assert again.evaluate([STOP_AT_ONCE]) == [whole] and engine.requests - sent == 3
    # ...unless something that changes an answer changed (another context),
    other = Evaluator(engine, EmptyAnswerJudge(), EXAMPLES, 0.25, 0.75, 10.0, store=archive, context="d")
    other.evaluate([STOP_AT_ONCE], examples=EXAMPLES[:1])
    assert engine.requests - sent == 4
    # or the decoding samples: then nothing is served from the cache, everything is stored.
    sampling = Evaluator(engine, EmptyAnswerJudge(), EXAMPLES, 0.25, 0.75, 10.0, store=archive, context="c",
                         reuse=False)
    sampling.evaluate([STOP_AT_ONCE, STOP_AT_ONCE], examples=EXAMPLES[:1])
    assert engine.requests - sent == 5 and archive.metric_calls() == 5
    archive.close()


def test_an_example_whose_prompt_changed_is_a_new_example(engine):
    evaluator = make_evaluator(engine)
    evaluator.evaluate([STOP_AT_ONCE])
    sent = engine.requests
    changed = [Example(id="q0", question="question 0", gold="", prompt="Total liabilities")]
    evaluator.evaluate([STOP_AT_ONCE], examples=changed)
    assert engine.requests - sent == 1

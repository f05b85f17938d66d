"""Fitness arithmetic and the genome cache, with the real engine on the tiny model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from compressor_2.data.example import Example
from compressor_2.engines.base import Generation, GenerationRequest, Progress
from compressor_2.engines.transformers_engine import TransformersEngine
from compressor_2.fitness import Evaluator, fitness_value, shortness_score
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
    assert first[0] is first[2]

    again = evaluator.evaluate([STOP_AT_ONCE, [0, 0]])  # ints equal to the cached floats
    assert engine.calls - calls == 1, "a cached genome must not reach the engine"
    assert (again[0], again[1]) == (first[1], first[0])
    assert (evaluator.stats.evaluations_run, evaluator.stats.cache_hits) == (2, 3)

    evaluator.evaluate([(1e-9, 0.0)])  # the key is the exact vector: any change is a new genome
    assert (engine.calls - calls, evaluator.stats.evaluations_run) == (2, 3)

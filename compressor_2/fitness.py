"""Fitness of delta vectors on the fixed training set (seed 000 §1), cached by genome.

Greedy decoding is deterministic, so an identical genome costs no generation: the
cache maps the exact delta tuple to its evaluation for the whole run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from compressor_2.data.example import Example
from compressor_2.engines.base import Engine, GenerationRequest, Progress
from compressor_2.judges.base import Judge, JudgeItem

Genome = tuple[float, ...]


@dataclass(frozen=True)
class Record:
    """One training example answered under one genome: what the reflector reads."""

    id: str
    question: str
    answer: str
    gold: str
    tokens: int
    is_correct: bool
    reasoning: str


@dataclass(frozen=True)
class Evaluation:
    deltas: Genome
    records: tuple[Record, ...]
    mean_tokens: float
    correctness: float
    shortness: float
    fitness: float


def shortness_score(mean_tokens: float, scale: float) -> float:
    return 1.0 / (1.0 + mean_tokens / scale)


def fitness_value(shortness: float, correctness: float, lambda_shortness: float,
                  lambda_correctness: float) -> float:
    return lambda_shortness * shortness + lambda_correctness * correctness


@dataclass
class CacheStats:
    evaluations_run: int = 0  # genomes actually generated and judged
    cache_hits: int = 0  # genomes served from the cache (or duplicated within a call)


class Evaluator:
    """Evaluates many genomes in one engine call; remembers every genome it has seen."""

    def __init__(self, engine: Engine, judge: Judge, examples: Sequence[Example],
                 lambda_shortness: float, lambda_correctness: float, shortness_scale: float) -> None:
        if not examples:
            raise ValueError("the training set is empty")
        self.engine = engine
        self.judge = judge
        self.examples = tuple(examples)
        self.lambda_shortness = lambda_shortness
        self.lambda_correctness = lambda_correctness
        self.shortness_scale = shortness_scale
        self.stats = CacheStats()
        self._cache: dict[Genome, Evaluation] = {}

    def evaluate(self, genomes: Sequence[Sequence[float]],
                 progress: Progress | None = None) -> list[Evaluation]:
        keys = [tuple(float(x) for x in g) for g in genomes]
        fresh = list(dict.fromkeys(k for k in keys if k not in self._cache))
        self.stats.cache_hits += len(keys) - len(fresh)
        self.stats.evaluations_run += len(fresh)
        if fresh:
            requests = [GenerationRequest(ex.prompt, key) for key in fresh for ex in self.examples]
            generations = self.engine.generate(requests, progress)
            verdicts = self.judge.judge([
                JudgeItem(ex.question, gen.text, ex.gold)
                for gen, ex in zip(generations, self.examples * len(fresh))
            ])
            n = len(self.examples)
            for i, key in enumerate(fresh):
                records = tuple(
                    Record(ex.id, ex.question, gen.text, ex.gold, gen.completion_tokens,
                           verdict.is_correct, verdict.reasoning)
                    for ex, gen, verdict in zip(self.examples, generations[i * n:(i + 1) * n],
                                                verdicts[i * n:(i + 1) * n])
                )
                self._cache[key] = self._score(key, records)
        return [self._cache[k] for k in keys]

    def _score(self, key: Genome, records: tuple[Record, ...]) -> Evaluation:
        mean_tokens = sum(r.tokens for r in records) / len(records)
        correctness = sum(r.is_correct for r in records) / len(records)
        shortness = shortness_score(mean_tokens, self.shortness_scale)
        return Evaluation(key, records, mean_tokens, correctness, shortness,
                          fitness_value(shortness, correctness, self.lambda_shortness,
                                        self.lambda_correctness))

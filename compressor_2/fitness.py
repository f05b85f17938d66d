"""Fitness of delta vectors on training examples, per example and cached.

The evaluator takes any set of genomes and any subset of the pool's examples and makes
one engine call for every (genome, example) pair it has not answered before. Answers
are cached in a store keyed by (genome, example, context): the answer context digests
everything else that changes an answer (model, engine, clusters, decoding, judge), the
example key includes a digest of its prompt and gold answer. With the run archive as
the store, the cache outlives the process: a resumed run regenerates nothing.

Quantities:
- aggregate fitness: `lambda_s * shortness(mean tokens) +
  lambda_c * correctness`, with `shortness(t) = 1 / (1 + t / scale)`;
- per-example score, for strategies that compare candidates example by example:
  `s_i = lambda_s / (1 + tokens_i / scale) + lambda_c * correct_i`.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from compressor_2.archive import Answer, genome_key
from compressor_2.common import answers_bar
from compressor_2.data import Example
from compressor_2.engines import Engine, GenerationRequest, Progress
from compressor_2.judges import Judge, JudgeItem

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
    records: tuple[Record, ...]  # in the order of the examples asked for
    mean_tokens: float
    correctness: float
    shortness: float
    fitness: float
    scores: tuple[float, ...]  # per-example scores s_i, aligned with `records`


def shortness_score(mean_tokens: float, scale: float) -> float:
    return 1.0 / (1.0 + mean_tokens / scale)


def fitness_value(shortness: float, correctness: float, lambda_shortness: float,
                  lambda_correctness: float) -> float:
    return lambda_shortness * shortness + lambda_correctness * correctness


def example_score(tokens: int, is_correct: bool, lambda_shortness: float, lambda_correctness: float,
                  scale: float) -> float:
    return lambda_shortness / (1.0 + tokens / scale) + lambda_correctness * float(is_correct)


def example_key(example: Example) -> str:
    """The example's id and a digest of what it asks: a changed prompt template, evidence
    cap or gold answer is another example to the cache."""
    digest = hashlib.sha256(f"{example.prompt}\0{example.gold}".encode()).hexdigest()[:16]
    return f"{example.id}#{digest}"


def answer_context(settings: Mapping[str, object]) -> str:
    """The answer context: a short digest of the settings that change an answer or its verdict."""
    return hashlib.sha256(json.dumps(dict(settings), sort_keys=True).encode()).hexdigest()[:24]


class AnswerStore(Protocol):
    def cached(self, genomes: Sequence[str], examples: Sequence[str], context: str) -> dict[tuple[str, str], Answer]:
        ...

    def store(self, answers: Mapping[tuple[str, str], Answer], context: str, cache_hits: int) -> None:
        ...


class MemoryStore:
    """An `AnswerStore` for one process (the `evaluate` command, unit tests)."""

    def __init__(self) -> None:
        self._answers: dict[tuple[str, str, str], Answer] = {}

    def cached(self, genomes: Sequence[str], examples: Sequence[str], context: str) -> dict[tuple[str, str], Answer]:
        return {(g, e): self._answers[g, e, context] for g in genomes for e in examples
                if (g, e, context) in self._answers}

    def store(self, answers: Mapping[tuple[str, str], Answer], context: str, cache_hits: int) -> None:
        del cache_hits
        self._answers.update({(g, e, context): a for (g, e), a in answers.items()})


@dataclass
class CacheStats:
    evaluations_run: int = 0  # genomes with at least one fresh answer
    cache_hits: int = 0  # genomes served entirely from the cache (or repeated within a call)
    metric_calls: int = 0  # fresh (genome, example) answers generated and judged


class Evaluator:
    """Evaluates many genomes on any examples of the pool in one engine call.

    `reuse=False` (sampling, temperature > 0) stores every answer but serves none from
    the cache: a sample is not the genome's answer, so each evaluation draws anew.
    `gate`, when set, is called before a call's fresh answers are made (none when the cache
    serves them all), and may refuse them by raising (the run's budget, inside a step).
    """

    def __init__(self, engine: Engine, judge: Judge, examples: Sequence[Example],
                 lambda_shortness: float, lambda_correctness: float, shortness_scale: float,
                 store: AnswerStore | None = None, context: str = "", reuse: bool = True) -> None:
        if not examples:
            raise ValueError("the training set is empty")
        self.engine = engine
        self.judge = judge
        self.examples = tuple(examples)
        self.lambda_shortness = lambda_shortness
        self.lambda_correctness = lambda_correctness
        self.shortness_scale = shortness_scale
        self.store: AnswerStore = store if store is not None else MemoryStore()
        self.context = context
        self.reuse = reuse
        self.stats = CacheStats()
        self.gate: Callable[[], None] | None = None

    def evaluate(self, genomes: Sequence[Sequence[float]], progress: Progress | None = None,
                 examples: Sequence[Example] | None = None) -> list[Evaluation]:
        """One `Evaluation` per genome over `examples` (default: the whole pool)."""
        chosen = self.examples if examples is None else tuple(examples)
        genomes_t = [tuple(float(x) for x in g) for g in genomes]
        keys = [genome_key(g) for g in genomes_t]
        ex_keys = [example_key(ex) for ex in chosen]
        context = self.context if self.reuse else f"{self.context}:sample:{uuid.uuid4().hex}"
        answers = self.store.cached(keys, ex_keys, context) if self.reuse else {}
        unique = dict.fromkeys(zip(keys, genomes_t))
        missing = [(key, genome, ex, ex_key) for key, genome in unique
                   for ex, ex_key in zip(chosen, ex_keys) if (key, ex_key) not in answers]
        if missing and self.gate is not None:
            self.gate()
        fresh_genomes = len({key for key, *_ in missing})
        self.stats.evaluations_run += fresh_genomes
        self.stats.cache_hits += len(keys) - fresh_genomes
        self.stats.metric_calls += len(missing)
        fresh: dict[tuple[str, str], Answer] = {}
        if missing:
            generations = self.engine.generate(
                [GenerationRequest(ex.prompt, genome) for _, genome, ex, _ in missing], progress)
            verdicts = self.judge.judge([JudgeItem(ex.question, gen.text, ex.gold)
                                         for (_, _, ex, _), gen in zip(missing, generations)])
            fresh = {(key, ex_key): Answer(gen.text, gen.completion_tokens, verdict.is_correct, verdict.reasoning)
                     for (key, _, _, ex_key), gen, verdict in zip(missing, generations, verdicts)}
        hits = len(keys) * len(chosen) - len(missing)
        if fresh or hits:
            self.store.store(fresh, context, hits)
        answers.update(fresh)
        return [self._score(genome, [(ex, answers[key, ex_key]) for ex, ex_key in zip(chosen, ex_keys)])
                for key, genome in zip(keys, genomes_t)]

    def _score(self, genome: Genome, answered: Sequence[tuple[Example, Answer]]) -> Evaluation:
        records = tuple(Record(ex.id, ex.question, a.answer, ex.gold, a.tokens, a.is_correct, a.reasoning)
                        for ex, a in answered)
        mean_tokens = sum(r.tokens for r in records) / len(records)
        correctness = sum(r.is_correct for r in records) / len(records)
        shortness = shortness_score(mean_tokens, self.shortness_scale)
        scores = tuple(example_score(r.tokens, r.is_correct, self.lambda_shortness, self.lambda_correctness,
                                     self.shortness_scale) for r in records)
        return Evaluation(genome, records, mean_tokens, correctness, shortness,
                          fitness_value(shortness, correctness, self.lambda_shortness, self.lambda_correctness),
                          scores)


def evaluate_with_bar(evaluator: Evaluator, genomes: Sequence[Sequence[float]], examples: Sequence[Example],
                      label: str) -> list[Evaluation]:
    """All `genomes` on `examples` in one engine call, with a bar."""
    with answers_bar(len(genomes) * len(examples), label) as bar:
        return evaluator.evaluate(genomes, bar.update, examples)

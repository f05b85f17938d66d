"""The archive's rows as typed values, and the checks of a stored row: a hand edit would
otherwise surface as a bare JSONDecodeError or TypeError far from the row. A check raises
`RowError` with what is wrong, in words; the part that read the row names its table and
row."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from compressor_2.common import as_count, as_float, shown

MAX_ID = 2**63 - 1  # SQLite's largest integer
SEED_STEP = -1  # the strategies' seed candidates stand in the step before the first


class RowError(ValueError):
    """A stored row the run cannot use; the message says what is wrong with it."""


@dataclass(frozen=True)
class Candidate:
    """One genome in the archive. `id` is None until `RunArchive.add` gives it one."""

    deltas: Mapping[str, float]  # canonical cluster order
    scratchpad: str
    operator: str  # initial, crossover, clone, mutation, ...
    parents: tuple[int, ...]
    strategy: str
    generation: int
    status: str = "evaluated"  # or "rejected": proposed, assessed, not kept
    note: str = ""  # why it was rejected
    fitness: float | None = None  # on the whole training pool
    mean_tokens: float | None = None
    correctness: float | None = None
    id: int | None = None
    created: float = 0.0


@dataclass(frozen=True)
class Answer:
    """One stored answer: what the engine said and what the judge made of it."""

    answer: str
    tokens: int
    is_correct: bool
    reasoning: str


@dataclass(frozen=True)
class CheckResult:
    """A genome measured by a check on one split ("training" or "heldout")."""

    split: str
    genome: str
    examples: int
    mean_tokens: float
    correctness: float
    fitness: float


@dataclass(frozen=True)
class CallRecord:
    kind: str  # mutation, merge, ...
    candidate: int | None  # the candidate the call is about, when it exists yet
    parents: tuple[int, ...]
    generation: int
    attempt: int
    prompt_tokens: int
    completion_tokens: int
    latency: float
    outcome: str  # "accepted", or "rejected: " and why (stored in the reflector_calls column `verdict`)


class ReplyTally(NamedTuple):
    """The reflector's replies since a step boundary, as the driver's warnings read them."""

    newest: int  # the newest reflector call's id (the boundary the next tally starts after)
    calls: int  # the calls after the boundary
    accepted: int  # how many of them were accepted
    last_rejection: str  # why the last rejected one was rejected, or ""


@dataclass(frozen=True)
class Spot:
    """Where a candidate stands in a strategy's structure: the GA's population member
    (`pop`), offspring (`pre`) and mutated offspring (`mut`) of a generation, or a kept
    candidate of the other strategies (`cand`), in the column of the step that made it."""

    generation: int
    stage: str
    index: int


@dataclass(frozen=True)
class Placement:
    """A candidate at a spot; its label is the evolution tree's node id."""

    candidate: int
    spot: Spot

    @property
    def label(self) -> str:
        g, stage, i = self.spot.generation, self.spot.stage, self.spot.index
        if stage == "pop":
            return f"g{g}_pop{i}"
        if stage in ("pre", "mut"):
            return f"g{g}_child{i}_{stage}"
        return f"c{self.candidate}"


def genome_key(deltas: Sequence[float]) -> str:
    """The exact genome as text: repr round-trips every float."""
    return ",".join(repr(float(x)) for x in deltas)


# -- the checks of a stored row --------------------------------------------------------------

def candidate(row: Sequence[Any], parents: tuple[int, ...]) -> Candidate:
    """A candidates row (its columns in `CANDIDATE_COLUMNS`' order) as a `Candidate`. What
    the archive wrote passes one quick test (`show` reads 100,000 rows); only a row that
    fails it is examined field by field."""
    cid, deltas, scratchpad, operator, strategy, generation, status, note, fitness, mean_tokens, correctness, \
        created = row
    decoded = _deltas(deltas)
    as_written = (decoded is not None and type(generation) is int and generation >= SEED_STEP
                  and type(created) is float and -math.inf < created < math.inf
                  and type(scratchpad) is str and type(operator) is str and type(strategy) is str
                  and type(status) is str and type(note) is str
                  and (fitness is None or (type(fitness) is float and 0 <= fitness <= 1))
                  and (mean_tokens is None or (type(mean_tokens) is float and 0 <= mean_tokens < math.inf))
                  and (correctness is None or (type(correctness) is float and 0 <= correctness <= 1)))
    if not as_written and (problem := _candidate_problem(row, decoded)):
        raise RowError(problem)
    return Candidate(decoded or {}, scratchpad, operator, parents, strategy, generation, status, note,
                     None if fitness is None else float(fitness),
                     None if mean_tokens is None else float(mean_tokens),
                     None if correctness is None else float(correctness), cid, float(created))


def _candidate_problem(row: Sequence[Any], decoded: dict[str, float] | None) -> str | None:
    """What is wrong with a candidates row, in words; None when it only differs from what
    the archive writes in ways that are still right (an integer for a float)."""
    _, deltas, scratchpad, operator, strategy, generation, status, note, fitness, mean_tokens, correctness, \
        created = row
    texts = {"scratchpad": scratchpad, "operator": operator, "strategy": strategy, "status": status, "note": note}
    scores = {"fitness": (fitness, 1.0), "mean_tokens": (mean_tokens, math.inf), "correctness": (correctness, 1.0)}
    if decoded is None:
        return f"deltas is {shown(deltas)}, not a JSON object of cluster ids and finite numbers"
    if type(generation) is not int or generation < SEED_STEP:
        return f"generation is {shown(generation)}, not an integer >= {SEED_STEP}"
    if as_float(created) is None:
        return f"created is {shown(created)}, not a finite number"
    for name, text in texts.items():
        if not isinstance(text, str):
            return f"{name} is {shown(text)}, not text"
    for name, (value, high) in scores.items():
        if not is_stored_score(value, high):
            return f"{name} is {shown(value)}, not a number {'in [0, 1]' if high == 1 else '>= 0'}"
    return None


def is_stored_score(value: Any, high: float) -> bool:
    """A stored score is absent (not assessed yet) or a number in [0, high]."""
    number = as_float(value)
    return value is None or (number is not None and 0 <= number <= high)


def _deltas(text: Any) -> dict[str, float] | None:
    """A candidate's stored deltas, or None when they are not a JSON object of finite numbers
    (NaN and Infinity, which Python's parser takes, included)."""
    try:
        decoded = json.loads(text, parse_constant=_not_a_number) if isinstance(text, str) else None
    except ValueError:
        return None
    if not isinstance(decoded, dict):
        return None
    if set(map(type, decoded.values())) <= {float}:
        return decoded  # what the archive writes: finite floats (the parser refused the rest)
    values = {key: as_float(value) for key, value in decoded.items()}
    return None if None in values.values() else values  # type: ignore[return-value]


def _not_a_number(constant: str) -> float:
    raise ValueError(f"{constant} is not a finite number")


def answer(text: Any, tokens: Any, correct: Any, reasoning: Any) -> Answer:
    """An answers row as an `Answer`: a score computed from a broken one would be wrong
    without a sign."""
    if type(tokens) is not int or tokens < 0:
        raise RowError(f"tokens is {shown(tokens)}, not an integer >= 0")
    if type(correct) is not int or correct not in (0, 1):
        raise RowError(f"is_correct is {shown(correct)}, not 0 or 1")
    if not isinstance(text, str) or not isinstance(reasoning, str):
        raise RowError(f"{'answer' if not isinstance(text, str) else 'reasoning'} is not text")
    return Answer(text, tokens, bool(correct), reasoning)


def check_result(row: Sequence[Any]) -> CheckResult:
    """A check_results row (split, genome, examples, mean tokens, correctness, fitness)."""
    _, _, examples, mean_tokens, correctness, fitness = row
    valid = {"examples": as_count(examples, MAX_ID + 1) is not None,
             "mean_tokens": mean_tokens is not None and is_stored_score(mean_tokens, math.inf),
             "correctness": correctness is not None and is_stored_score(correctness, 1.0),
             "fitness": fitness is not None and is_stored_score(fitness, 1.0)}
    if bad := next((name for name, ok in valid.items() if not ok), None):
        raise RowError(f"{bad} is not a number in its range")
    return CheckResult(*row)


def ids(column: str, text: Any) -> tuple[int, ...]:
    """A stored JSON list of integers (candidate ids, positions)."""
    try:
        decoded = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        decoded = None
    if not isinstance(decoded, list) or any(as_count(item, MAX_ID + 1) is None for item in decoded):
        raise RowError(f"{column} is {shown(text)}, not a JSON list of integers >= 0")
    return tuple(decoded)


def event(kind: Any, detail: Any, created: Any) -> tuple[str, dict[str, Any], float]:
    """An events row as (kind, detail, when)."""
    try:
        decoded = json.loads(detail) if isinstance(detail, str) else None
    except ValueError:
        decoded = None
    when = as_float(created)
    if not isinstance(kind, str):
        raise RowError(f"kind is {shown(kind)}, not text")
    if not isinstance(decoded, dict):
        raise RowError(f"detail is {shown(detail)}, not a JSON object")
    if when is None:
        raise RowError(f"created is {shown(created)}, not a finite number")
    return kind, decoded, when

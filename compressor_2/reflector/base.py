"""The reflector interface: requests in, validated results out, with token usage.

A reflector is two layers. A *proposer* (local heuristics or an OpenAI-compatible LLM)
answers one attempt with raw JSON text; `ValidatingReflector` (validation.py) turns
attempts into results under the seed's rules, the same for every proposer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from compressor_2.fitness import Record

if TYPE_CHECKING:
    from compressor_2.reflector.evidence import Evidence

Message = dict[str, str]  # {"role": ..., "content": ...}


@dataclass(frozen=True)
class Usage:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.calls + other.calls, self.prompt_tokens + other.prompt_tokens,
                     self.completion_tokens + other.completion_tokens)


@dataclass(frozen=True)
class MutationRequest:
    """Mutation: change the delta of `target` (fixed by the driver's round robin)."""

    generation: int
    child: int  # offspring index j, for the prompt log
    target: str
    deltas: Mapping[str, float]  # canonical order
    scratchpad: str
    fitness: float
    records: Sequence[Record]  # the individual's own training answers (or an issue batch)
    candidate: int | None = None  # the archive id of the individual mutated
    feedback: tuple[str, ...] = ()  # the archive strategy's feedback memory, shown after the answers
    evidence: Evidence | None = None  # the stop oracle's, per record (CONFIG_REFLECTOR_PADDING_EVIDENCE)


@dataclass(frozen=True)
class MergeRequest:
    """Merge: one scratchpad for the child of parents A and B."""

    generation: int
    child: int
    parents: tuple[int, int]  # population indices of A and B, for the prompt log
    scratchpad_a: str
    fitness_a: float
    scratchpad_b: str
    fitness_b: float
    candidates: tuple[int, ...] = ()  # the archive ids of A and B


@dataclass(frozen=True)
class VectorRequest:
    """Full-vector mutation: propose every delta at once; the scratchpad is the evolving summary."""

    generation: int
    child: int
    deltas: Mapping[str, float]  # canonical order
    scratchpad: str
    fitness: float
    records: Sequence[Record]
    candidate: int | None = None
    feedback: tuple[str, ...] = ()
    evidence: Evidence | None = None


@dataclass(frozen=True)
class PopulationMember:
    """One population member as the selection call sees it (its trial result)."""

    candidate_id: int
    fitness: float
    mean_tokens: float
    correctness: float
    deltas: Mapping[str, float]
    scratchpad: str
    operator: str  # what made it: initial, crossover, clone, mutation, ...
    parents: tuple[int, ...]
    parent_fitness: float | None  # its fittest parent's, when it has one


@dataclass(frozen=True)
class SelectionRequest:
    """LLM selection: which members carry forward; `members` in population order."""

    generation: int
    members: tuple[PopulationMember, ...]


@dataclass(frozen=True)
class Selected:
    candidate_id: int
    reasoning: str
    category: str  # performance | diversity | potential


@dataclass(frozen=True)
class MutationResult:
    delta: float | None  # None: both attempts were invalid, the mutation is skipped
    scratchpad: str  # the request's own scratchpad when skipped
    attempts: int
    usage: Usage
    rejected: tuple[str, ...] = ()  # why each rejected attempt was rejected

    @property
    def changed(self) -> bool:
        return self.delta is not None


@dataclass(frozen=True)
class VectorResult:
    deltas: dict[str, float] | None  # None: both attempts were invalid, the mutation is skipped
    summary: str  # what the driver appends to the scratchpad ("" when skipped)
    attempts: int
    usage: Usage
    rejected: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return self.deltas is not None


@dataclass(frozen=True)
class SelectionResult:
    selections: tuple[Selected, ...]  # empty: both attempts were invalid, the caller falls back
    summary: str
    attempts: int
    usage: Usage
    rejected: tuple[str, ...] = ()


@dataclass(frozen=True)
class MergeResult:
    scratchpad: str
    valid: bool  # False: both attempts were invalid and parent A's scratchpad is used
    attempts: int
    usage: Usage
    rejected: tuple[str, ...] = ()


@dataclass(frozen=True)
class Outstanding:
    """A call waiting for its proposer, for the progress line."""

    what: str  # "mutation (generation 2, child 1)"
    since: float  # time.monotonic() when it was sent


class Abandoned(Exception):
    """The reflector was closed (the run is stopping): a call in flight, or one asked for
    after, is given up; its step replays on resume."""


@dataclass(frozen=True)
class Reply:
    """One raw attempt: JSON text, or None with `error` when the call itself failed. The
    proposer gives `error` as it may be stored: masked and capped (`limits.note`)."""

    content: str | None
    usage: Usage
    error: str | None = None


class Proposer(Protocol):
    """Answers one attempt. `messages` are the seed's prompts after substitution: an LLM
    sends them verbatim, the local proposer reads the request instead."""

    name: str

    def mutation(self, request: MutationRequest, messages: list[Message], attempt: int) -> Reply: ...

    def merge(self, request: MergeRequest, messages: list[Message], attempt: int) -> Reply: ...

    def vector_mutation(self, request: VectorRequest, messages: list[Message], attempt: int) -> Reply: ...

    def selection(self, request: SelectionRequest, messages: list[Message], attempt: int) -> Reply: ...

    def close(self) -> None:
        """Gives up the calls in flight at once (they raise `Abandoned`), and every later one."""
        ...


class Reflector(Protocol):
    usage: Usage  # the run's total so far
    where: str  # what the progress lines call it: its URL, or the proposer's name
    timeout: float | None  # the bound of one call (CONFIG_REFLECTOR_TIMEOUT), if it has one

    def mutate(self, request: MutationRequest) -> MutationResult: ...

    def mutate_vector(self, request: VectorRequest) -> VectorResult: ...

    def merge(self, request: MergeRequest) -> MergeResult: ...

    def select(self, request: SelectionRequest) -> SelectionResult: ...

    def outstanding(self) -> list[Outstanding]: ...

    def close(self) -> None:
        """Abandons the calls in flight (they raise `Abandoned`) and every later one."""
        ...

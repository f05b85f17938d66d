"""The validation rules, in one place for every proposer:

- mutation: a non-numeric delta, or one equal to the current value, is
  invalid -> retry once -> still invalid: skip the mutation;
- full-vector mutation (with the mutation's rule): other ids than the clusters',
  a non-finite value, or a vector equal to the current one is invalid -> retry once ->
  skip the mutation;
- merge: invalid JSON or no string `scratchpad` -> retry once -> parent A's scratchpad;
- selection: not JSON, fewer than 2 or more than 5 selections, an unknown or
  repeated candidate id, or a category outside the three is invalid -> retry once ->
  the caller falls back to its automatic selection.

Every delta a reply proposes is clamped to the one bound on every delta (`deltas.DELTA_BOUND`)
before it is compared with the current value: every strategy's reflector proposals pass here.

A call that failed outright (API error after the client's own retries, or no reply within
CONFIG_REFLECTOR_TIMEOUT) is an invalid attempt like any other. Every text a reply brings
is masked and capped (`limits.py`) before anything stores it.

Once `close` is called (the run is stopping), a call in flight is abandoned and every
later one raises `Abandoned` at once: the step they belong to replays on resume.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from compressor_2.archive import CallRecord
from compressor_2.common import ReflectorUnavailable, as_float, loads_or_reason, shown
from compressor_2.deltas import clamp
from compressor_2.fitness import Record
from compressor_2.reflector import limits
from compressor_2.reflector.base import (
    Abandoned,
    MergeRequest,
    MergeResult,
    MutationRequest,
    MutationResult,
    Outstanding,
    Proposer,
    Reply,
    Selected,
    SelectionRequest,
    SelectionResult,
    Usage,
    VectorRequest,
    VectorResult,
)
from compressor_2.reflector.prompt_log import PromptLog
from compressor_2.reflector.prompts import (
    CATEGORIES,
    merge_messages,
    mutation_messages,
    selection_messages,
    vector_messages,
)

if TYPE_CHECKING:
    from compressor_2.reflector.evidence import Evidence

T = TypeVar("T")

ATTEMPTS = 2  # the first call and one retry
MIN_SELECTIONS, MAX_SELECTIONS = 2, 5
UNCHANGED_TOLERANCE = 1e-9


class InvalidOutput(ValueError):
    """The reason an attempt is rejected; it goes to the prompt log."""


def _json_object(reply: Reply) -> dict[str, Any]:
    if reply.content is None:
        raise InvalidOutput(f"the call failed: {reply.error}")
    data, unreadable = loads_or_reason(reply.content)
    if unreadable is not None:
        raise InvalidOutput(f"the reply is {unreadable}")
    if not isinstance(data, dict):
        raise InvalidOutput("the reply is not a JSON object")
    return data


def _shown(value: Any) -> str:
    """A refused value inside a rejection's reason: masked, then cut."""
    return shown(value, limits.REFUSED_VALUE_CHARS)


def _scratchpad(data: Mapping[str, Any]) -> str:
    scratchpad = data.get("scratchpad")
    if not isinstance(scratchpad, str):
        raise InvalidOutput(f"scratchpad is {_shown(scratchpad)}, not a string")
    return limits.scratchpad(scratchpad)


def _text(data: Mapping[str, Any], key: str, where: str = "") -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise InvalidOutput(f"{where}{key} is {_shown(value)}, not a string")
    return limits.kept_text(value)


def parse_mutation(reply: Reply, current: float) -> tuple[float, str]:
    """(new delta, new scratchpad), or InvalidOutput."""
    data = _json_object(reply)
    found = data.get("delta")
    delta = as_float(found)
    if delta is None:
        raise InvalidOutput(f"delta is {_shown(found)}, not a finite number")
    delta = clamp(delta)
    if abs(delta - current) <= UNCHANGED_TOLERANCE:
        raise InvalidOutput(f"delta {delta!r} equals the current value {current!r}")
    return delta, _scratchpad(data)


def parse_merge(reply: Reply) -> str:
    return _scratchpad(_json_object(reply))


def parse_vector(reply: Reply, current: Mapping[str, float]) -> tuple[dict[str, float], str]:
    """(new deltas in canonical order, summary), or InvalidOutput."""
    data = _json_object(reply)
    deltas = data.get("deltas")
    if not isinstance(deltas, dict):
        raise InvalidOutput(f"deltas is {_shown(deltas)}, not an object")
    missing, extra = set(current) - set(deltas), set(deltas) - set(current)
    if missing or extra:
        raise InvalidOutput(f"deltas has the wrong cluster ids (missing: {_shown(sorted(missing, key=str))}, "
                            f"unknown: {_shown(sorted(extra, key=str))})")
    new = {}
    for cid in current:
        value = as_float(deltas[cid])
        if value is None:
            raise InvalidOutput(f"delta of cluster {cid} is {_shown(deltas[cid])}, not a finite number")
        new[cid] = clamp(value)
    if all(abs(new[cid] - current[cid]) <= UNCHANGED_TOLERANCE for cid in current):
        raise InvalidOutput("the deltas equal the current ones")
    return new, _text(data, "summary")


def parse_selection(reply: Reply, known: set[int]) -> tuple[tuple[Selected, ...], str]:
    data = _json_object(reply)
    selections = data.get("selections")
    if not isinstance(selections, list):
        raise InvalidOutput(f"selections is {_shown(selections)}, not a list")
    if not MIN_SELECTIONS <= len(selections) <= MAX_SELECTIONS:
        raise InvalidOutput(f"{len(selections)} selections, not {MIN_SELECTIONS} to {MAX_SELECTIONS}")
    chosen: list[Selected] = []
    for item in selections:
        if not isinstance(item, dict):
            raise InvalidOutput(f"selection {_shown(item)} is not an object")
        cid, category = item.get("candidate_id"), item.get("category")
        if isinstance(cid, bool) or not isinstance(cid, int) or cid not in known:
            raise InvalidOutput(f"candidate_id {_shown(cid)} is not in this population")
        if any(s.candidate_id == cid for s in chosen):
            raise InvalidOutput(f"candidate {cid} is selected twice")
        if category not in CATEGORIES:
            raise InvalidOutput(f"category {_shown(category)} is not one of {', '.join(CATEGORIES)}")
        chosen.append(Selected(cid, _text(item, "reasoning", f"candidate {cid}'s "), category))
    return tuple(chosen), _text(data, "summary")


@dataclass(frozen=True)
class Call:
    """What an attempt is about, for the prompt log and the archive."""

    kind: str
    generation: int
    child: int | None
    indices: Mapping[str, object]
    candidate: int | None = None
    related: tuple[int, ...] = ()


class ValidatingReflector:
    """Implements `Reflector` over any `Proposer`; logs every attempt when given a log and
    keeps the run's token usage in `usage` (calls may come from several threads). Every
    attempt also goes to `recorder` (the run archive's reflector-call table) when given.
    `outstanding()` says which calls are waiting for the proposer, and since when."""

    def __init__(self, proposer: Proposer, descriptions: Mapping[str, Any], answer_max_chars: int,
                 log: PromptLog | None = None, recorder: Callable[[CallRecord], None] | None = None,
                 max_consecutive_failures: int = 0,
                 evidence: Callable[[Sequence[Record]], Evidence] | None = None) -> None:
        self.proposer = proposer
        self.evidence = evidence  # the stop oracle's evidence of a request's answers, when the run reads it
        self.max_consecutive_failures = max_consecutive_failures  # 0: never stop
        self._failures = 0
        self._stopped: str | None = None  # why the run stops, once too many calls failed
        self.descriptions = descriptions
        self.answer_max_chars = answer_max_chars
        self.log = log
        self.recorder = recorder
        self.usage = Usage()
        self.where = getattr(proposer, "base_url", proposer.name)  # the URL, or the proposer's name
        self.timeout: float | None = getattr(proposer, "timeout", None)  # a call's bound, if it has one
        self._lock = threading.Lock()
        self._closed = False
        self._waiting: dict[int, Outstanding] = {}
        self._tickets = itertools.count()

    def mutate(self, request: MutationRequest) -> MutationResult:
        if self.evidence is not None and request.evidence is None:
            request = replace(request, evidence=self.evidence(request.records))
        messages = mutation_messages(request, self.descriptions, self.answer_max_chars)
        call = Call("mutation", request.generation, request.child, {"target_cluster": request.target},
                    request.candidate)
        parsed, attempts, usage, rejected = self._attempts(
            call, messages, lambda n: self.proposer.mutation(request, messages, n),
            lambda reply: parse_mutation(reply, request.deltas[request.target]))
        if parsed is None:
            return MutationResult(None, request.scratchpad, attempts, usage, rejected)
        return MutationResult(parsed[0], parsed[1], attempts, usage, rejected)

    def mutate_vector(self, request: VectorRequest) -> VectorResult:
        if self.evidence is not None and request.evidence is None:
            request = replace(request, evidence=self.evidence(request.records))
        messages = vector_messages(request, self.descriptions, self.answer_max_chars)
        call = Call("vector_mutation", request.generation, request.child, {}, request.candidate)
        parsed, attempts, usage, rejected = self._attempts(
            call, messages, lambda n: self.proposer.vector_mutation(request, messages, n),
            lambda reply: parse_vector(reply, request.deltas))
        if parsed is None:
            return VectorResult(None, "", attempts, usage, rejected)
        return VectorResult(parsed[0], parsed[1], attempts, usage, rejected)

    def merge(self, request: MergeRequest) -> MergeResult:
        messages = merge_messages(request)
        call = Call("merge", request.generation, request.child,
                    {"parent_a": request.parents[0], "parent_b": request.parents[1]}, None, request.candidates)
        parsed, attempts, usage, rejected = self._attempts(
            call, messages, lambda n: self.proposer.merge(request, messages, n), parse_merge)
        if parsed is None:
            return MergeResult(request.scratchpad_a, False, attempts, usage, rejected)
        return MergeResult(parsed, True, attempts, usage, rejected)

    def select(self, request: SelectionRequest) -> SelectionResult:
        messages = selection_messages(request)
        known = {m.candidate_id for m in request.members}
        parsed, attempts, usage, rejected = self._attempts(
            Call("selection", request.generation, None, {}), messages,
            lambda n: self.proposer.selection(request, messages, n), lambda reply: parse_selection(reply, known))
        if parsed is None:
            return SelectionResult((), "", attempts, usage, rejected)
        return SelectionResult(parsed[0], parsed[1], attempts, usage, rejected)

    def outstanding(self) -> list[Outstanding]:
        with self._lock:
            return list(self._waiting.values())

    def close(self) -> None:
        """Abandons the calls in flight (they raise `Abandoned` in their threads) and every
        later one."""
        self._closed = True
        self.proposer.close()

    def _attempts(self, call: Call, messages: list[dict[str, str]], ask: Callable[[int], Reply],
                  parse: Callable[[Reply], T]) -> tuple[T | None, int, Usage, tuple[str, ...]]:
        """The first attempt and one retry: (parsed reply or None, attempts, usage, why rejected)."""
        usage, rejected = Usage(), []
        for attempt in range(1, ATTEMPTS + 1):
            if self._closed:
                raise Abandoned("the run is stopping")
            if self._stopped is not None:  # calls queued behind the one that gave up make none
                raise ReflectorUnavailable(self._stopped)
            started = time.perf_counter()
            try:
                reply = self._waited(call, attempt, ask)
            except Abandoned:
                if self._stopped is not None:  # abandoned because the run stops on too many failures
                    raise ReflectorUnavailable(self._stopped) from None
                raise
            latency = time.perf_counter() - started
            usage += reply.usage
            with self._lock:
                self.usage += reply.usage
                self._failures = self._failures + 1 if reply.content is None else 0
                dead = 0 < self.max_consecutive_failures <= self._failures
            try:
                parsed = parse(reply)
            except InvalidOutput as exc:
                rejected.append(str(exc))
                self._finish(call, attempt, messages, reply, f"rejected: {exc}", latency)
                if dead:
                    self._stopped = (f"the reflector at {self.where} failed {self._failures} calls in a row "
                                     f"(CONFIG_REFLECTOR_MAX_CONSECUTIVE_FAILURES); the last error: "
                                     f"{reply.error or ''}")  # as the proposer gave it: masked, capped
                    self.proposer.close()  # the calls beside this one are abandoned: the run stops
                    raise ReflectorUnavailable(self._stopped)
                continue
            self._finish(call, attempt, messages, reply, "accepted", latency)
            return parsed, attempt, usage, tuple(rejected)
        return None, ATTEMPTS, usage, tuple(rejected)

    def _waited(self, call: Call, attempt: int, ask: Callable[[int], Reply]) -> Reply:
        """`ask(attempt)`, listed in `outstanding()` while it waits."""
        child = f", child {call.child}" if call.child is not None else ""
        with self._lock:
            ticket = next(self._tickets)
            self._waiting[ticket] = Outstanding(f"{call.kind} (generation {call.generation}{child})", time.monotonic())
        try:
            return ask(attempt)
        finally:
            with self._lock:
                del self._waiting[ticket]

    def _finish(self, call: Call, attempt: int, messages: list[dict[str, str]], reply: Reply, outcome: str,
                latency: float) -> None:
        """One attempt done: to the prompt log and the archive."""
        outcome = limits.note(outcome)
        if self.log is not None:
            self.log.write(call.generation, call.kind, call.child, attempt, call.indices, messages, reply, outcome)
        if self.recorder is not None:
            self.recorder(CallRecord(call.kind, call.candidate, call.related, call.generation, attempt,
                                     reply.usage.prompt_tokens, reply.usage.completion_tokens, round(latency, 6),
                                     outcome))

"""Seed 000 §8's validation rules, in one place for every proposer:

- mutation: a non-numeric delta, or one equal to the current value, is invalid ->
  retry once -> still invalid: skip the mutation;
- merge: invalid JSON or no string `scratchpad` -> retry once -> parent A's scratchpad.

A call that failed outright (API error after the client's own retries) is an invalid
attempt like any other.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from compressor_2.archive.database import CallRecord
from compressor_2.reflector.base import (
    MergeRequest, MergeResult, MutationRequest, MutationResult, Proposer, Reply, Usage,
)
from compressor_2.reflector.prompt_log import PromptLog
from compressor_2.reflector.prompts import merge_messages, mutation_messages

ATTEMPTS = 2  # the first call and one retry
UNCHANGED_TOLERANCE = 1e-9


class InvalidOutput(ValueError):
    """The reason an attempt is rejected; it goes to the prompt log."""


def _json_object(reply: Reply) -> dict[str, Any]:
    if reply.content is None:
        raise InvalidOutput(f"the call failed: {reply.error}")
    try:
        data = json.loads(reply.content)
    except json.JSONDecodeError:
        raise InvalidOutput("the reply is not JSON") from None
    if not isinstance(data, dict):
        raise InvalidOutput("the reply is not a JSON object")
    return data


def _scratchpad(data: Mapping[str, Any]) -> str:
    scratchpad = data.get("scratchpad")
    if not isinstance(scratchpad, str):
        raise InvalidOutput(f"scratchpad is {scratchpad!r}, not a string")
    return scratchpad


def parse_mutation(reply: Reply, current: float) -> tuple[float, str]:
    """(new delta, new scratchpad), or InvalidOutput."""
    data = _json_object(reply)
    delta = data.get("delta")
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not math.isfinite(delta):
        raise InvalidOutput(f"delta is {delta!r}, not a finite number")
    if abs(delta - current) <= UNCHANGED_TOLERANCE:
        raise InvalidOutput(f"delta {delta!r} equals the current value {current!r}")
    return float(delta), _scratchpad(data)


def parse_merge(reply: Reply) -> str:
    return _scratchpad(_json_object(reply))


class ValidatingReflector:
    """Implements `Reflector` over any `Proposer`; logs every attempt when given a log and
    keeps the run's token usage in `usage` (calls may come from several threads). Every
    attempt also goes to `recorder` (the run archive's reflector-call table) when given."""

    def __init__(self, proposer: Proposer, descriptions: Mapping[str, Any], answer_max_chars: int,
                 log: PromptLog | None = None, recorder: Callable[[CallRecord], None] | None = None) -> None:
        self.proposer = proposer
        self.descriptions = descriptions
        self.answer_max_chars = answer_max_chars
        self.log = log
        self.recorder = recorder
        self.usage = Usage()
        self._lock = threading.Lock()

    def mutate(self, request: MutationRequest) -> MutationResult:
        messages = mutation_messages(request, self.descriptions, self.answer_max_chars)
        current = request.deltas[request.target]
        usage, rejected = Usage(), []
        for attempt in range(1, ATTEMPTS + 1):
            started = time.perf_counter()
            reply = self.proposer.mutation(request, messages, attempt)
            latency = time.perf_counter() - started
            usage += reply.usage
            self._count(reply.usage)
            try:
                delta, scratchpad = parse_mutation(reply, current)
            except InvalidOutput as exc:
                rejected.append(str(exc))
                self._log(request.generation, "mutation", request.child, attempt,
                          {"target_cluster": request.target}, messages, reply, f"rejected: {exc}")
                self._record("mutation", request.candidate, (), request.generation, attempt, reply, latency,
                             f"rejected: {exc}")
                continue
            self._log(request.generation, "mutation", request.child, attempt,
                      {"target_cluster": request.target}, messages, reply, "accepted")
            self._record("mutation", request.candidate, (), request.generation, attempt, reply, latency,
                         "accepted")
            return MutationResult(delta, scratchpad, attempt, usage, tuple(rejected))
        return MutationResult(None, request.scratchpad, ATTEMPTS, usage, tuple(rejected))

    def merge(self, request: MergeRequest) -> MergeResult:
        messages = merge_messages(request)
        indices = {"parent_a": request.parents[0], "parent_b": request.parents[1]}
        usage, rejected = Usage(), []
        for attempt in range(1, ATTEMPTS + 1):
            started = time.perf_counter()
            reply = self.proposer.merge(request, messages, attempt)
            latency = time.perf_counter() - started
            usage += reply.usage
            self._count(reply.usage)
            try:
                scratchpad = parse_merge(reply)
            except InvalidOutput as exc:
                rejected.append(str(exc))
                self._log(request.generation, "merge", request.child, attempt, indices, messages,
                          reply, f"rejected: {exc}")
                self._record("merge", None, request.candidates, request.generation, attempt, reply, latency,
                             f"rejected: {exc}")
                continue
            self._log(request.generation, "merge", request.child, attempt, indices, messages,
                      reply, "accepted")
            self._record("merge", None, request.candidates, request.generation, attempt, reply, latency,
                         "accepted")
            return MergeResult(scratchpad, True, attempt, usage, tuple(rejected))
        return MergeResult(request.scratchpad_a, False, ATTEMPTS, usage, tuple(rejected))

    def close(self) -> None:
        self.proposer.close()

    def _count(self, usage: Usage) -> None:
        with self._lock:
            self.usage += usage

    def _record(self, kind: str, candidate: int | None, parents: tuple[int, ...], generation: int,
                attempt: int, reply: Reply, latency: float, verdict: str) -> None:
        if self.recorder is not None:
            self.recorder(CallRecord(kind, candidate, parents, generation, attempt, reply.usage.prompt_tokens,
                                     reply.usage.completion_tokens, round(latency, 6), verdict))

    def _log(self, generation: int, call: str, child: int, attempt: int, indices: Mapping[str, object],
             messages: list[dict[str, str]], reply: Reply, verdict: str) -> None:
        if self.log is not None:
            self.log.write(generation, call, child, attempt, indices, messages, reply, verdict)

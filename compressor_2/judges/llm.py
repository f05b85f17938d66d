"""The LLM judge: an OpenAI-compatible Chat Completions model grades each answer.

Temperature 0 and a strict JSON schema {is_correct, reasoning}. The API key is read
from the environment variable the config names and is never logged, stored or put
in an exception message; a reply's reasoning is stored as a reflector's text is, every
key in it masked and its length capped (`api_key.masked`). Items are judged
concurrently by a small thread pool.

Bounded like the reflector: one call, the client's retries (rate limits, 5xx,
connection errors, with backoff) and their waits included, gets CONFIG_JUDGE_TIMEOUT
seconds; a call that fails (no verdict in time, an error after the retries, a reply that
is no chat completion or not the verdict schema) is made again, and after
CONFIG_JUDGE_MAX_CONSECUTIVE_FAILURES failed calls in a row the run stops with a
`RunError` naming the last failure. So a judge that accepts and never answers stops the
run after at most MAX_CONSECUTIVE_FAILURES x TIMEOUT seconds of waiting (one call at a
time; fewer rounds when calls run concurrently). A rejected key (401/403) or an unknown
model or URL (404) cannot improve by retrying and stops the run at once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai

from compressor_2.common import (
    BadReply,
    RunError,
    api_key_from_env,
    check_reachable,
    loads_or_reason,
    masked,
    read_completion,
    remember,
    shown,
)
from compressor_2.config import Config
from compressor_2.judges.base import JudgeItem, Verdict

REASONING_MAX_CHARS = 2_000  # of a verdict's reasoning as stored, as of any other text of a reply
CLIENT_RETRIES = 2  # the SDK's own, with its backoff, inside the call's timeout

VERDICT_SCHEMA: dict[str, Any] = {
    "name": "verdict",
    "strict": True,
    "schema": {
        "type": "object",
        "properties": {
            "is_correct": {"type": "boolean"},
            "reasoning": {"type": "string"},
        },
        "required": ["is_correct", "reasoning"],
        "additionalProperties": False,
    },
}

_SYSTEM = """You grade answers to questions about company financial filings against a reference answer.
The answer is correct when it reaches the same result as the reference: the same figures \
(at the reference's precision, or within {tolerance:.1%} relative; units may be written \
differently, e.g. $1,577 million for 1577 in USD millions, 1.9% for 0.019), the same yes/no, \
and the same key facts. Extra explanation does not make an answer wrong; a refusal, a hedge \
without a result, or a result that contradicts the reference does.
Reply with JSON: is_correct, and reasoning (one or two sentences saying what was compared)."""


class JudgeCallFailed(Exception):
    """One judge call gave no verdict; it counts towards the consecutive-failure limit."""


class LLMJudge:
    def __init__(self, model: str, base_url: str, api_key: str, tolerance: float = 0.01,
                 concurrency: int = 8, timeout: float = 120.0, max_retries: int = CLIENT_RETRIES,
                 max_failures: int = 5) -> None:
        self.model = model
        self.base_url = base_url
        self.tolerance = tolerance
        self.concurrency = concurrency
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_failures = max_failures
        remember(api_key)
        self._key = api_key
        self._lock = threading.Lock()
        self._failures = 0  # calls in a row without a verdict, over every thread
        self._gave_up: str | None = None

    @classmethod
    def from_config(cls, config: Config) -> LLMJudge:
        key = api_key_from_env(config.judge_api_key_env, "the judge", "JUDGE_API_KEY_ENV")
        check_reachable(config.judge_base_url, "the judge API", "JUDGE_BASE_URL")
        return cls(config.judge_model, config.judge_base_url, key, config.correctness_tolerance,
                   timeout=config.judge_timeout, max_failures=config.judge_max_consecutive_failures)

    def judge(self, items: Sequence[JudgeItem]) -> list[Verdict]:
        if len(items) <= 1:
            return [self._judge_one(item) for item in items]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(items))) as pool:
            return list(pool.map(self._judge_one, items))

    def _judge_one(self, item: JudgeItem) -> Verdict:
        messages = [
            {"role": "system", "content": _SYSTEM.format(tolerance=self.tolerance)},
            {"role": "user", "content": f"Question: {item.question}\n\n"
                                        f"Reference answer: {item.gold}\n\n"
                                        f"Answer to grade: {item.answer}"},
        ]
        while True:
            with self._lock:
                if self._gave_up is not None:
                    raise RunError(self._gave_up)
            try:
                verdict = asyncio.run(self._call(messages))
            except JudgeCallFailed as failure:
                self._failed(str(failure))
                continue
            with self._lock:
                self._failures = 0
            return verdict

    def _failed(self, failure: str) -> None:
        """Counts a failed call; past the limit, stops every thread's next call too."""
        with self._lock:
            self._failures += 1
            if self._failures >= self.max_failures and self._gave_up is None:
                self._gave_up = (f"the judge at {self.base_url} failed {self._failures} calls in a row "
                                 f"(CONFIG_JUDGE_MAX_CONSECUTIVE_FAILURES={self.max_failures}); the last: {failure}")

    async def _call(self, messages: list[dict[str, str]]) -> Verdict:
        """One call in a client of its own on this thread's own event loop, so that the
        timeout bounds it whole, the client's retries and their waits included."""
        async with openai.AsyncOpenAI(api_key=self._key, base_url=self.base_url, timeout=self.timeout,
                                      max_retries=self.max_retries) as client:
            failure, fatal = None, False
            try:
                raw = await asyncio.wait_for(client.chat.completions.with_raw_response.create(
                    model=self.model, temperature=0, messages=messages,  # type: ignore[arg-type]
                    response_format={"type": "json_schema", "json_schema": VERDICT_SCHEMA},
                ), self.timeout)
            except asyncio.TimeoutError:
                failure = f"no verdict within {self.timeout:g} s (CONFIG_JUDGE_TIMEOUT)"
            except openai.APIError as exc:  # the SDK has already retried what can be retried
                failure, fatal = self._describe(exc)
        if failure is not None:
            # Raised outside the except block: the SDK's exception (whose text may hold
            # the key echoed by a server) is neither the cause nor the context.
            raise RunError(failure) if fatal else JudgeCallFailed(failure)
        try:
            content = read_completion(raw.status_code, raw.headers.get("content-type", ""), raw.content).content
        except BadReply as exc:
            raise JudgeCallFailed(f"the judge model {self.model} at {self.base_url}: {exc}") from None
        verdict = _parse_verdict(content)
        if isinstance(verdict, str):
            raise JudgeCallFailed(f"the judge model {self.model} at {self.base_url} did not return the verdict "
                                  f"schema{verdict}: {shown(content, 200)}")
        return verdict

    def _describe(self, exc: openai.APIError) -> tuple[str, bool]:
        """The failure in one masked line, and whether no retry can mend it."""
        if isinstance(exc, (openai.AuthenticationError, openai.PermissionDeniedError)):
            return f"the judge API at {self.base_url} rejected the key (HTTP {exc.status_code})", True
        if isinstance(exc, openai.NotFoundError):
            return (f"the judge API at {self.base_url} answered 404 for model {self.model!r}: check "
                    "CONFIG_JUDGE_BASE_URL and CONFIG_JUDGE_MODEL"), True
        if isinstance(exc, openai.APIStatusError):
            detail = f"HTTP {exc.status_code}: {exc.message}"
        else:  # connection errors and timeouts
            detail = f"{type(exc).__name__}: {exc}"
        return masked(f"judge call to {self.base_url} failed after retries: {detail}", REASONING_MAX_CHARS), False


def _parse_verdict(content: str | None) -> Verdict | str:
    """The verdict in `content`, or what to add to "did not return the verdict schema":
    nothing, unless the content is JSON Python cannot read (too long a number, too deep)."""
    data, unreadable = loads_or_reason(content or "")
    if unreadable is not None:
        return "" if unreadable == "not JSON" else f" (its content is {unreadable})"
    if not isinstance(data, dict):
        return ""
    is_correct, reasoning = data.get("is_correct"), data.get("reasoning")
    if not isinstance(is_correct, bool) or not isinstance(reasoning, str):
        return ""
    # Stored with the answer: a server may echo the Authorization header into it.
    return Verdict(is_correct, masked(reasoning, REASONING_MAX_CHARS))

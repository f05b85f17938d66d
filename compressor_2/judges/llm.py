"""The LLM judge: an OpenAI-compatible Chat Completions model grades each answer.

Temperature 0 and a strict JSON schema {is_correct, reasoning}. The API key is read
from the environment variable the config names and is never logged, stored or put
in an exception message. The SDK retries rate limits, 5xx and connection errors
with exponential backoff; items are judged concurrently by a small thread pool.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai

from compressor_2.api_key import api_key_from_env, remember, scrub
from compressor_2.endpoint import check_reachable
from compressor_2.config import Config
from compressor_2.errors import RunError
from compressor_2.judges.base import JudgeItem, Verdict

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


class LLMJudge:
    def __init__(self, model: str, base_url: str, api_key: str, tolerance: float = 0.01,
                 concurrency: int = 8, timeout: float = 120.0, max_retries: int = 5) -> None:
        self.model = model
        self.base_url = base_url
        self.tolerance = tolerance
        self.concurrency = concurrency
        remember(api_key)
        self._client = openai.OpenAI(api_key=api_key, base_url=base_url, timeout=timeout,
                                     max_retries=max_retries)

    @classmethod
    def from_config(cls, config: Config) -> LLMJudge:
        key = api_key_from_env(config.judge_api_key_env, "the judge", "JUDGE_API_KEY_ENV")
        check_reachable(config.judge_base_url, "the judge API", "JUDGE_BASE_URL")
        return cls(config.judge_model, config.judge_base_url, key, config.correctness_tolerance)

    def judge(self, items: Sequence[JudgeItem]) -> list[Verdict]:
        if len(items) <= 1:
            return [self._judge_one(item) for item in items]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(items))) as pool:
            return list(pool.map(self._judge_one, items))

    def _judge_one(self, item: JudgeItem) -> Verdict:
        failure = None
        try:
            response = self._client.chat.completions.create(
                model=self.model,
                temperature=0,
                messages=[
                    {"role": "system", "content": _SYSTEM.format(tolerance=self.tolerance)},
                    {"role": "user", "content": f"Question: {item.question}\n\n"
                                                f"Reference answer: {item.gold}\n\n"
                                                f"Answer to grade: {item.answer}"},
                ],
                response_format={"type": "json_schema", "json_schema": VERDICT_SCHEMA},
            )
        except openai.APIError as exc:  # the SDK has already retried what can be retried
            failure = self._describe(exc)
        if failure is not None:
            # Raised outside the except block: the SDK's exception (whose text may hold
            # the key echoed by a server) is neither the cause nor the context.
            raise RunError(failure)
        content = response.choices[0].message.content if response.choices else None
        verdict = _parse_verdict(content)
        if verdict is None:
            raise RunError(self._scrub(
                f"the judge model {self.model} at {self.base_url} did not return the verdict "
                f"schema: {str(content)[:200]!r}"))
        return verdict

    def _describe(self, exc: openai.APIError) -> str:
        if isinstance(exc, openai.AuthenticationError):
            return f"the judge API at {self.base_url} rejected the key (HTTP 401)"
        if isinstance(exc, openai.APIStatusError):
            detail = f"HTTP {exc.status_code}: {exc.message}"
        else:  # connection errors and timeouts
            detail = f"{type(exc).__name__}: {exc}"
        return self._scrub(f"judge call to {self.base_url} failed after retries: {detail}")

    def _scrub(self, message: str) -> str:
        return scrub(message)


def _parse_verdict(content: str | None) -> Verdict | None:
    try:
        data = json.loads(content or "")
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    is_correct, reasoning = data.get("is_correct"), data.get("reasoning")
    if not isinstance(is_correct, bool) or not isinstance(reasoning, str):
        return None
    return Verdict(is_correct, reasoning)

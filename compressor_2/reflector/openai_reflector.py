"""The LLM proposer: any OpenAI-compatible Chat Completions server, strict structured outputs.

The client retries connection errors, timeouts, 408/409/429 and 5xx with exponential
backoff (CONFIG_REFLECTOR_MAX_RETRIES); a call that still fails becomes a failed `Reply`,
which validation treats as an invalid output. A rejected key (401/403) or an unknown
model or URL (404) cannot improve by retrying and would silently turn the run into one
without mutations, so those stop the run with a `RunError`.
"""

from __future__ import annotations

from typing import Any

import openai

from compressor_2.api_key import api_key_from_env, remember, scrub
from compressor_2.endpoint import check_reachable
from compressor_2.config import Config
from compressor_2.errors import RunError
from compressor_2.reflector.base import (
    MergeRequest, Message, MutationRequest, Reply, SelectionRequest, Usage, VectorRequest,
)
from compressor_2.reflector.prompts import MERGE_SCHEMA, MUTATION_SCHEMA, SELECTION_SCHEMA, vector_schema


def response_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "strict": True, "schema": schema}}


class OpenAIProposer:
    name = "openai"

    def __init__(self, model: str, base_url: str, key: str, timeout: float, max_retries: int) -> None:
        self.model = model
        self.base_url = base_url
        remember(key)
        self._client = openai.OpenAI(api_key=key, base_url=base_url, timeout=timeout,
                                     max_retries=max_retries)

    @classmethod
    def from_config(cls, config: Config) -> OpenAIProposer:
        key = api_key_from_env(config.reflector_api_key_env, "the reflector", "REFLECTOR_API_KEY_ENV")
        check_reachable(config.reflector_base_url, "the reflector API", "REFLECTOR_BASE_URL")
        return cls(config.reflector_model, config.reflector_base_url, key, config.reflector_timeout,
                   config.reflector_max_retries)

    def mutation(self, request: MutationRequest, messages: list[Message], attempt: int) -> Reply:
        del request, attempt  # a retry resends the same messages
        return self._call(messages, response_format("reflector_mutation", MUTATION_SCHEMA))

    def merge(self, request: MergeRequest, messages: list[Message], attempt: int) -> Reply:
        del request, attempt
        return self._call(messages, response_format("reflector_merge", MERGE_SCHEMA))

    def vector_mutation(self, request: VectorRequest, messages: list[Message], attempt: int) -> Reply:
        del attempt
        return self._call(messages, response_format("reflector_vector", vector_schema(list(request.deltas))))

    def selection(self, request: SelectionRequest, messages: list[Message], attempt: int) -> Reply:
        del request, attempt
        return self._call(messages, response_format("reflector_selection", SELECTION_SCHEMA))

    def close(self) -> None:
        self._client.close()

    def _call(self, messages: list[Message], fmt: dict[str, Any]) -> Reply:
        try:
            response = self._client.chat.completions.create(
                model=self.model, messages=messages, response_format=fmt,  # type: ignore[arg-type]
            )
        except (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError) as exc:
            raise RunError(
                f"the reflector API at {self.base_url} answered {exc.status_code} for model "
                f"{self.model!r}: check CONFIG_REFLECTOR_BASE_URL, CONFIG_REFLECTOR_MODEL and the key"
            ) from None
        except openai.APIError as exc:
            return Reply(None, Usage(calls=1), error=scrub(f"{type(exc).__name__}: {exc.message}"))
        usage = response.usage
        content = response.choices[0].message.content if response.choices else None
        return Reply(
            content,
            Usage(1, usage.prompt_tokens if usage else 0, usage.completion_tokens if usage else 0),
            error=None if content is not None else "the reply has no message content",
        )

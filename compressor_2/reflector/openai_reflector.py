"""The LLM proposer: any OpenAI-compatible Chat Completions server, strict structured outputs.

One call is bounded by CONFIG_REFLECTOR_TIMEOUT seconds, the client's own retries
(CONFIG_REFLECTOR_MAX_RETRIES: connection errors, 408/409/429 and 5xx, with exponential
backoff) and their waits included: a server that accepts and never answers costs one
timeout per call, never timeout x attempts. A call that still fails becomes a failed
`Reply`, which validation treats as an invalid output (and counts towards
CONFIG_REFLECTOR_MAX_CONSECUTIVE_FAILURES); so does a reply that is no chat completion (an
HTML page with status 200, a token count that is no integer in [0, 2^53): chat_reply.py),
whose error says what came back. A rejected key (401/403) or an unknown model
or URL (404) cannot improve by retrying and would silently turn the run into one without
mutations, so those stop the run with a `RunError`.

The calls run on the client's asyncio event loop, in a thread of this proposer's own, so
that `close` can cancel the calls in flight at once (Ctrl+C, a failed run): their threads
get `Abandoned` and end, and no socket read holds the exit up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

import openai

from compressor_2.common import BadReply, RunError, api_key_from_env, check_reachable, read_completion, remember
from compressor_2.config import Config
from compressor_2.reflector import limits
from compressor_2.reflector.base import (
    Abandoned,
    MergeRequest,
    Message,
    MutationRequest,
    Reply,
    SelectionRequest,
    Usage,
    VectorRequest,
)
from compressor_2.reflector.prompts import MERGE_SCHEMA, MUTATION_SCHEMA, SELECTION_SCHEMA, vector_schema

# The selection request is sent at a lower temperature, for a more deterministic choice;
# the other calls leave both settings to the server.
SELECTION_SETTINGS: dict[str, Any] = {"temperature": 0.5, "max_tokens": 2048}
CLOSE_SECONDS = 5.0  # closing the client's connections, once every call is cancelled


def response_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "strict": True, "schema": schema}}


class OpenAIProposer:
    name = "openai"

    def __init__(self, model: str, base_url: str, key: str, timeout: float, max_retries: int) -> None:
        self.model = model
        self.base_url = base_url
        self.timeout = timeout
        remember(key)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="reflector-http", daemon=True)
        self._thread.start()
        self._client = openai.AsyncOpenAI(api_key=key, base_url=base_url, timeout=timeout, max_retries=max_retries)
        self._lock = threading.Lock()
        self._calls: set[concurrent.futures.Future[Reply]] = set()
        self._closed = False

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
        return self._call(messages, response_format("reflector_selection", SELECTION_SCHEMA), SELECTION_SETTINGS)

    def close(self) -> None:
        """Cancels the calls in flight (their callers get `Abandoned` at once), closes the
        client's connections and ends the loop's thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            calls = list(self._calls)
        for call in calls:
            call.cancel()  # their callers return at once, whatever the loop is doing
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(CLOSE_SECONDS)
        except (concurrent.futures.TimeoutError, OSError):
            pass  # the connections go with the loop
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    async def _shutdown(self) -> None:
        """Lets the cancelled requests unwind (a task the loop never finished is reported
        when it is collected), then closes the client's connections."""
        requests = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in requests:
            task.cancel()
        await asyncio.gather(*requests, return_exceptions=True)
        await self._client.close()

    def _call(self, messages: list[Message], fmt: dict[str, Any], settings: dict[str, Any] | None = None) -> Reply:
        with self._lock:
            if self._closed:
                raise Abandoned("the run is stopping")
            call = asyncio.run_coroutine_threadsafe(self._request(messages, fmt, settings or {}), self._loop)
            self._calls.add(call)
        try:
            return call.result()
        except concurrent.futures.CancelledError:
            raise Abandoned("the run is stopping") from None
        finally:
            with self._lock:
                self._calls.discard(call)

    async def _request(self, messages: list[Message], fmt: dict[str, Any], settings: dict[str, Any]) -> Reply:
        try:
            raw = await asyncio.wait_for(self._client.chat.completions.with_raw_response.create(
                model=self.model, messages=messages, response_format=fmt, **settings,  # type: ignore[arg-type]
            ), self.timeout)
        except asyncio.TimeoutError:
            return Reply(None, Usage(calls=1), error=f"no reply within {self.timeout:g} s (CONFIG_REFLECTOR_TIMEOUT)")
        except (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError) as exc:
            raise RunError(
                f"the reflector API at {self.base_url} answered {exc.status_code} for model "
                f"{self.model!r}: check CONFIG_REFLECTOR_BASE_URL, CONFIG_REFLECTOR_MODEL and the key"
            ) from None
        except openai.APIError as exc:
            return Reply(None, Usage(calls=1), error=limits.note(f"{type(exc).__name__}: {exc.message}"))
        try:
            # Read from the body, checked: the SDK's own objects are built without validation.
            completion = read_completion(raw.status_code, raw.headers.get("content-type", ""), raw.content)
        except BadReply as exc:
            return Reply(None, Usage(calls=1), error=limits.note(str(exc)))
        return Reply(
            completion.content,
            Usage(1, completion.prompt_tokens, completion.completion_tokens),
            error=None if completion.content is not None else "the reply has no message content",
        )

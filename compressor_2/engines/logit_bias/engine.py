"""The engine for OpenAI-compatible servers that honour `logit_bias` (llama.cpp's
llama-server and llama-cpp-python's server, vLLM, SGLang's OpenAI API): each (prompt,
deltas) is one POST /v1/completions whose `logit_bias` is the deltas expanded through the
cluster map (steering/logit_bias.py). No code travels: the server needs no flag, and may
run anywhere.

The prompt goes as the text of the chat template that MODEL_PATH's tokenizer renders
(`ChatPrompt.text`, as on SGLang's completions path); every answer's `usage.prompt_tokens`
must be that prompt's token count, so a server running another tokenizer, or adding a
second BOS, is refused in one line naming it. Answers are counted as the other engines
count them: the server's `usage.completion_tokens` (the answer's tokens), and the end
token that ended it where the server's usage leaves it out (the probe, in server.py, finds
out); each call's total is held against the tokenizer's count of the answers' texts.

Requests run `concurrency` at a time; a connection failure or an HTTP 5xx is sent again
after a backoff, a timeout again up to TIMEOUT_RETRIES times, and an HTTP 4xx stops the run
naming the request and the server's message. The run never starts or stops the server.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from compressor_2.common import ConfigError, RunError, gather_or_cancel, scrub, shown
from compressor_2.engines.base import Generation, GenerationRequest, Progress
from compressor_2.engines.chat import ChatPrompt, chat_prompt, prompt_label
from compressor_2.engines.logit_bias.server import (
    PROBE_PROMPT,
    PROBE_TOKENS,
    ProbeAnswer,
    Served,
    check_applied,
    counts_end_token,
    end_ids,
    probe_cluster,
    probe_deltas,
    reply_fields,
    served_model,
)
from compressor_2.model import load_tokenizer
from compressor_2.steering.logit_bias import PHASES_REFUSAL, bias_json, logit_bias

if TYPE_CHECKING:
    from compressor_2.clusters.clusterset import ClusterSet
    from compressor_2.config import Config

logger = logging.getLogger(__name__)

PATH = "/v1/completions"
CONNECTION_RETRIES = 3
RETRY_BACKOFF = 0.5  # seconds before the first retry, doubled for each next one
TIMEOUT_RETRIES = 2  # one slow answer is not a dead server
# How far a call's answers' token count by the server may be from the tokenizer's count of
# their texts. They differ where decoding emitted a sequence the tokenizer splits otherwise
# (a steered answer can, legitimately): a warning past WARN_RATIO; past REFUSE_RATIO the
# server counts something else, or runs another tokenizer, and the run stops.
WARN_RATIO = 1.1
REFUSE_RATIO = 2.0
MIN_COMPARED = 20  # tokens below which a call's counts are not compared
# Every sampling field a server may default otherwise, stated: llama-cpp-python's server
# defaults to repeat_penalty 1.1 and min_p 0.05; vLLM and SGLang name the penalty
# repetition_penalty. Unknown fields are ignored by each of them. top_k is left to the
# server: no value means "all tokens" on all of them (llama.cpp refuses -1, older vLLM 0),
# and greedy decoding never reads it.
STATED = {"n": 1, "stream": False, "echo": False, "top_p": 1.0, "min_p": 0.0,
          "frequency_penalty": 0.0, "presence_penalty": 0.0, "repeat_penalty": 1.0, "repetition_penalty": 1.0}


def _message(response: httpx.Response) -> str:
    """An OpenAI-style {"error": {"message"}}, FastAPI's {"detail"}, else the raw body; cut,
    API keys masked."""
    try:
        body = response.json()
    except ValueError:
        body = None
    found: Any = response.text
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            found = error["message"]
        else:
            found = next((body[key] for key in ("error", "detail", "message") if key in body), found)
    text = scrub(found if isinstance(found, str) else json.dumps(found))
    return text if len(text) <= 300 else text[:300] + "..."


def _quiet_on_stop(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A Ctrl+C that lands while a request's task runs stops the run, which the CLI reports
    in one line: asyncio would print that task's traceback as it shuts down."""
    if not isinstance(context.get("exception"), KeyboardInterrupt):
        loop.default_exception_handler(context)


@dataclass(frozen=True)
class _Answer:
    generation: Generation
    ended: bool  # at an end token (counted in generation.completion_tokens)
    retokenized: int  # the tokenizer's count of the text


class LogitBiasEngine:
    """Implements `Engine` over one OpenAI-compatible server's /v1/completions."""

    def __init__(self, url: str, clusters: ClusterSet, tokenizer: Any, *, temperature: float, max_new_tokens: int,
                 concurrency: int, request_timeout: float, model_path: str) -> None:
        self.url = url
        self.clusters = clusters
        self.token_clusters = np.asarray(clusters.token_clusters)
        self.tokenizer = tokenizer
        self.tokenize: Callable[[str], ChatPrompt] = functools.partial(chat_prompt, tokenizer)
        self.stop_ids = list(end_ids(self.token_clusters))
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.concurrency = concurrency
        self.request_timeout = request_timeout
        self.model_path = model_path
        self.served: Served | None = None  # once prepare asked the server
        self.counts_end: bool | None = None  # whether usage counts the end token, once probed
        self._maps: dict[tuple[float, ...], str] = {}  # deltas -> their map as JSON text
        self._prompts: dict[str, ChatPrompt] = {}
        self._closed = False

    @classmethod
    def from_config(cls, config: Config, clusters: ClusterSet, tokenizer: Any = None,
                    prompts: Mapping[str, str] | None = None) -> LogitBiasEngine:
        """The engine on CONFIG_LOGIT_BIAS_URL, `prepare`d for `prompts` (by example id)."""
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.model_path)
        if len(clusters.token_clusters) != len(tokenizer):
            raise ConfigError(
                f"the cluster map covers {len(clusters.token_clusters)} tokens but the tokenizer of "
                f"{config.model_path!r} has {len(tokenizer)}: rerun build-clusters for this model")
        engine = cls(config.logit_bias_url, clusters, tokenizer, temperature=config.temperature,
                     max_new_tokens=config.max_new_tokens, concurrency=config.eval_concurrency,
                     request_timeout=config.logit_bias_request_timeout, model_path=config.model_path)
        engine.prepare(prompts or {})
        return engine

    def prepare(self, prompts: Mapping[str, str]) -> None:
        """Everything that can fail a run, before its first answer: the served model, every
        prompt's text form and length, and the probe."""
        with httpx.Client(timeout=self.request_timeout) as client:
            self.served = served_model(client, self.url, self.model_path)
            for example_id, prompt in prompts.items():
                self._check_prompt(f"example {example_id} ({prompt_label(prompt)})", self._prompt(prompt))
            self._probe(client)

    def _probe(self, client: httpx.Client) -> None:
        """The three probe requests (server.py): the map must change the answer, and the end
        tokens must end it, which says how the server counts them."""
        width = len(self.clusters.cluster_ids)
        cluster = probe_cluster(self.token_clusters, width)
        prompt = self._prompt(PROBE_PROMPT)
        self._check_prompt("the probe", prompt)
        unsteered, steered, ended = (
            self._probe_answer(client, prompt, deltas)
            for deltas in (None, probe_deltas(width, cluster), probe_deltas(width, 0)))
        pushed = int(np.count_nonzero(self.token_clusters >= 0))
        check_applied(self.url, unsteered, steered, self.clusters.cluster_ids[cluster], pushed)
        self.counts_end = counts_end_token(self.url, ended)
        logger.info("%s applies logit_bias; its usage %s the end token", self.url,
                    "counts" if self.counts_end else "leaves out")

    def _probe_answer(self, client: httpx.Client, prompt: ChatPrompt, deltas: tuple[float, ...] | None) -> ProbeAnswer:
        body = self._body(prompt, None if deltas is None else self._map(deltas), temperature=0.0,
                          max_tokens=PROBE_TOKENS)
        try:
            response = client.post(self.url + PATH, content=body, headers={"Content-Type": "application/json"})
        except httpx.HTTPError as exc:
            raise RunError(f"{self.url}{PATH} failed on the probe: {type(exc).__name__}: {exc}") from None
        data = self._json(response, "the probe")
        self._check_prompt_count(data, prompt, "the probe")
        return self._fields(data, "the probe", response)

    def _prompt(self, prompt: str) -> ChatPrompt:
        tokenized = self._prompts.get(prompt)
        if tokenized is None:
            tokenized = self._prompts[prompt] = self.tokenize(prompt)
        return tokenized

    def _check_prompt(self, label: str, prompt: ChatPrompt) -> None:
        if prompt.text is None:
            raise ConfigError(f"{label}: no text tokenizes into this prompt's ids with CONFIG_MODEL_PATH's tokenizer "
                              "(which adds its special tokens to a text prompt, as servers do), and the logit_bias "
                              "engine sends the prompt as text: use the transformers engine for this model")
        context = self.served.context if self.served is not None else None
        if context is not None and len(prompt.ids) + self.max_new_tokens > context:
            raise ConfigError(f"{label}: a prompt of {len(prompt.ids)} tokens plus CONFIG_MAX_NEW_TOKENS="
                              f"{self.max_new_tokens} exceeds the served model's context of {context} tokens; lower "
                              "CONFIG_EVIDENCE_MAX_CHARS or CONFIG_MAX_NEW_TOKENS")

    def _map(self, deltas: tuple[float, ...]) -> str:
        """The deltas' logit_bias map as JSON text, made once per delta vector."""
        text = self._maps.get(deltas)
        if text is None:
            if len(self._maps) >= 4096:  # a long run's vectors: keep the memory bounded
                self._maps.clear()
            text = self._maps[deltas] = bias_json(logit_bias(deltas, self.token_clusters))
        return text

    def _body(self, prompt: ChatPrompt, bias: str | None, **sampling: Any) -> bytes:
        """The request as JSON bytes, the map spliced in as made once (a dense map of a
        150k vocabulary is megabytes of JSON: not serialised again for every prompt)."""
        assert self.served is not None and prompt.text is not None
        fields = {"model": self.served.name, "prompt": prompt.text, "max_tokens": self.max_new_tokens,
                  "temperature": self.temperature, **STATED, "stop_token_ids": self.stop_ids, **sampling}
        text = json.dumps(fields, separators=(",", ":"))
        if bias is not None:
            text = f'{text[:-1]},"logit_bias":{bias}}}'
        return text.encode()

    def _json(self, response: httpx.Response, label: str) -> Any:
        if response.status_code != 200:
            raise RunError(f"{self.url}{PATH} refused {label} (HTTP {response.status_code}): {_message(response)}")
        try:
            return response.json()
        except ValueError:
            raise RunError(f"{self.url}{PATH} answered {label} with no JSON: {shown(response.text, 200)}") from None

    def _fields(self, data: Any, label: str, response: httpx.Response) -> ProbeAnswer:
        try:
            return reply_fields(data)
        except (KeyError, TypeError, ValueError, IndexError):
            raise RunError(f"{self.url}{PATH} answered {label} without choices[0].text and usage.completion_tokens: "
                           f"{shown(response.text, 200)}") from None

    def _check_prompt_count(self, data: Any, prompt: ChatPrompt, label: str) -> None:
        """The server must have read the prompt as exactly its tokens here: another tokenizer,
        or a second BOS, is another prompt."""
        usage = data.get("usage") if isinstance(data, dict) else None
        counted = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        if counted != len(prompt.ids):
            raise RunError(f"{self.url} read {label} as {shown(counted)} prompt tokens, where CONFIG_MODEL_PATH's "
                           f"tokenizer makes {len(prompt.ids)}: it serves another model or tokenizer, or adds a "
                           "special token the chat template already holds (a second BOS); serve CONFIG_MODEL_PATH's "
                           "model with its own tokenizer")

    def generate(self, requests: Sequence[GenerationRequest], progress: Progress | None = None) -> list[Generation]:
        if self._closed:
            raise RuntimeError("the engine is closed")
        width = len(self.clusters.cluster_ids)
        for i, request in enumerate(requests):
            if len(request.deltas) != width:
                if len(request.deltas) % width == 0:
                    raise ConfigError("the logit_bias engine: request deltas " + PHASES_REFUSAL.format(
                        count=len(request.deltas) // width).replace(". Export", ". Run"))
                raise ValueError(f"request {i}: {len(request.deltas)} deltas for {width} clusters")
        labels = [f"request {i} ({prompt_label(request.prompt)})" for i, request in enumerate(requests)]
        prompts = [self._prompt(request.prompt) for request in requests]
        for label, prompt in zip(labels, prompts):
            self._check_prompt(label, prompt)
        bodies = [self._body(prompt, self._map(request.deltas)) for prompt, request in zip(prompts, requests)]
        with asyncio.Runner() as runner:
            runner.get_loop().set_exception_handler(_quiet_on_stop)
            answers = runner.run(self._send_all(bodies, labels, prompts, progress))
        self._check_counts(answers)
        return [answer.generation for answer in answers]

    def _check_counts(self, answers: Sequence[_Answer]) -> None:
        """The server's count of the call's answer tokens (end tokens left out) against the
        tokenizer's count of their texts."""
        served = sum(a.generation.completion_tokens - a.ended for a in answers)
        own = sum(a.retokenized for a in answers)
        if max(served, own) < MIN_COMPARED:
            return
        ratio = max(served, own) / max(min(served, own), 1)
        what = (f"{self.url} counted {served} tokens in {len(answers)} answers whose texts CONFIG_MODEL_PATH's "
                f"tokenizer makes {own} tokens of")
        if ratio > REFUSE_RATIO:
            raise RunError(f"{what}: it counts something else, or serves another model or tokenizer; serve "
                           "CONFIG_MODEL_PATH's model with its own tokenizer")
        if ratio > WARN_RATIO:
            logger.warning("warning: %s (%.0f%% apart): decoding emitted sequences the tokenizer splits otherwise; "
                           "the answers' counts are the server's", what, 100 * (ratio - 1))

    async def _send_all(self, bodies: list[bytes], labels: list[str], prompts: list[ChatPrompt],
                        progress: Progress | None) -> list[_Answer]:
        results: list[_Answer | None] = [None] * len(bodies)
        slots = asyncio.Semaphore(self.concurrency)
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        async with httpx.AsyncClient(timeout=self.request_timeout, limits=limits) as client:
            async def one(i: int) -> None:
                async with slots:
                    results[i] = await self._post(client, bodies[i], labels[i], prompts[i])
                if progress is not None:
                    progress(1)

            # The same prompt's requests one after another: a server that keeps the previous
            # prompt's keys and values (llama-cpp-python) or caches prefixes prefills it once.
            order = sorted(range(len(bodies)), key=lambda i: prompts[i].ids)
            tasks = [asyncio.create_task(one(i)) for i in order]
            await gather_or_cancel(tasks)
        return [r for r in results if r is not None]

    async def _post(self, client: httpx.AsyncClient, body: bytes, label: str,
                    prompt: ChatPrompt) -> _Answer:
        where = self.url + PATH
        failures = timeouts = 0
        while True:
            try:
                response = await client.post(where, content=body, headers={"Content-Type": "application/json"})
            except httpx.TimeoutException:
                timeouts += 1
                if timeouts > TIMEOUT_RETRIES:
                    raise RunError(f"{where} gave no answer to {label} within {self.request_timeout:g} s "
                                   f"(CONFIG_LOGIT_BIAS_REQUEST_TIMEOUT), {timeouts} times in a row: raise it, or "
                                   "lower CONFIG_EVAL_CONCURRENCY for a server that answers one request at a time"
                                   ) from None
                logger.warning("warning: %s gave no answer to %s within %g s (CONFIG_LOGIT_BIAS_REQUEST_TIMEOUT): "
                               "sending it again (%d of at most %d)", where, label, self.request_timeout, timeouts,
                               TIMEOUT_RETRIES)
                continue
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 500:
                    return self._generation(self._json(response, label), label, prompt, response)
                problem = f"HTTP {response.status_code}: {_message(response)}"
            failures += 1
            if failures > CONNECTION_RETRIES:
                raise RunError(f"{where} failed {failures} times on {label}; last: {problem}")
            await asyncio.sleep(RETRY_BACKOFF * 2 ** (failures - 1))

    def _generation(self, data: Any, label: str, prompt: ChatPrompt,
                    response: httpx.Response) -> _Answer:
        """The answer, its tokens counted as the other engines count them (the end token that
        ended it included), and the tokenizer's count of its text."""
        self._check_prompt_count(data, prompt, label)
        answer = self._fields(data, label, response)
        ended = answer.finish_reason == "stop"
        tokens = answer.completion_tokens + (1 if ended and not self.counts_end else 0)
        retokenized = len(self.tokenizer(answer.text, add_special_tokens=False)["input_ids"])
        return _Answer(Generation(text=answer.text, completion_tokens=tokens), ended, retokenized)

    def close(self) -> None:
        self._closed = True  # the server is the user's: nothing to stop

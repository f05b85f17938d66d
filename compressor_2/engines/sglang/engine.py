"""The production engine: one processor string for the whole run, each request's deltas
in its `custom_params`, sent on SGLang's native `/generate` or, through SGLang's router,
on `/v1/completions` (`sglang_api`).

Because the deltas travel with the request, a whole generation of individuals is in
flight at once and the server batches them. In launch mode the engine owns one server
for the run and restarts it only when it crashed, resending what was unfinished; in
attach mode it sends to already running servers or routers, spreading requests over
the URLs it was given.

Before any work, every server is checked (`facts`: no speculative decoding, the
right model, deterministic as CONFIG_SGLANG_DETERMINISTIC says; behind a router, every
worker it lists), every prompt of the run is tokenized and checked against the served
context, and a steering probe (`probe`), sent to every server, every worker and
every router, must find every token of an answer steered. A server or worker gets the run's by-reference
processor string only after a probe with a string no server can die of
(`steering.guarded`) found that it imports compressor_2.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from compressor_2.clusters.vocab import load_vocabulary
from compressor_2.common import ConfigError, RunError, gather_or_cancel
from compressor_2.config import check_addresses, check_loopback
from compressor_2.engines.base import Generation, GenerationRequest, Progress
from compressor_2.engines.chat import ChatPrompt, chat_prompt, prompt_label
from compressor_2.engines.sglang.api import APIS, Api, ServerReply
from compressor_2.engines.sglang.facts import (
    STATED_SAMPLING,
    Router,
    ServerFacts,
    answer_room,
    check_attached,
    check_facts,
    radix_warning,
    read_server,
    worker_facts,
)
from compressor_2.engines.sglang.probe import (
    PROBE_DELTA,
    PROBE_PROMPT,
    PROBE_TOKENS,
    cannot_import,
    check_steered,
    ignored,
    probe_cluster,
)
from compressor_2.engines.sglang.server import SGLangServer
from compressor_2.model import load_tokenizer
from compressor_2.steering.guarded import guarded_spec
from compressor_2.steering.phases import vocabulary_classes
from compressor_2.steering.processor import custom_params, encode_cluster_map, processor_spec

if TYPE_CHECKING:
    from compressor_2.clusters.clusterset import ClusterSet
    from compressor_2.config import Config

logger = logging.getLogger(__name__)

CONNECTION_RETRIES = 3
RETRY_BACKOFF = 0.5  # seconds before the first retry, doubled for each next one
# A request past CONFIG_SGLANG_REQUEST_TIMEOUT is sent again this many times (on the next
# URL when attached to several) before the run stops: one slow answer is not a dead server.
TIMEOUT_RETRIES = 2


class _ServerLost(Exception):
    """The launched server died with this request unfinished: restart and resend."""


def _error_message(response: httpx.Response) -> str:
    """SGLang answers errors as {"error": {"message"}}, {"error": "..."} (its contract gate)
    or {"message"}; else the raw body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if isinstance(error, str):
            return error
        if "message" in body:
            return str(body["message"])
    return response.text[:300]


class SGLangEngine:
    """Implements `Engine` over HTTP against one launched server or several attached ones."""

    def __init__(
        self,
        urls: Sequence[str],
        clusters: ClusterSet,
        tokenize: Callable[[str], ChatPrompt],
        *,
        temperature: float,
        max_new_tokens: int,
        concurrency: int,
        request_timeout: float,
        api: str = "generate",
        server: SGLangServer | None = None,
        max_restarts: int = 0,
        phases: int = 1,
        token_classes: str = "",  # with phases: `encode_cluster_map` of the vocabulary's token classes
    ) -> None:
        if not urls:
            raise ValueError("no server URL")
        self.urls = tuple(urls)
        self.clusters = clusters
        self.phases, self.token_classes = phases, token_classes
        # Every token of cluster 0 ends an answer, as in the transformers engine: a server stops
        # only at its model's eos ids, which may leave out one of cluster 0's end markers (a
        # GGUF of SmolLM2 ends at <|im_end|>, not at <|endoftext|>).
        self.stop_ids = np.flatnonzero(np.asarray(clusters.token_clusters) == 0).tolist()
        self.tokenize = tokenize
        # None ("auto") until check_servers has seen whether a URL is a router.
        self._api: Api | None = None if api == "auto" else APIS[api]
        self.routers: dict[str, tuple[str, ...]] = {}  # router URL -> the workers it routes to
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.concurrency = concurrency
        self.request_timeout = request_timeout
        self.server = server
        self.max_restarts = max_restarts
        self.restarts = 0
        self.context: int | None = None  # the smallest served context, once check_servers read it
        self.facts: list[ServerFacts] = []  # every server and worker, once check_servers read them
        # One string for the whole run: SGLang batches rows by the exact string.
        self.processor = processor_spec()
        self._next_url = itertools.cycle(self.urls).__next__
        self._prompts: dict[str, ChatPrompt] = {}
        self._closed = False

    @classmethod
    def from_config(cls, config: Config, clusters: ClusterSet, tokenizer: Any = None,
                    prompts: Mapping[str, str] | None = None, phases: int = 1) -> SGLangEngine:
        """Attach to CONFIG_SGLANG_URLS, or launch the one server of this run; then `prepare`
        for `prompts` (every prompt the run will send, by example id)."""
        check_addresses(config)
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.model_path)
        if len(clusters.token_clusters) != len(tokenizer):
            raise ConfigError(
                f"the cluster map covers {len(clusters.token_clusters)} tokens but the tokenizer of "
                f"{config.model_path!r} has {len(tokenizer)}: rerun build-clusters for this model"
            )
        settings: dict[str, Any] = dict(
            temperature=config.temperature, max_new_tokens=config.max_new_tokens,
            concurrency=config.eval_concurrency, request_timeout=config.sglang_request_timeout,
            api=config.sglang_api, phases=phases,
            token_classes=encode_cluster_map(vocabulary_classes(load_vocabulary(config.model_path))) if phases > 1 else "",
        )
        tokenize = functools.partial(chat_prompt, tokenizer)
        if config.sglang_urls:
            check_attached(config.sglang_urls, config.sglang_request_timeout)
            engine = cls(config.sglang_urls, clusters, tokenize, **settings)
            engine.prepare(config, prompts or {})
            return engine
        server = SGLangServer(config)
        server.start()
        try:
            engine = cls((server.url,), clusters, tokenize, server=server,
                         max_restarts=config.sglang_max_restarts, **settings)
            engine.prepare(config, prompts or {})
            return engine
        except BaseException:
            server.stop()
            raise

    def prepare(self, config: Config, prompts: Mapping[str, str]) -> None:
        """Everything that can fail a run, before its first answer: what each server is, every
        prompt against the served context, and the steering probe."""
        self.check_servers(config)
        self.check_prompts(prompts)
        lengths = [len(self._prompt(prompt).ids) for prompt in prompts.values()]
        for warning in filter(None, (radix_warning(fact, lengths) for fact in self.facts)):
            logger.warning("%s", warning)
        self.check_steering()

    @property
    def api(self) -> Api:
        if self._api is None:
            raise RuntimeError("CONFIG_SGLANG_API=auto: check_servers chooses the request path")
        return self._api

    def check_servers(self, config: Config) -> None:
        """Find which URLs are routers (and choose the request path for "auto": completions
        when one is), then refuse a server or worker that runs speculative decoding, serves
        another model or prefers answer-changing sampling fields, and (with
        CONFIG_SGLANG_DETERMINISTIC=y) one without --enable-deterministic-inference; keep the
        smallest served context for the prompt checks."""
        with httpx.Client(timeout=self.request_timeout) as client:
            found = [read_server(client, url) for url in self.urls]
            self.routers = {r.url: r.workers for r in found if isinstance(r, Router)}
            facts = [f for f in found if isinstance(f, ServerFacts)]
            for router, workers in self.routers.items():
                for worker in workers:
                    check_loopback(worker, config, f"the router at {router} routes to")
                reached = {worker: worker_facts(client, router, worker) for worker in workers}
                self.routers[router] = tuple(worker for worker, fact in reached.items() if fact is not None)
                facts += [fact for fact in reached.values() if fact is not None]
        for router, workers in self.routers.items():
            if not workers:
                raise RunError(f"no worker the router at {router} routes to can be reached from this machine, so "
                               "none can be checked: start them; their addresses are asked from here, so run the "
                               "router on this machine (tunnel remote workers' ports here first)")
        if self._api is None:
            self._api = APIS["completions" if self.routers else "generate"]
        for fact in facts:
            check_facts(fact, config, self.api.name)
        self.facts = facts
        contexts = [fact.context for fact in facts]
        if None in contexts:
            unknown = ", ".join(f.url for f in facts if f.context is None)
            logger.warning("warning: %s does not say its context length: a prompt too long for it fails "
                           "the run when it is sent (HTTP 400), not before", unknown)
        known = [c for c in contexts if c is not None]
        self.context = min(known) if known else None

    def check_prompts(self, prompts: Mapping[str, str]) -> None:
        """Tokenize every prompt and refuse, naming the example, one whose answer would not fit
        the served context (SGLang answers 400, or silently cuts the answer short)."""
        for example_id, prompt in prompts.items():
            self._check_prompt(f"example {example_id} ({prompt_label(prompt)})", self._prompt(prompt))

    def _check_prompt(self, label: str, prompt: ChatPrompt) -> None:
        """Refuse, naming `label`, a prompt this run cannot send: one without a text form on
        /v1/completions, or one whose answer would not fit the served context."""
        self._check_sendable(label, prompt)
        self._check_fits(label, prompt.ids)

    def _check_sendable(self, label: str, prompt: ChatPrompt) -> None:
        if prompt.text is None and self.api.name == "completions":
            raise ConfigError(
                f"{label}: no text tokenizes into this prompt's ids with CONFIG_MODEL_PATH's tokenizer (which "
                "adds its special tokens to a text prompt, as SGLang does), and /v1/completions through a router "
                "takes text only: send token ids with CONFIG_SGLANG_API=generate and the workers' URLs in "
                "CONFIG_SGLANG_URLS, not the router's")

    def _check_fits(self, label: str, ids: list[int]) -> None:
        if self.context is None or answer_room(len(ids), self.context) >= self.max_new_tokens:
            return
        raise ConfigError(
            f"{label}: a prompt of {len(ids)} tokens plus CONFIG_MAX_NEW_TOKENS={self.max_new_tokens} "
            f"exceeds the served model's context of {self.context} tokens (SGLang keeps 2 of them, and cuts "
            "or refuses answers past the rest); lower CONFIG_EVIDENCE_MAX_CHARS or CONFIG_MAX_NEW_TOKENS")

    def check_steering(self) -> None:
        """Fail before any work when a server, worker or router ignores the deltas, or
        steers only some tokens, and never kill a server that cannot load the processor.

        A server that cannot import compressor_2 dies of the run's by-reference string
        (SGLang unpickles it in its scheduler); one that cannot read the cluster map leaves
        the logits unchanged (the processor never raises), which would make a whole
        evolution measure nothing; one running speculative decoding steers only an
        answer's first token; a router may drop the deltas on their way. Every server and
        every worker behind a router is probed directly (`probe`), first with
        `guarded_spec()` and the map inside the request (it steers only where compressor_2
        imports, and kills no server), then with the run's own string and map path; then
        every router.
        """
        # First: building a body for a prompt without a text form on /v1/completions raises a
        # bare ValueError (CompletionsApi.body), where this names the probe and the fix.
        prompt = self._prompt(PROBE_PROMPT)
        self._check_sendable("the steering probe", prompt)
        cluster = probe_cluster(self.clusters)
        members = set(np.flatnonzero(self.clusters.token_clusters == cluster).tolist())
        name = self.clusters.cluster_ids[cluster]
        guarded = self.probe_bodies(cluster, guarded_spec(), {"cluster_map": encode_cluster_map(
            self.clusters.token_clusters)})
        own = self.probe_bodies(cluster)
        direct = [url for url in self.urls if url not in self.routers]
        workers = [worker for listed in self.routers.values() for worker in listed]
        path = self.clusters.token_clusters_path
        with httpx.Client(timeout=self.request_timeout) as client:
            for url in [*direct, *workers]:
                self._probe(client, url, prompt, members, guarded, cannot_import(url, self.server, self.api.name))
                self._probe(client, url, prompt, members, own, ignored(url, name, False, self.api.name, path))
            for url in self.routers:
                self._probe(client, url, prompt, members, own, ignored(url, name, True, self.api.name, path))

    def _probe(self, client: httpx.Client, url: str, prompt: ChatPrompt, members: set[int],
               bodies: list[dict[str, Any]], refusal: str) -> None:
        """One probe pair to `url`; RunError(`refusal`) when the deltas do not decide its tokens."""
        try:
            up, down = (self._probe_ids(url, client.post(url + self.api.path, json=body), prompt) for body in bodies)
        except httpx.TransportError as exc:
            server = self.server
            died = f"; {server.failure_summary()}" if server and not server.alive() else ""
            raise RunError(f"{url}{self.api.path} failed: {type(exc).__name__}: {exc}{died}") from None
        check_steered(url, up, down, members, refusal)

    def probe_bodies(self, cluster: int, processor: str | None = None,
                     params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The two probe requests: `cluster` at +PROBE_DELTA, then at -PROBE_DELTA, with
        `processor` (the run's string by default) and these custom_params instead of the
        run's map path."""
        probes = []
        for sign in (1.0, -1.0):
            width = len(self.clusters.cluster_ids)  # the cluster moved in every phase
            deltas = [sign * PROBE_DELTA if i % width == cluster else 0.0 for i in range(width * self.phases)]
            request = GenerationRequest(PROBE_PROMPT, tuple(deltas))
            stated = None if params is None else {"deltas": list(deltas), **params}
            probes.append(self.request_body(request, processor, stated, temperature=0.0,
                                            max_new_tokens=PROBE_TOKENS, ignore_eos=True))
        return probes

    def _probe_ids(self, url: str, response: httpx.Response, prompt: ChatPrompt) -> list[int]:
        reply = self._read(url, response, "the steering probe", prompt)
        where = url + self.api.path
        if reply.output_ids is None:
            raise RunError(f"{where} answered the steering probe without its token ids: {response.text[:200]}")
        if len(reply.output_ids) != PROBE_TOKENS:
            raise RunError(f"{where} answered the steering probe with {len(reply.output_ids)} tokens, not the "
                           f"{PROBE_TOKENS} it asked for (ignore_eos)")
        return reply.output_ids

    @property
    def server_starts(self) -> int:
        """How many times this engine started a server (0 when attached)."""
        return 0 if self.server is None else self.server.starts

    def generate(self, requests: Sequence[GenerationRequest],
                 progress: Progress | None = None) -> list[Generation]:
        if self._closed:
            raise RuntimeError("the engine is closed")
        width = len(self.clusters.cluster_ids) * self.phases
        for i, request in enumerate(requests):
            if len(request.deltas) != width:
                raise ValueError(f"request {i}: {len(request.deltas)} deltas for {width // self.phases} clusters"
                                 + (f" in {self.phases} phases" if self.phases > 1 else ""))
        labels = [f"request {i} ({prompt_label(request.prompt)})" for i, request in enumerate(requests)]
        prompts = [self._prompt(request.prompt) for request in requests]
        for label, prompt in zip(labels, prompts):
            self._check_prompt(label, prompt)
        bodies = [self.request_body(request) for request in requests]
        results: list[Generation | None] = [None] * len(requests)
        pending = list(range(len(requests)))
        while pending:
            pending = asyncio.run(self._send_all(bodies, labels, prompts, pending, results, progress))
            if pending:
                self._restart(len(pending))
        return [r for r in results if r is not None]

    def _prompt(self, prompt: str) -> ChatPrompt:
        tokenized = self._prompts.get(prompt)
        if tokenized is None:
            tokenized = self._prompts[prompt] = self.tokenize(prompt)
        return tokenized

    def request_body(self, request: GenerationRequest, processor: str | None = None,
                     params: dict[str, Any] | None = None, **sampling: Any) -> dict[str, Any]:
        """The body of one request on the run's path: the prompt, the run's processor string,
        and every sampling field that changes an answer (a server's preferred params cannot
        fill one); the probe gives its own `processor` and custom_params (`params`), and
        `sampling` overrides the run's (the probe's greedy 8 tokens)."""
        stated = {
            **STATED_SAMPLING,
            "stop_token_ids": self.stop_ids or None,
            "temperature": self.temperature,
            "max_new_tokens": self.max_new_tokens,
            "custom_params": params if params is not None else custom_params(
                request.deltas, self.clusters, self.phases, self.token_classes),
            **sampling,
        }
        return self.api.body(self._prompt(request.prompt), processor or self.processor, stated)

    async def _send_all(self, bodies: list[dict[str, Any]], labels: list[str], prompts: list[ChatPrompt],
                        indices: list[int], results: list[Generation | None],
                        progress: Progress | None) -> list[int]:
        """Sends `indices` with at most `concurrency` in flight; returns those a server crash lost."""
        lost: list[int] = []
        slots = asyncio.Semaphore(self.concurrency)
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)

        async with httpx.AsyncClient(timeout=self.request_timeout, limits=limits) as client:
            async def one(i: int) -> None:
                async with slots:
                    try:
                        results[i] = await self._post(client, bodies[i], labels[i], prompts[i])
                    except _ServerLost:
                        lost.append(i)
                        return
                if progress is not None:
                    progress(1)

            tasks = [asyncio.create_task(one(i)) for i in indices]
            await gather_or_cancel(tasks)
        return sorted(lost)

    async def _post(self, client: httpx.AsyncClient, body: dict[str, Any], label: str,
                    prompt: ChatPrompt) -> Generation:
        path = self.api.path
        failures = timeouts = 0
        while True:
            url = self._next_url()  # a retry goes to the next server when attached to several
            try:
                response = await client.post(url + path, json=body)
            except httpx.TimeoutException:
                self._check_server()
                timeouts += 1
                if timeouts > TIMEOUT_RETRIES:
                    raise RunError(f"{url}{path} gave no answer to {label} within {self.request_timeout:g} s "
                                   f"(CONFIG_SGLANG_REQUEST_TIMEOUT), {timeouts} times in a row: raise "
                                   "CONFIG_SGLANG_REQUEST_TIMEOUT for a big model or long prompts, or see the "
                                   "server's log") from None
                logger.warning("warning: %s%s gave no answer to %s within %g s (CONFIG_SGLANG_REQUEST_TIMEOUT): "
                               "sending it again (%d of at most %d)", url, path, label, self.request_timeout,
                               timeouts, TIMEOUT_RETRIES)
                continue
            except httpx.TransportError as exc:
                self._check_server()
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 500:
                    reply = self._read(url, response, label, prompt)
                    return Generation(text=reply.text, completion_tokens=reply.completion_tokens)
                self._check_server()
                problem = f"HTTP {response.status_code}: {_error_message(response)}"
            failures += 1
            if failures > CONNECTION_RETRIES:
                raise RunError(f"{url}{path} failed {failures} times; last: {problem}")
            await asyncio.sleep(RETRY_BACKOFF * 2 ** (failures - 1))

    def _check_server(self) -> None:
        if self.server is not None and not self.server.alive():
            raise _ServerLost

    def _read(self, url: str, response: httpx.Response, label: str, prompt: ChatPrompt) -> ServerReply:
        """The answer to `label`; on /v1/completions, only when the server tokenized the text
        prompt into exactly this machine's ids."""
        where = url + self.api.path
        if response.status_code != 200:
            raise RunError(f"{where} refused {label} (HTTP {response.status_code}): {_error_message(response)}")
        try:
            reply = self.api.reply(response.json())
        except (ValueError, KeyError, TypeError, IndexError):
            raise RunError(f"{where} answered {label} without {self.api.fields}: {response.text[:200]}") from None
        if reply.prompt_ids is not None and reply.prompt_ids != prompt.ids:
            first = next((i for i, (a, b) in enumerate(zip(reply.prompt_ids, prompt.ids)) if a != b),
                         min(len(reply.prompt_ids), len(prompt.ids)))
            raise RunError(
                f"{where} tokenized {label} into {len(reply.prompt_ids)} ids, not the {len(prompt.ids)} of "
                f"CONFIG_MODEL_PATH's tokenizer here (first difference at position {first}: server "
                f"{reply.prompt_ids[first:first + 3]}, here {prompt.ids[first:first + 3]}): the server's "
                "tokenizer is another, or adds a special token the text already holds (a second BOS); serve "
                "CONFIG_MODEL_PATH's tokenizer, or send token ids: CONFIG_SGLANG_API=generate with the "
                "workers' URLs in CONFIG_SGLANG_URLS, not the router's")
        return reply

    def _restart(self, unfinished: int) -> None:
        assert self.server is not None  # only a launched server is reported lost
        if self.restarts >= self.max_restarts:
            raise RunError(
                f"the SGLang server died with {unfinished} request(s) unfinished after "
                f"{self.restarts} restart(s) (CONFIG_SGLANG_MAX_RESTARTS={self.max_restarts}); "
                + self.server.failure_summary()
            )
        self.restarts += 1
        logger.warning("SGLang server died with %d request(s) unfinished: restart %d of at most %d",
                       unfinished, self.restarts, self.max_restarts)
        self.server.restart()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.server is not None:
            self.server.stop()
            logger.info("SGLang engine closed after %d server start(s)", self.server.starts)

    def __enter__(self) -> SGLangEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

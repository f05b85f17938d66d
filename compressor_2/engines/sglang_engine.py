"""The production engine: SGLang's native `/generate`, one processor string for the
whole run, each request's deltas in `sampling_params.custom_params`.

Because the deltas travel with the request, a whole generation of individuals is in
flight at once and the server batches them. In launch mode the engine owns one server
for the run and restarts it only when it crashed, resending what was unfinished; in
attach mode it spreads requests over already running servers.

Before any work, every server is checked (`sglang_facts`: no speculative decoding, the
right model, deterministic or warned about), every prompt of the run is tokenized and
checked against the served context, and a steering probe must find every token of an
answer steered.
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

from compressor_2.config.sglang import check_addresses
from compressor_2.engines.base import Generation, GenerationRequest, Progress
from compressor_2.engines.chat import encode_prompt
from compressor_2.engines.sglang_facts import STATED_SAMPLING, answer_room, check_facts, read_facts
from compressor_2.engines.sglang_server import SGLangServer
from compressor_2.errors import ConfigError, RunError
from compressor_2.steering.processor import custom_params, processor_spec

if TYPE_CHECKING:
    from compressor_2.clusters.build import ClusterSet
    from compressor_2.config import Config

logger = logging.getLogger(__name__)

CONNECTION_RETRIES = 3
RETRY_BACKOFF = 0.5  # seconds before the first retry, doubled for each next one
PROBE_PROMPT = "Hello"
PROBE_DELTA = 1000.0  # far beyond any logit gap: every token's cluster is forced
# Enough tokens that a server steering only an answer's first one (speculative decoding)
# cannot pass by chance: each later token would have to fall in the probe's cluster too.
PROBE_TOKENS = 8


class _ServerLost(Exception):
    """The launched server died with this request unfinished: restart and resend."""


def load_tokenizer(model_path: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_path)
    except (OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"CONFIG_MODEL_PATH={model_path!r}: cannot load the tokenizer: {first}") from None


def check_attached(urls: Sequence[str], timeout: float) -> None:
    """Fail before any work when a configured server is down or still starting."""
    with httpx.Client(timeout=timeout) as client:
        for url in urls:
            try:
                status = client.get(url + "/health_generate").status_code
                if status == 404:
                    status = client.get(url + "/health").status_code
            except httpx.TransportError as exc:
                raise RunError(
                    f"CONFIG_SGLANG_URLS: cannot reach {url} ({type(exc).__name__}: {exc})") from None
            if status != 200:
                raise RunError(
                    f"CONFIG_SGLANG_URLS: {url} is not ready (HTTP {status} from its health check)")


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


def _prompt_label(prompt: str) -> str:
    # The prompt's end is the question in the default template: it names the example.
    return f"prompt ending {prompt[-60:]!r}"


class SGLangEngine:
    """Implements `Engine` over HTTP against one launched server or several attached ones."""

    def __init__(
        self,
        urls: Sequence[str],
        clusters: ClusterSet,
        encode: Callable[[str], list[int]],
        *,
        temperature: float,
        max_new_tokens: int,
        concurrency: int,
        request_timeout: float,
        server: SGLangServer | None = None,
        max_restarts: int = 0,
    ) -> None:
        if not urls:
            raise ValueError("no server URL")
        self.urls = tuple(urls)
        self.clusters = clusters
        self.encode = encode
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.concurrency = concurrency
        self.request_timeout = request_timeout
        self.server = server
        self.max_restarts = max_restarts
        self.restarts = 0
        self.context: int | None = None  # the smallest served context, once check_servers read it
        # One string for the whole run: SGLang batches rows by the exact string.
        self.processor = processor_spec()
        self._next_url = itertools.cycle(self.urls).__next__
        self._encoded: dict[str, list[int]] = {}
        self._closed = False

    @classmethod
    def from_config(cls, config: Config, clusters: ClusterSet, tokenizer: Any = None,
                    prompts: Mapping[str, str] | None = None) -> SGLangEngine:
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
        )
        encode = functools.partial(encode_prompt, tokenizer)
        if config.sglang_urls:
            check_attached(config.sglang_urls, config.sglang_request_timeout)
            engine = cls(config.sglang_urls, clusters, encode, **settings)
            engine.prepare(config, prompts or {})
            return engine
        server = SGLangServer(config)
        server.start()
        try:
            engine = cls((server.url,), clusters, encode, server=server,
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
        self.check_steering()

    def check_servers(self, config: Config) -> None:
        """Refuse a server that runs speculative decoding, serves another model or prefers
        answer-changing sampling fields; warn about one that is not deterministic; keep the
        smallest served context for the prompt checks."""
        with httpx.Client(timeout=self.request_timeout) as client:
            facts = [read_facts(client, url) for url in self.urls]
        for fact in facts:
            check_facts(fact, config)
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
            self._check_fits(f"example {example_id} ({_prompt_label(prompt)})", self._ids(prompt))

    def _check_fits(self, label: str, ids: list[int]) -> None:
        if self.context is None or answer_room(len(ids), self.context) >= self.max_new_tokens:
            return
        raise ConfigError(
            f"{label}: a prompt of {len(ids)} tokens plus CONFIG_MAX_NEW_TOKENS={self.max_new_tokens} "
            f"exceeds the served model's context of {self.context} tokens (SGLang keeps 2 of them, and cuts "
            "or refuses answers past the rest); lower CONFIG_EVIDENCE_MAX_CHARS or CONFIG_MAX_NEW_TOKENS")

    def _probe_cluster(self) -> int:
        """The smallest cluster that has tokens: the least likely to be chosen unsteered."""
        counts = np.bincount(self.clusters.token_clusters, minlength=len(self.clusters.cluster_ids))
        sizes = np.where(counts > 0, counts, np.iinfo(counts.dtype).max)
        return int(np.argmin(sizes[: len(self.clusters.cluster_ids)]))

    def check_steering(self) -> None:
        """Fail before any work when a server ignores the deltas, or steers only some tokens.

        A server that cannot import the processor or read the cluster map leaves the
        logits unchanged (the processor must never raise), which would make a whole
        evolution measure nothing; one running speculative decoding steers only an
        answer's first token. Per server, two greedy probes of PROBE_TOKENS tokens
        (ignore_eos) push the smallest cluster to +1000 and then -1000: every token of the
        first must come from that cluster, and no token of the second.
        """
        cluster = self._probe_cluster()
        members = set(np.flatnonzero(self.clusters.token_clusters == cluster).tolist())
        probes = self.probe_bodies(cluster)
        name = self.clusters.cluster_ids[cluster]
        with httpx.Client(timeout=self.request_timeout) as client:
            for url in self.urls:
                try:
                    up, down = (self._output_ids(url, client.post(url + "/generate", json=body))
                                for body in probes)
                except httpx.TransportError as exc:
                    # A processor string the server cannot load kills it (SGLang validates nothing).
                    server = self.server
                    died = f"; {server.failure_summary()}" if server and not server.alive() else ""
                    raise RunError(f"{url}/generate failed: {type(exc).__name__}: {exc}{died}") from None
                outside = sum(token not in members for token in up)
                if not outside and not any(token in members for token in down):
                    continue
                if up[0] in members and down[0] not in members:
                    raise RunError(
                        f"{url} steers only the first token of an answer ({outside} of {len(up)} probe tokens "
                        f"escaped cluster {name} at +{PROBE_DELTA:g}): speculative decoding? its "
                        "verification never calls the custom logit processor; restart the server without "
                        "--speculative-* flags")
                raise RunError(
                    f"{url} ignores the steering deltas (cluster {name} at +{PROBE_DELTA:g} and "
                    f"-{PROBE_DELTA:g} does not decide the probe's tokens): the server must be able to "
                    f"import compressor_2 and read {self.clusters.token_clusters_path}; see its log"
                )

    def probe_bodies(self, cluster: int) -> list[dict[str, Any]]:
        """The two probe requests: `cluster` at +PROBE_DELTA, then at -PROBE_DELTA."""
        probes = []
        for sign in (1.0, -1.0):
            deltas = [0.0] * len(self.clusters.cluster_ids)
            deltas[cluster] = sign * PROBE_DELTA
            body = self.request_body(GenerationRequest(PROBE_PROMPT, tuple(deltas)))
            body["sampling_params"].update(temperature=0.0, max_new_tokens=PROBE_TOKENS, ignore_eos=True)
            probes.append(body)
        return probes

    @staticmethod
    def _output_ids(url: str, response: httpx.Response) -> list[int]:
        if response.status_code != 200:
            raise RunError(f"{url}/generate refused the steering probe (HTTP {response.status_code}): "
                           f"{_error_message(response)}")
        try:
            ids = [int(token) for token in response.json()["output_ids"]]
        except (ValueError, KeyError, TypeError):
            raise RunError(f"{url}/generate answered the steering probe without output_ids: "
                           f"{response.text[:200]}") from None
        if len(ids) != PROBE_TOKENS:
            raise RunError(f"{url}/generate answered the steering probe with {len(ids)} tokens, not the "
                           f"{PROBE_TOKENS} it asked for (ignore_eos)")
        return ids

    @property
    def server_starts(self) -> int:
        """How many times this engine started a server (0 when attached)."""
        return 0 if self.server is None else self.server.starts

    def generate(self, requests: Sequence[GenerationRequest],
                 progress: Progress | None = None) -> list[Generation]:
        if self._closed:
            raise RuntimeError("the engine is closed")
        width = len(self.clusters.cluster_ids)
        for i, request in enumerate(requests):
            if len(request.deltas) != width:
                raise ValueError(f"request {i}: {len(request.deltas)} deltas for {width} clusters")
        bodies = [self.request_body(request) for request in requests]
        labels = [f"request {i} ({_prompt_label(request.prompt)})" for i, request in enumerate(requests)]
        for label, body in zip(labels, bodies):
            self._check_fits(label, body["input_ids"])
        results: list[Generation | None] = [None] * len(requests)
        pending = list(range(len(requests)))
        while pending:
            pending = asyncio.run(self._send_all(bodies, labels, pending, results, progress))
            if pending:
                self._restart(len(pending))
        return [r for r in results if r is not None]

    def _ids(self, prompt: str) -> list[int]:
        ids = self._encoded.get(prompt)
        if ids is None:
            ids = self._encoded[prompt] = self.encode(prompt)
        return ids

    def request_body(self, request: GenerationRequest) -> dict[str, Any]:
        """The `/generate` body of one request: token ids, the run's processor string, and every
        sampling field that changes an answer (a server's preferred params cannot fill one)."""
        return {
            "input_ids": self._ids(request.prompt),
            "custom_logit_processor": self.processor,
            "sampling_params": {
                **STATED_SAMPLING,
                "temperature": self.temperature,
                "max_new_tokens": self.max_new_tokens,
                "custom_params": custom_params(request.deltas, self.clusters),
            },
        }

    async def _send_all(self, bodies: list[dict[str, Any]], labels: list[str], indices: list[int],
                        results: list[Generation | None], progress: Progress | None) -> list[int]:
        """Sends `indices` with at most `concurrency` in flight; returns those a server crash lost."""
        lost: list[int] = []
        slots = asyncio.Semaphore(self.concurrency)
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)

        async with httpx.AsyncClient(timeout=self.request_timeout, limits=limits) as client:
            async def one(i: int) -> None:
                async with slots:
                    try:
                        results[i] = await self._post(client, bodies[i], labels[i])
                    except _ServerLost:
                        lost.append(i)
                        return
                if progress is not None:
                    progress(1)

            tasks = [asyncio.create_task(one(i)) for i in indices]
            try:
                await asyncio.gather(*tasks)
            except BaseException:
                # One failure (or Ctrl+C) ends the call: nothing stays in flight behind it.
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
        return sorted(lost)

    async def _post(self, client: httpx.AsyncClient, body: dict[str, Any], label: str) -> Generation:
        for attempt in range(CONNECTION_RETRIES + 1):
            url = self._next_url()  # a retry goes to the next server when attached to several
            try:
                response = await client.post(url + "/generate", json=body)
            except httpx.TimeoutException:
                self._check_server()
                raise RunError(f"{url}/generate gave no answer within {self.request_timeout:g} s "
                               "(CONFIG_SGLANG_REQUEST_TIMEOUT)") from None
            except httpx.TransportError as exc:
                self._check_server()
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 500:
                    return self._parse(url, response, label)
                self._check_server()
                problem = f"HTTP {response.status_code}: {_error_message(response)}"
            if attempt < CONNECTION_RETRIES:
                await asyncio.sleep(RETRY_BACKOFF * 2**attempt)
        self._check_server()
        raise RunError(f"{url}/generate failed {CONNECTION_RETRIES + 1} times; last: {problem}")

    def _check_server(self) -> None:
        if self.server is not None and not self.server.alive():
            raise _ServerLost

    @staticmethod
    def _parse(url: str, response: httpx.Response, label: str) -> Generation:
        if response.status_code != 200:
            raise RunError(f"{url}/generate refused {label} (HTTP {response.status_code}): "
                           f"{_error_message(response)}")
        try:
            data = response.json()
            return Generation(text=str(data["text"]),
                              completion_tokens=int(data["meta_info"]["completion_tokens"]))
        except (ValueError, KeyError, TypeError):
            raise RunError(f"{url}/generate answered {label} without text and meta_info.completion_tokens: "
                           f"{response.text[:200]}") from None

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

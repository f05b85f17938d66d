"""The production engine: SGLang's native `/generate`, one processor string for the
whole run, each request's deltas in `sampling_params.custom_params`.

Because the deltas travel with the request, a whole generation of individuals is in
flight at once and the server batches them. In launch mode the engine owns one server
for the run and restarts it only when it crashed, resending what was unfinished; in
attach mode it spreads requests over already running servers.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import httpx

from compressor_2.config.sglang import check_addresses
from compressor_2.engines.base import Generation, GenerationRequest, Progress
from compressor_2.engines.chat import encode_prompt
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
PROBE_DELTA = 1000.0  # far beyond any logit gap: the first token's cluster is forced


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
    """SGLang answers errors as {"error": {"message"}} or {"message"}; else the raw body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if "message" in body:
            return str(body["message"])
    return response.text[:300]


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
        # One string for the whole run: SGLang batches rows by the exact string.
        self.processor = processor_spec()
        self._next_url = itertools.cycle(self.urls).__next__
        self._encoded: dict[str, list[int]] = {}
        self._closed = False

    @classmethod
    def from_config(cls, config: Config, clusters: ClusterSet, tokenizer: Any = None) -> SGLangEngine:
        """Attach to CONFIG_SGLANG_URLS, or launch the one server of this run."""
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
            engine.check_steering()
            return engine
        server = SGLangServer(config)
        server.start()
        try:
            engine = cls((server.url,), clusters, encode, server=server,
                         max_restarts=config.sglang_max_restarts, **settings)
            engine.check_steering()
            return engine
        except BaseException:
            server.stop()
            raise

    def check_steering(self) -> None:
        """Fail before any work when a server ignores the deltas.

        A server that cannot import the processor or read the cluster map leaves the
        logits unchanged (the processor must never raise), which would make a whole
        evolution measure nothing. Two short probes per server, cluster 0 pushed up and
        then down, must therefore answer differently.
        """
        probes = []
        for sign in (1.0, -1.0):
            deltas = [0.0] * len(self.clusters.cluster_ids)
            deltas[0] = sign * PROBE_DELTA
            probes.append(self._body(GenerationRequest(PROBE_PROMPT, tuple(deltas)), max_new_tokens=2))
        with httpx.Client(timeout=self.request_timeout) as client:
            for url in self.urls:
                try:
                    up, down = (self._parse(url, client.post(url + "/generate", json=body))
                                for body in probes)
                except httpx.TransportError as exc:
                    # A processor string the server cannot load kills it (SGLang validates nothing).
                    server = self.server
                    died = f"; {server.failure_summary()}" if server and not server.alive() else ""
                    raise RunError(f"{url}/generate failed: {type(exc).__name__}: {exc}{died}") from None
                if up == down:
                    raise RunError(
                        f"{url} ignores the steering deltas (same answer with cluster 0 at "
                        f"+{PROBE_DELTA:g} and -{PROBE_DELTA:g}): the server must be able to import "
                        f"compressor_2 and read {self.clusters.token_clusters_path}; see its log"
                    )

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
        bodies = [self._body(request) for request in requests]
        results: list[Generation | None] = [None] * len(requests)
        pending = list(range(len(requests)))
        while pending:
            pending = asyncio.run(self._send_all(bodies, pending, results, progress))
            if pending:
                self._restart(len(pending))
        return [r for r in results if r is not None]

    def _body(self, request: GenerationRequest, max_new_tokens: int | None = None) -> dict[str, Any]:
        ids = self._encoded.get(request.prompt)
        if ids is None:
            ids = self._encoded[request.prompt] = self.encode(request.prompt)
        return {
            "input_ids": ids,
            "custom_logit_processor": self.processor,
            "sampling_params": {
                "temperature": self.temperature,
                "max_new_tokens": max_new_tokens or self.max_new_tokens,
                "custom_params": custom_params(request.deltas, self.clusters),
            },
        }

    async def _send_all(self, bodies: list[dict[str, Any]], indices: list[int],
                        results: list[Generation | None], progress: Progress | None) -> list[int]:
        """Sends `indices` with at most `concurrency` in flight; returns those a server crash lost."""
        lost: list[int] = []
        slots = asyncio.Semaphore(self.concurrency)
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)

        async with httpx.AsyncClient(timeout=self.request_timeout, limits=limits) as client:
            async def one(i: int) -> None:
                async with slots:
                    try:
                        results[i] = await self._post(client, bodies[i])
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

    async def _post(self, client: httpx.AsyncClient, body: dict[str, Any]) -> Generation:
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
                    return self._parse(url, response)
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
    def _parse(url: str, response: httpx.Response) -> Generation:
        if response.status_code != 200:
            raise RunError(f"{url}/generate refused the request (HTTP {response.status_code}): "
                           f"{_error_message(response)}")
        try:
            data = response.json()
            return Generation(text=str(data["text"]),
                              completion_tokens=int(data["meta_info"]["completion_tokens"]))
        except (ValueError, KeyError, TypeError):
            raise RunError(f"{url}/generate answered without text and meta_info.completion_tokens: "
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

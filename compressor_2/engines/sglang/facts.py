"""What an SGLang server says about itself, read before any work, and what it must be for
a run: no speculative decoding (its verification never calls the custom logit processor),
deterministic inference when CONFIG_SGLANG_DETERMINISTIC says so (the answer cache then
holds a genome's one answer), the model of CONFIG_MODEL_PATH, no preferred sampling field
a request leaves to the server, and the context every prompt must fit in; and what its
missing radix cache costs. An attached server must first pass its health check
(`check_attached`), and a router's workers are read one by one (`worker_facts`).

Read from `/server_info` and `/model_info` (their `/get_*` names on older servers) and
`/v1/models`, as SGLang 0.5.23 answers them. SGLang's router (sglang-router) has none of
these: its `/get_server_info` says `{"router_manager": true}`, and its `/workers` lists
the workers it routes to, whose own facts are read instead.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from compressor_2.common import ConfigError, RunError
from compressor_2.config import SGLangSettings, check_served_model
from compressor_2.engines.sglang.api import NOT_ON_COMPLETIONS

logger = logging.getLogger(__name__)

# SGLang 0.5.23's RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND: on any other backend its
# deterministic inference turns the radix cache off.
RADIX_DETERMINISTIC_BACKENDS = ("ascend", "fa3", "fa4", "triton")
# Every /generate sampling field that changes an answer besides temperature, max_new_tokens
# and custom_params, at SGLang's neutral value. SGLang fills a field a request leaves out
# from the server's --preferred-sampling-params, so every request states all of these.
STATED_SAMPLING: dict[str, Any] = {
    "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
    "repetition_penalty": 1.0, "min_new_tokens": 0, "ignore_eos": False, "stop": None,
    "stop_token_ids": None, "no_stop_trim": False, "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
}
# Sampling fields that change an answer but that requests leave out (newer fields an older
# server would refuse, or ones that are off unless set), with their neutral value: a server
# whose preferred sampling params set one to anything else is refused.
UNSTATED_SAMPLING: dict[str, Any] = {
    "stop_regex": None, "n": 1, "json_schema": None, "regex": None, "ebnf": None, "structural_tag": None,
    "logit_bias": {}, "beam_width": None, "watermark": None,
}


def unstated_sampling(api: str) -> dict[str, Any]:
    """The fields a server may not prefer on request path `api`: /v1/completions cannot
    state the ones its CompletionRequest lacks."""
    if api == "completions":
        return {**UNSTATED_SAMPLING, **{name: STATED_SAMPLING[name] for name in NOT_ON_COMPLETIONS}}
    return UNSTATED_SAMPLING


@dataclass(frozen=True)
class ServerFacts:
    url: str
    model_path: str
    speculative_algorithm: str | None
    deterministic: bool
    custom_processor: bool
    context: int | None  # tokens a prompt and its answer share; None when the server does not say
    preferred_sampling_params: dict[str, Any]
    radix_cache: bool = True  # prompts' shared prefixes are prefilled once, not per request
    attention_backend: str | None = None


class Unreachable(RunError):
    """No connection to the server (refused, reset, timed out)."""


def _get(client: httpx.Client, url: str, paths: tuple[str, ...]) -> dict[str, Any] | None:
    """The JSON object the first of `paths` answers, None when none exists (404)."""
    for path in paths:
        try:
            response = client.get(url + path)
        except httpx.TransportError as exc:
            raise Unreachable(f"{url}{path} failed: {type(exc).__name__}: {exc}") from None
        if response.status_code == 404:
            continue
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code != 200 or not isinstance(body, dict):
            raise RunError(f"{url}{path} answered HTTP {response.status_code}: {response.text[:200]}")
        return body
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _context(server: dict[str, Any], models: dict[str, Any] | None) -> int | None:
    """The served context: /v1/models' max_model_len (the effective one; server_info's
    context_length is null unless --context-length was given), bounded by the KV cache."""
    cards = (models or {}).get("data")
    lengths = [_int(card.get("max_model_len")) for card in cards if isinstance(card, dict)
               and not card.get("parent")] if isinstance(cards, list) else []
    context = next((n for n in lengths if n is not None), None) or _int(server.get("context_length"))
    kv_tokens = _int(server.get("max_total_num_tokens"))
    return min(context, kv_tokens) if context is not None and kv_tokens is not None else context


def _preferred(value: Any) -> dict[str, Any]:
    """--preferred-sampling-params as SGLang keeps it: a JSON string, or already a dict."""
    if isinstance(value, str) and value.strip():
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class Router:
    """An SGLang router (sglang-router) and the worker URLs it routes to."""

    url: str
    workers: tuple[str, ...]


def read_server(client: httpx.Client, url: str) -> ServerFacts | Router:
    """What `url` is: an SGLang server and its facts, or a router and its workers."""
    server = _get(client, url, ("/server_info", "/get_server_info"))
    if server is None:
        raise ConfigError(
            f"{url} answers neither /server_info nor /get_server_info, so nothing can check that it "
            "steers every token: attach to SGLang servers or to SGLang's router, not another proxy")
    if server.get("router_manager") is True:
        return Router(url, _router_workers(client, url))
    return _facts(client, url, server)


def _router_workers(client: httpx.Client, url: str) -> tuple[str, ...]:
    """The workers of a router that says it is ready (one healthy worker at least)."""
    try:
        ready = client.get(url + "/readiness")
    except httpx.TransportError as exc:
        raise RunError(f"{url}/readiness failed: {type(exc).__name__}: {exc}") from None
    if ready.status_code != 200:
        raise RunError(f"{url} is an SGLang router that is not ready (HTTP {ready.status_code} from "
                       f"/readiness: {ready.text[:200]}): start its workers, or wait for its health checks")
    listed = (_get(client, url, ("/workers",)) or {}).get("workers")
    try:
        workers = tuple(str(worker["url"]).rstrip("/") for worker in listed)  # type: ignore[union-attr]
    except (TypeError, KeyError):
        raise RunError(f"{url}/workers does not list workers as SGLang's router does: {listed!r:.200}") from None
    if not workers:
        raise RunError(f"{url} is an SGLang router without workers: start it with --worker-urls")
    return workers


def _facts(client: httpx.Client, url: str, server: dict[str, Any]) -> ServerFacts:
    model = _get(client, url, ("/model_info", "/get_model_info")) or {}
    return ServerFacts(
        url=url,
        model_path=str(model.get("model_path") or server.get("model_path") or ""),
        speculative_algorithm=server.get("speculative_algorithm"),
        deterministic=server.get("enable_deterministic_inference") is True,
        custom_processor=server.get("enable_custom_logit_processor") is not False,
        context=_context(server, _get(client, url, ("/v1/models",))),
        preferred_sampling_params=_preferred(model.get("preferred_sampling_params",
                                                       server.get("preferred_sampling_params"))),
        radix_cache=server.get("disable_radix_cache") is not True,
        attention_backend=server.get("attention_backend"),
    )


def check_facts(facts: ServerFacts, config: SGLangSettings, api: str) -> None:
    """Refuse (exit 2) a server that would silently stop or skew the steering of requests on
    path `api`, and, with CONFIG_SGLANG_DETERMINISTIC=y, one whose greedy answers depend on
    batching (with n, such a server is accepted without a word)."""
    url = facts.url
    algorithm = facts.speculative_algorithm
    if algorithm is not None and str(algorithm).strip().upper() not in ("", "NONE"):
        raise ConfigError(
            f"{url} runs speculative decoding ({algorithm}): its verification never calls the custom "
            "logit processor, so every token after an answer's first would go unsteered; restart it "
            "without the --speculative-* flags")
    if not facts.custom_processor:
        raise ConfigError(f"{url} runs without --enable-custom-logit-processor, so it refuses every "
                          "steered request; restart it with that flag (on a loopback address)")
    check_served_model(facts.model_path, config, f"{url} serves")
    preferred = sorted(name for name, neutral in unstated_sampling(api).items()
                       if facts.preferred_sampling_params.get(name) not in (None, neutral))
    if preferred:
        raise ConfigError(
            f"{url} has --preferred-sampling-params setting {', '.join(preferred)}, which every request of "
            "this run would inherit and be answered under; restart it without them")
    if config.sglang_deterministic and not facts.deterministic:
        raise ConfigError(
            f"{url} runs without --enable-deterministic-inference but CONFIG_SGLANG_DETERMINISTIC=y: its greedy "
            "answers depend on what each request is batched with, and the answer cache would keep one draw of "
            "several as a genome's answer; restart it with --enable-deterministic-inference, or set "
            "CONFIG_SGLANG_DETERMINISTIC=n to accept that")


def radix_warning(facts: ServerFacts, prompt_tokens: list[int]) -> str | None:
    """What a server without the radix cache costs: every request prefills its whole prompt,
    where the cache prefills a prompt once for every genome that asks it. None with a cache."""
    if facts.radix_cache:
        return None
    why = (f"deterministic inference on the {facts.attention_backend} attention backend turns it off (SGLang's "
           "fallback on SM100/SM120 GPUs); --attention-backend triton keeps it"
           if facts.deterministic and facts.attention_backend not in RADIX_DETERMINISTIC_BACKENDS else
           "it runs with --disable-radix-cache")
    mean = sum(prompt_tokens) / len(prompt_tokens) if prompt_tokens else 0
    return (f"warning: {facts.url} has no radix cache ({why}): every request prefills its whole prompt again, "
            f"{mean:,.0f} tokens on average over the run's {len(prompt_tokens)} prompts, for every genome, where "
            "the cache would prefill each prompt once for the whole run")


def answer_room(prompt_tokens: int, context: int) -> int:
    """The most tokens SGLang lets an answer to a `prompt_tokens` prompt reach, 0 when it refuses
    the prompt. Its scheduler cuts max_new_tokens to max_req_len - prompt - 1 WITHOUT an error,
    where max_req_len = context - 1, and refuses a prompt of max_req_len - 5 tokens or more."""
    max_req_len = context - 1
    if prompt_tokens >= max_req_len - 5:
        return 0
    return max_req_len - prompt_tokens - 1


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


def worker_facts(client: httpx.Client, router: str, worker: str) -> ServerFacts | None:
    """What the router's worker is, asked directly (a router forwards no /server_info);
    None, with a warning, for a worker that cannot be reached: the router fails over from
    a dead worker, and a run goes on through the others."""
    try:
        found = read_server(client, worker)
    except Unreachable as exc:
        logger.warning("warning: the router at %s routes to %s, which cannot be reached (%s): it is left "
                       "unchecked and unprobed; if it comes back, the router sends it requests nothing here "
                       "checked (remove it from the router, or restart the run once it is back)", router, worker,
                       exc)
        return None
    if isinstance(found, Router):
        raise ConfigError(f"the router at {router} routes to {worker}, another router: give it the "
                          "SGLang servers themselves")
    return found

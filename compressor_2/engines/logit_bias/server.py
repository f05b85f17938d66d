"""What the logit_bias engine asks of a server before any work: the model it serves (its
`/v1/models`), and the probe that it applies `logit_bias` and ends answers where the
transformers engine does.

The probe is three greedy requests of at most PROBE_TOKENS tokens on PROBE_PROMPT: the
answer unsteered; the answer with the probe's cluster pushed up by PROBE_BIAS and every
other steered token down by it, a map as wide as any run's (a server that caps or refuses
large maps fails here, before any work); and the answer with the end tokens (cluster 0)
pushed up and every other token down. The second must differ from the first; the third
must end at its first token. How many tokens the server counted for that empty answer
(0 or 1) says whether its `usage.completion_tokens` counts the end token: llama-cpp-python's
server leaves it out, SGLang, vLLM and llama.cpp's llama-server count it, as the
transformers engine does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from compressor_2.common import RunError, shown

PROBE_PROMPT = "Hello"
# vLLM clamps every bias to [-100, 100] (OpenAI's range): within it, a bias this large
# still outweighs any real logit gap.
PROBE_BIAS = 100.0
PROBE_TOKENS = 8
MODELS_PATH = "/v1/models"


@dataclass(frozen=True)
class Served:
    """The model name requests must carry, and the context the server says it has (None
    when it does not say: llama.cpp's servers)."""

    name: str
    context: int | None


def served_model(client: httpx.Client, url: str, model_path: str) -> Served:
    """The model `url` serves, by its `/v1/models`: the only one listed, or the one named
    as CONFIG_MODEL_PATH (or its file or folder name) among several; refused in one line
    otherwise."""
    where = url + MODELS_PATH
    try:
        response = client.get(where)
    except httpx.HTTPError as exc:
        raise RunError(f"{where} cannot be reached ({type(exc).__name__}: {exc}): start the server, or set "
                       "CONFIG_LOGIT_BIAS_URL to its address") from None
    try:
        models = response.json()["data"] if response.status_code == 200 else None
        listed = [m for m in models if isinstance(m, dict) and isinstance(m.get("id"), str)]
    except (ValueError, KeyError, TypeError):
        listed = None
    if not listed:
        raise RunError(f"{where} answered HTTP {response.status_code} {shown(response.text, 200)}, not an "
                       "OpenAI-compatible list of models: is CONFIG_LOGIT_BIAS_URL an OpenAI-compatible server "
                       "(without /v1)?")
    names = {model_path, Path(model_path).name, Path(model_path).stem}
    chosen = listed[0] if len(listed) == 1 else next((m for m in listed if m["id"] in names), None)
    if chosen is None:
        ids = ", ".join(m["id"] for m in listed)
        raise RunError(f"{url} serves several models ({ids}) and none is named as CONFIG_MODEL_PATH="
                       f"{model_path!r}: serve that model alone, or under that name")
    context = chosen.get("max_model_len")
    return Served(chosen["id"], context if isinstance(context, int) and context > 0 else None)


def probe_cluster(token_clusters: np.ndarray, clusters: int) -> int:
    """The smallest cluster other than the end tokens' (0) that has tokens: the least likely
    to be chosen unsteered."""
    counts = np.bincount(token_clusters[token_clusters >= 0], minlength=clusters)[:clusters]
    counts[0] = 0
    if not counts.any():
        raise RunError("the clusters hold no token outside cluster 0 (the end tokens): rebuild them")
    return int(np.argmin(np.where(counts > 0, counts, np.iinfo(counts.dtype).max)))


def probe_deltas(clusters: int, pushed: int) -> tuple[float, ...]:
    """Cluster `pushed` at +PROBE_BIAS, every other cluster at -PROBE_BIAS."""
    return tuple(PROBE_BIAS if k == pushed else -PROBE_BIAS for k in range(clusters))


@dataclass(frozen=True)
class ProbeAnswer:
    text: str
    completion_tokens: int
    finish_reason: str | None


def check_applied(url: str, unsteered: ProbeAnswer, steered: ProbeAnswer, cluster: str, width: int) -> None:
    """RunError naming `url` when a map that forces cluster `cluster` left the answer as it was."""
    if steered.text != unsteered.text:
        return
    raise RunError(f"{url} ignores logit_bias: a map of {width:,} tokens pushing cluster {cluster} to "
                   f"+{PROBE_BIAS:g} and every other token to -{PROBE_BIAS:g} left the probe's answer as it was "
                   f"({shown(steered.text, 80)}); serve the model with a server that applies logit_bias on "
                   "/v1/completions (llama.cpp's llama-server or llama-cpp-python's server, vLLM, SGLang)")


def counts_end_token(url: str, ended: ProbeAnswer) -> bool:
    """Whether `url`'s usage counts the end token, from the answer the end tokens forced to
    end at once; RunError when it did not end there."""
    if ended.text == "" and ended.finish_reason == "stop" and ended.completion_tokens in (0, 1):
        return ended.completion_tokens == 1
    raise RunError(f"{url} did not end the probe's answer at its first token when every end token (cluster 0) was "
                   f"pushed to +{PROBE_BIAS:g} ({ended.completion_tokens} tokens, finish_reason "
                   f"{ended.finish_reason!r}, text {shown(ended.text, 80)}): it does not stop at the tokens the "
                   "transformers engine stops at (stop_token_ids ignored?), so its answers would run on past them")


def end_ids(token_clusters: np.ndarray) -> Sequence[int]:
    """The tokens that end an answer, as in the other engines: every token of cluster 0."""
    return np.flatnonzero(np.asarray(token_clusters) == 0).tolist()


def reply_fields(data: Any) -> ProbeAnswer:
    """An OpenAI completion's text, completion token count and finish reason; KeyError,
    TypeError or ValueError when it is malformed."""
    choice = data["choices"][0]
    return ProbeAnswer(str(choice["text"]), int(data["usage"]["completion_tokens"]), choice.get("finish_reason"))

"""The steering probe's parts (`SGLangEngine.check_steering` runs it): its request, the
cluster it pushes, its verdict on the tokens a server answered, and the refusals that name
what drops the deltas and what fixes it. Each probe is two greedy requests of PROBE_TOKENS
tokens (ignore_eos) that push the smallest cluster to +PROBE_DELTA and then -PROBE_DELTA:
every token of the first must come from that cluster, and no token of the second."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from compressor_2.common import RunError

if TYPE_CHECKING:
    from compressor_2.clusters.clusterset import ClusterSet
    from compressor_2.engines.sglang.server import SGLangServer

PROBE_PROMPT = "Hello"
PROBE_DELTA = 1000.0  # far beyond any logit gap: every token's cluster is forced
# Enough tokens that a server steering only an answer's first one (speculative decoding)
# cannot pass by chance: each later token would have to fall in the probe's cluster too.
PROBE_TOKENS = 8


def probe_cluster(clusters: ClusterSet) -> int:
    """The smallest cluster that has tokens: the least likely to be chosen unsteered."""
    mapped = clusters.token_clusters[clusters.token_clusters >= 0]  # unsteered tokens: none
    counts = np.bincount(mapped, minlength=len(clusters.cluster_ids))
    sizes = np.where(counts > 0, counts, np.iinfo(counts.dtype).max)
    return int(np.argmin(sizes[: len(clusters.cluster_ids)]))


def check_steered(url: str, up: Sequence[int], down: Sequence[int], members: set[int], refusal: str) -> None:
    """RunError(`refusal`) unless the probe's cluster decided every token `url` answered:
    all of them at +PROBE_DELTA (`up`), none at -PROBE_DELTA (`down`)."""
    outside = sum(token not in members for token in up)
    if not outside and not any(token in members for token in down):
        return
    if up[0] in members and down[0] not in members:
        raise RunError(
            f"{url} steers only the first token of an answer ({outside} of {len(up)} probe tokens escaped "
            f"the probe's cluster at +{PROBE_DELTA:g}): speculative decoding? its verification never calls "
            "the custom logit processor; restart the server without --speculative-* flags")
    raise RunError(refusal)


def cannot_import(url: str, server: SGLangServer | None, api: str) -> str:
    """The refusal of a server that failed the guarded probe: what it needs."""
    what = (f"{url} cannot load compressor_2's steering processor: the probe's string, which loads on any SGLang "
            "server, steered nothing there, so the server's Python cannot import compressor_2 (the run's own "
            "string, by reference, would have killed the server)")
    if server is not None:
        return (f"{what}; CONFIG_SGLANG_COMMAND runs {server.command[0]}: start it with python (the "
                "interpreter that runs compressor_2), or install compressor_2 into that interpreter")
    proxy = ("; or a router or proxy in front of it drops custom_params (attach to the server itself)"
             if api == "generate" else "")
    return (f"{what}. Install this compressor_2 into the Python environment the server runs in (with that "
            f"environment's pip: pip install --no-deps <this checkout>) and restart the server{proxy}")


def ignored(url: str, cluster: str, router: bool, api: str, token_clusters: Path) -> str:
    """The probe's refusal of `url` (a `router`, whose workers passed the same probe, or a
    server), naming what can drop the deltas and what fixes it."""
    what = (f"{url} ignores the steering deltas (cluster {cluster} at +{PROBE_DELTA:g} and "
            f"-{PROBE_DELTA:g} does not decide the probe's tokens)")
    if router:
        if api == "generate":
            return (f"{what}, while the workers it routes to steer: it is an SGLang router, which drops "
                    "sampling_params.custom_params from /generate (sglang-router 0.3.2 does); set "
                    "CONFIG_SGLANG_API=completions (or auto), which sends them at the top level of "
                    "/v1/completions")
        return (f"{what}, while the workers it routes to steer: this router drops custom_params from "
                "/v1/completions; list its workers in CONFIG_SGLANG_URLS instead")
    return (f"{what}, although it steers with the map sent inside the request: it cannot read "
            f"{token_clusters}, or that file now holds other clusters (see its log); a "
            "server on another machine needs CONFIG_CLUSTER_DIR copied to the same absolute path there")

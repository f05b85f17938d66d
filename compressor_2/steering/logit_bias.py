"""Deltas as a standard `logit_bias` map: {token id as a string: bias}, the field that
llama.cpp's server, vLLM and SGLang's OpenAI-compatible APIs take per request.

A delta vector steers every token of a cluster by the cluster's delta (steering/bias.py);
expanded through the cluster map it is one bias per token. The map holds only the tokens
whose bias is not zero: a cluster at 0 adds nothing, and an unsteered token (a special or
added token no delta may move) is never in it. The logits a server adds it to are the
same ones the transformers engine adds `bias_matrix` to, so the same deltas steer the
same way wherever the arithmetic is float32.

A map is static: deltas that change with the answer's phase cannot be one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from compressor_2.clusters.clusterset import ClusterSet, cluster_map_digest
from compressor_2.common import ConfigError, atomic_write_text, check_readable_file, shown
from compressor_2.deltas import (
    PHASES_KEY,
    check_map_digest,
    load_deltas,
    recorded_map_digest,
    sidecar_path,
    to_list,
    write_sidecar,
)

PHASES_REFUSAL = ("holds deltas by answer phase ({count} phases), and a logit_bias map is static: it cannot "
                  "change with the answer's phase. Export a one-phase run's candidate (CONFIG_DELTA_PHASES=1)")


def logit_bias(deltas: Sequence[float], token_clusters: np.ndarray) -> dict[str, float]:
    """{str(token id): bias} for every steered token whose cluster's delta is not 0, in
    token order. `deltas`: one per cluster, in canonical order. The biases are the deltas
    in float32, the precision the engines add them to the logits in."""
    values = np.asarray(deltas, dtype=np.float32)
    token_clusters = np.asarray(token_clusters)
    steered = np.flatnonzero(token_clusters >= 0)
    biases = values[token_clusters[steered]]
    keep = biases != 0
    return dict(zip(map(str, steered[keep].tolist()), biases[keep].tolist()))


def bias_json(bias: Mapping[str, float]) -> str:
    """The map as compact JSON, each bias in the fewest digits that read back as the same
    float32 (a dense map takes about 70% of the bytes it takes with float64 digits): a
    server parsing it to float32 adds exactly the bias the transformers engine adds."""
    values = np.asarray(list(bias.values()), dtype=np.float32).astype(str).tolist()
    return "{" + ",".join(f'"{key}":{value}' for key, value in zip(bias, values)) + "}"


def touched(deltas: Sequence[float], token_clusters: np.ndarray) -> int:
    """How many tokens the map of `deltas` holds."""
    token_clusters = np.asarray(token_clusters)
    steered = token_clusters[token_clusters >= 0]
    return int(np.count_nonzero(np.asarray(deltas, dtype=np.float64)[steered]))


def refuse_phases(deltas: Mapping[str, object], source: str) -> None:
    """One line when `deltas` hold several phases: a file's "phases" key, or a genome's
    "phase:cluster" ids. No map expresses them."""
    if PHASES_KEY in deltas:
        phases = deltas[PHASES_KEY]
        count: object = len(phases) if isinstance(phases, list) else shown(phases)
    else:
        count = len({key.split(":", 1)[0] for key in deltas if ":" in key})
        if not count:
            return
    raise ConfigError(f"{source} " + PHASES_REFUSAL.format(count=count))


def write_logit_bias(path: Path, bias: Mapping[str, float], digest: str) -> None:
    """The map as a JSON object, and beside it the cluster map's digest in the sidecar that
    deltas files have (`<stem>.clusters.json`), written last: a map without one is unchecked."""
    atomic_write_text(path, bias_json(bias) + "\n")
    write_sidecar(path, digest)


def read_logit_bias(path: Path, digest: str, vocab: int) -> dict[str, float]:
    """A written map, refused in one line when its sidecar records other clusters than
    `digest` (the same token ids would not be the ones the deltas steer), when it has no
    sidecar, or when it is not {token id < vocab: finite number}."""
    check_readable_file(path, "logit_bias file")
    if recorded_map_digest(path, "export it again") is None:
        raise ConfigError(f"'{path}' has no {sidecar_path(path).name} beside it, so the clusters it was "
                          "expanded through are unknown: export it again")
    check_map_digest(path, digest, force=False, override="export it again for the current clusters")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"logit_bias file '{path}' cannot be read as JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"logit_bias file '{path}' must hold a JSON object {{token id: bias}}")
    for key, value in raw.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)
        if not (key.isdigit() and int(key) < vocab and number):
            raise ConfigError(f"logit_bias file '{path}': {shown(key)}: {shown(value)} is not a token id below "
                              f"{vocab} with a finite bias")
    return {key: float(value) for key, value in raw.items()}


def deltas_file_phases(deltas_path: Path) -> None:
    """Refuses, in one line, a deltas file that holds several phases."""
    try:
        raw = json.loads(deltas_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return  # load_deltas names what is wrong with it
    if isinstance(raw, dict):
        refuse_phases(raw, f"deltas file '{deltas_path}'")


def export_logit_bias(clusters: ClusterSet, deltas_path: Path, out: Path, force: bool = False) -> str:
    """Writes the map of the deltas in `deltas_path` over `clusters` to `out` (with its
    sidecar); deltas recorded for other clusters are refused unless `force`, as the
    processor's are. Returns what was written, in a line."""
    deltas_file_phases(deltas_path)
    digest = cluster_map_digest(clusters)
    check_map_digest(deltas_path, digest, force)
    deltas = to_list(load_deltas(deltas_path, clusters.cluster_ids))
    bias = logit_bias(deltas, clusters.token_clusters)
    write_logit_bias(out, bias, digest)
    size = len(bias_json(bias))
    return (f"wrote {out}: {len(bias):,} of {len(clusters.token_clusters):,} tokens biased ({size:,} bytes of JSON), "
            f"the cluster map's digest in {sidecar_path(out).name}")

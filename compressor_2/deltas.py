"""Delta sets: JSON {cluster id: float} <-> lists in canonical order, validated against the clusters,
and the one bound on every delta.

`DELTA_BOUND` holds for every delta a run steers with: a delta vector a user gives (initial
deltas, a `--deltas` file) is refused beyond it, naming the file and the cluster; a value a
strategy proposes (a reflector's reply, a random or CMA-ES draw) is clamped to it where it is
proposed. Crossover and merges need neither: a fitness-weighted average with non-negative
weights, or a choice of components, of bounded parents is bounded (the average is clamped
all the same, against the last bit of rounding).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from compressor_2.common import ConfigError, as_float, check_readable_file, shown

Deltas = dict[str, float]


def canonical_ids(ids: Iterable[str]) -> list[str]:
    """Seed 000 §1: numeric order of the cluster ids."""
    return sorted(ids, key=int)


# Logit units. Beyond this a cluster is already forced in or out against any real logit gap,
# and the further a vector pushes every cluster down, the more the logit columns past the
# tokenizer (a model's untrained padding rows, which always get bias 0) rise above real
# tokens: with the bound they gain at most DELTA_BOUND on them.
DELTA_BOUND = 30.0


def clamp(value: float) -> float:
    """`value` within [-DELTA_BOUND, DELTA_BOUND]."""
    return min(max(float(value), -DELTA_BOUND), DELTA_BOUND)


def clamp_rows(rows: Iterable[Iterable[float]]) -> list[list[float]]:
    """Every delta of every proposed vector within the bound."""
    return [[clamp(value) for value in row] for row in rows]


def check_bound(deltas: Mapping[str, float], source: str) -> Deltas:
    """Refuses, naming `source` and the cluster, a user-given delta beyond DELTA_BOUND."""
    for cid in canonical_ids(deltas):
        if abs(deltas[cid]) > DELTA_BOUND:
            raise ConfigError(f"{source}: delta of cluster {cid} is {deltas[cid]:g}, outside "
                              f"[-{DELTA_BOUND:g}, {DELTA_BOUND:g}], the bound on every delta")
    return dict(deltas)


def validate_deltas(deltas: Mapping[str, object], expected_ids: Iterable[str], source: str) -> Deltas:
    """Exactly the expected ids, each a finite number; the error names the id that is off."""
    expected = set(expected_ids)
    missing = expected - set(deltas)
    extra = set(deltas) - expected
    if missing:
        raise ConfigError(f"{source}: cluster id(s) {', '.join(canonical_ids(missing))} missing")
    if extra:
        names = ", ".join(sorted(map(str, extra)))
        raise ConfigError(f"{source}: unknown cluster id(s) {names} (not in the cluster descriptions)")
    checked: Deltas = {}
    for cid in canonical_ids(expected):
        value = as_float(deltas[cid])
        if value is None:
            raise ConfigError(f"{source}: delta of cluster {cid} is {shown(deltas[cid])}, not a finite number")
        checked[cid] = value
    return checked


def load_deltas(path: str | Path, expected_ids: Iterable[str]) -> Deltas:
    path = Path(path)
    check_readable_file(path, "deltas file")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"deltas file '{path}' not found") from None
    except OSError as exc:
        raise ConfigError(f"deltas file '{path}' cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"deltas file '{path}' is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"deltas file '{path}' is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"deltas file '{path}' must hold a JSON object {{cluster id: float}}")
    return check_bound(validate_deltas(raw, expected_ids, str(path)), str(path))


def to_list(deltas: Mapping[str, float]) -> list[float]:
    return [float(deltas[cid]) for cid in canonical_ids(deltas)]


def to_dict(values: Sequence[float], ids: Sequence[str]) -> Deltas:
    """`ids` must already be in canonical order."""
    if len(values) != len(ids):
        raise ValueError(f"{len(values)} deltas for {len(ids)} clusters")
    return {cid: float(v) for cid, v in zip(ids, values)}


def fingerprint_path(deltas_path: Path) -> Path:
    """The sidecar that records which clusters a deltas file was made for: the deltas file
    itself stays a plain {cluster id: float} map."""
    return deltas_path.with_name(deltas_path.stem + ".clusters.json")


def write_fingerprint(deltas_path: Path, fingerprint: str) -> None:
    """`fingerprint`: the clusters' `cluster_map_digest`."""
    from compressor_2.common import atomic_write_json

    atomic_write_json(fingerprint_path(deltas_path), {"cluster_map": fingerprint})


def recorded_fingerprint(deltas_path: Path, override: str = "pass --force") -> str | None:
    """The clusters' digest the sidecar of `deltas_path` records, None without a sidecar;
    a sidecar that is unreadable or malformed is refused, naming `override`."""
    sidecar = fingerprint_path(deltas_path)
    if not sidecar.is_file():
        return None
    try:
        record = json.loads(sidecar.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"'{sidecar}' cannot be read ({exc}); remove it, or {override}") from None
    if not isinstance(record, dict) or "cluster_map" not in record:
        raise ConfigError(f"'{sidecar}' holds {shown(record)}, not {{\"cluster_map\": <digest>}}; remove it, "
                          f"or {override}")
    recorded = record["cluster_map"]
    if not isinstance(recorded, str) or not recorded:
        raise ConfigError(f"'{sidecar}': cluster_map is {shown(recorded)}, not the digest of a cluster map; "
                          f"remove it, or {override}")
    return recorded


def check_fingerprint(deltas_path: Path, fingerprint: str, force: bool, override: str = "pass --force") -> None:
    """Refuses deltas recorded for other clusters than `fingerprint` (unless `force`): the
    same cluster ids would steer other tokens. A file without a record is not checked.
    `override`: how the caller's user uses such deltas anyway."""
    if force:
        return
    recorded = recorded_fingerprint(deltas_path, override)
    if recorded is None:
        return
    sidecar = fingerprint_path(deltas_path)
    if recorded != fingerprint:
        raise ConfigError(f"'{deltas_path}' was made for clusters {recorded[:12]} ({sidecar.name} says so), but the "
                          f"current clusters are {fingerprint[:12]}: the same ids would steer other tokens. Build the "
                          "clusters it was made for (the same model, CONFIG_NUM_CLUSTERS, CONFIG_PCA_COMPONENTS and "
                          f"CONFIG_CLUSTER_SEED), or {override}")

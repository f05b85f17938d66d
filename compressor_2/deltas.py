"""Delta sets: JSON {cluster id: float} <-> lists in canonical order, validated against the clusters."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from compressor_2.errors import ConfigError
from compressor_2.json_values import as_float, shown

Deltas = dict[str, float]


def canonical_ids(ids: Iterable[str]) -> list[str]:
    """Seed 000 §1: numeric order of the cluster ids."""
    return sorted(ids, key=int)


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
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"deltas file '{path}' not found") from None
    except IsADirectoryError:
        raise ConfigError(f"deltas file '{path}' is a directory: name the JSON file itself") from None
    except OSError as exc:
        raise ConfigError(f"deltas file '{path}' cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"deltas file '{path}' is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"deltas file '{path}' is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"deltas file '{path}' must hold a JSON object {{cluster id: float}}")
    return validate_deltas(raw, expected_ids, str(path))


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
    from compressor_2.atomic import atomic_write_json

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

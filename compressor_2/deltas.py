"""Delta sets: JSON {cluster id: float} <-> lists in canonical order, validated against the clusters,
and the one bound on every delta.

With CONFIG_DELTA_PHASES = P > 1 a genome holds one delta per (answer phase, cluster): its ids
are "phase:cluster" ("1:0" is cluster 0 in phase 1), in canonical order phase-major, which is
the order of the P*K floats an engine is handed. A deltas file then holds {"phases":
[{cluster id: float}, ...]}, one map per phase; one phase keeps the plain map (a one-phase
run never writes "phases"). A plain map given where P > 1 phases are asked for is the same
vector in every phase: that is exactly what a one-phase vector steers with.

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
PHASES_KEY = "phases"  # a deltas file's one key when it holds several answer phases
MAX_PHASES = 3  # CONFIG_DELTA_PHASES' range


def canonical_ids(ids: Iterable[str]) -> list[str]:
    """Numeric order of the cluster ids (the canonical order); genome ids of several phases phase-major."""
    return sorted(ids, key=_order)


def _order(gene: str) -> tuple[int, int]:
    phase, cid = split_gene(gene)
    return phase, int(cid)


def gene_ids(cluster_ids: Sequence[str], phases: int) -> list[str]:
    """A genome's ids in canonical order: the cluster ids for one phase; for more, one
    "phase:cluster" id per pair, phase-major."""
    if phases == 1:
        return list(cluster_ids)
    return [f"{phase}:{cid}" for phase in range(phases) for cid in cluster_ids]


def split_gene(gene: str) -> tuple[int, str]:
    """(phase, cluster id) of a genome id; a bare cluster id is phase 0."""
    phase, _, cid = gene.rpartition(":")
    return (int(phase) if phase else 0), cid


def visiting_order(genes: Sequence[str]) -> list[str]:
    """The genome's ids in the order a round robin over single-delta moves visits them:
    cluster by cluster, each in every phase back to back (EOS in every phase first), so
    that the phases of one cluster are tried together rather than K moves apart. With one
    phase, the canonical order."""
    return sorted(genes, key=lambda gene: _order(gene)[::-1])


def phase_count(genes: Iterable[str]) -> int:
    """How many answer phases a genome's ids span."""
    return max((split_gene(gene)[0] for gene in genes), default=0) + 1


def by_phase(deltas: Mapping[str, float]) -> list[Deltas]:
    """A genome (canonical order) as one {cluster id: delta} map per answer phase."""
    maps: list[Deltas] = [{} for _ in range(phase_count(deltas))]
    for gene, value in deltas.items():
        phase, cid = split_gene(gene)
        maps[phase][cid] = value
    return maps


def deltas_document(deltas: Mapping[str, float]) -> dict[str, object]:
    """What a deltas file holds for a genome (canonical order): the plain {cluster id: float}
    map of one phase, or {"phases": [{cluster id: float}, ...]}."""
    maps = by_phase(deltas)
    return dict(maps[0]) if len(maps) == 1 else {PHASES_KEY: maps}


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


def load_deltas(path: str | Path, expected_ids: Iterable[str], phases: int | None = 1) -> Deltas:
    """The genome a deltas file holds over the clusters `expected_ids`, for `phases` answer
    phases (None: as many as the file holds), refusing in one line naming the file."""
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
    expected = list(expected_ids)
    if PHASES_KEY not in raw:
        plain = check_bound(validate_deltas(raw, expected, str(path)), str(path))
        return _genome([plain] * (phases or 1))
    maps = _phase_maps(raw, path)
    if phases is not None and len(maps) != phases:
        wanted = "a plain {cluster id: float} map" if phases == 1 else f"deltas for {phases} phases"
        raise ConfigError(f"deltas file '{path}' holds deltas for {len(maps)} answer phases, but CONFIG_DELTA_PHASES "
                          f"is {phases}: set it to {len(maps)}, or give {wanted}")
    return _genome([check_bound(validate_deltas(m, expected, f"{path} phase {p}"), f"{path} phase {p}")
                    for p, m in enumerate(maps)])


def _phase_maps(raw: Mapping[str, object], path: Path) -> list[Mapping[str, object]]:
    """The per-phase maps of a file's {"phases": [...]}: 2 to MAX_PHASES JSON objects."""
    maps = raw[PHASES_KEY]
    if set(raw) != {PHASES_KEY}:
        others = ", ".join(sorted(set(raw) - {PHASES_KEY}))
        raise ConfigError(f"deltas file '{path}' holds \"{PHASES_KEY}\" and other keys ({others}): a file holds either "
                          f"{{cluster id: float}} or {{\"{PHASES_KEY}\": [{{cluster id: float}}, ...]}}")
    if not isinstance(maps, list) or not all(isinstance(m, dict) for m in maps) \
            or not 2 <= len(maps) <= MAX_PHASES:
        raise ConfigError(f"deltas file '{path}': \"{PHASES_KEY}\" is {shown(maps)}, not a list of 2 to {MAX_PHASES} "
                          "JSON objects {cluster id: float} (one phase is written as the plain map)")
    return maps


def _genome(maps: Sequence[Mapping[str, float]]) -> Deltas:
    """One validated map per phase -> the genome over `gene_ids`, canonical order."""
    if len(maps) == 1:
        return dict(maps[0])
    return {f"{phase}:{cid}": value for phase, m in enumerate(maps) for cid, value in m.items()}


def to_list(deltas: Mapping[str, float]) -> list[float]:
    return [float(deltas[cid]) for cid in canonical_ids(deltas)]


def to_dict(values: Sequence[float], ids: Sequence[str]) -> Deltas:
    """`ids` must already be in canonical order."""
    if len(values) != len(ids):
        raise ValueError(f"{len(values)} deltas for {len(ids)} clusters")
    return {cid: float(v) for cid, v in zip(ids, values)}


def sidecar_path(deltas_path: Path) -> Path:
    """The sidecar that records which clusters a deltas file was made for: the deltas file
    itself holds only deltas."""
    return deltas_path.with_name(deltas_path.stem + ".clusters.json")


def write_sidecar(deltas_path: Path, map_digest: str) -> None:
    """`map_digest`: the clusters' `cluster_map_digest`."""
    from compressor_2.common import atomic_write_json

    atomic_write_json(sidecar_path(deltas_path), {"cluster_map": map_digest})


def recorded_map_digest(deltas_path: Path, override: str = "pass --force") -> str | None:
    """The clusters' digest the sidecar of `deltas_path` records, None without a sidecar;
    a sidecar that is unreadable or malformed is refused, naming `override`."""
    sidecar = sidecar_path(deltas_path)
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


def check_map_digest(deltas_path: Path, map_digest: str, force: bool, override: str = "pass --force") -> None:
    """Refuses deltas recorded for other clusters than `map_digest` (unless `force`): the
    same cluster ids would steer other tokens. A file without a record is not checked.
    `override`: how the caller's user uses such deltas anyway."""
    if force:
        return
    recorded = recorded_map_digest(deltas_path, override)
    if recorded is None:
        return
    sidecar = sidecar_path(deltas_path)
    if recorded != map_digest:
        raise ConfigError(f"'{deltas_path}' was made for clusters {recorded[:12]} ({sidecar.name} says so), but the "
                          f"current clusters are {map_digest[:12]}: the same ids would steer other tokens. Build the "
                          "clusters it was made for (the same model, CONFIG_NUM_CLUSTERS, CONFIG_PCA_COMPONENTS and "
                          f"CONFIG_CLUSTER_SEED), or {override}")

"""Where a cluster build may write a file the config names (the cluster descriptions, the
all-zero initial deltas and their sidecar): a path that is new, or one a build of the same
cluster directory wrote and that still holds what it wrote. Never through a symbolic link.

Every such write is claimed first in `written.json` in the cluster directory: the file's
path (relative to the directory when inside it, as the record names artifacts, so a copied
directory is still recognised) and the sha256 of what is about to be written. The claim
comes before the write, and a path keeps its two latest digests, so a build interrupted
between the two leaves a file its next build still knows as its own. `fingerprint.json` is
no place for this: a rebuild removes it first. A set built before the ledger existed is
recognised by its record (the descriptions' sha256, the initial deltas' path and sha256).

A file anywhere else (the training data, a tokenizer file, another run's archive, a file
the user edited since) is never written over: the build was writing `train.jsonl` full of
descriptions. The other way round, no file a build writes is an input in another role
(`check_inputs`): the cluster map named as the descriptions was read as JSON, and a
build would have written the descriptions over it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path

from compressor_2.clusters.clusterset import ArtifactPaths, file_sha256, read_record
from compressor_2.clusters.layout import LEDGER_FILE
from compressor_2.common import ConfigError, atomic_write_json, file_identity
from compressor_2.config import Config
from compressor_2.deltas import fingerprint_path

KEPT_DIGESTS = 2  # the file's content is one of them whether the write after its claim happened or not
_SIDECAR = re.compile(r'\{\s*"cluster_map"\s*:\s*"[0-9a-f]{64}"\s*\}\s*')  # deltas.write_fingerprint's


def check_inputs(config: Config, inputs: Mapping[str, Path | None] | None = None) -> None:
    """Refuses, in one line naming the option and the file, an input the config (or a
    command's option in `inputs`, by its name) names that is a file a cluster build writes
    in another role: its own artifacts in CONFIG_CLUSTER_DIR, and the descriptions, the
    initial deltas and their sidecar while they are new or what a build wrote (a file of
    the user's at one of those paths is what `why_not_writable` names). The descriptions
    and the initial deltas are the build's in their own role only; a deltas option may
    name the initial deltas."""
    paths = ArtifactPaths.from_config(config)
    initial = config.initial_deltas_path
    own = {file_identity(p): f"a cluster artifact in CONFIG_CLUSTER_DIR ({p.name})" for p in paths.own_files()}
    descriptions = {file_identity(path): "the file of CONFIG_CLUSTER_DESCRIPTIONS_PATH"
                    for path in (config.cluster_descriptions_path,) if _builds(paths, path)}
    deltas = {file_identity(path): role for path, role, sidecar in (
        (initial, "the file of CONFIG_INITIAL_DELTAS_PATH", False),
        (fingerprint_path(initial), "the sidecar of CONFIG_INITIAL_DELTAS_PATH", True)) if _builds(paths, path, sidecar)}
    every = {**deltas, **descriptions, **own}
    checked: list[tuple[str, Path | None, dict[tuple[int, int] | Path, str]]] = [
        ("CONFIG_CLUSTER_DESCRIPTIONS_PATH", config.cluster_descriptions_path, own),
        ("CONFIG_INITIAL_DELTAS_PATH", initial, own),
        ("CONFIG_FINANCEBENCH_JSONL_PATH", config.financebench_jsonl_path, every),
        ("CONFIG_PROMPT_TEMPLATE_PATH", config.prompt_template_path, every),
        ("CONFIG_HOLDOUT_DATA", config.holdout_data, every),
        ("CONFIG_MODEL_PATH", Path(config.model_path), every),
    ]
    for option, path in (inputs or {}).items():
        checked.append((option, path, {**descriptions, **own} if option.endswith("--deltas") else every))
    for option, path, refused in checked:
        if path is not None and (role := refused.get(file_identity(path))) is not None:
            shown = f"{option}='{path}'" if option.startswith("CONFIG_") else f"{option} '{path}'"
            raise ConfigError(f"{shown} is {role}, which a cluster build writes: name another file")


def _builds(paths: ArtifactPaths, given: Path, sidecar: bool = False) -> bool:
    """A build writes `given`: it is new, or holds what a build wrote there."""
    target = given.resolve()
    return not target.exists() or written_here(paths, target) or (sidecar and target.is_file() and _is_sidecar(target))


def why_not_writable(paths: ArtifactPaths, given: Path, sidecar: bool = False) -> str | None:
    """Why a build may not write the file the config names as `given`, phrased to follow
    the path; None when it may. `sidecar`: `given` is a deltas file's fingerprint sidecar,
    which a build may replace whoever wrote it (a stale one stays when its deltas file is
    deleted to have it written again)."""
    if given.is_symlink():
        return "is a symbolic link: a cluster build never writes through one; name the file itself"
    target = given.resolve()
    if not target.is_file():
        return None  # new, or not a regular file, which `check_output_file` names
    if (sidecar and _is_sidecar(target)) or written_here(paths, target):
        return None
    return (f"holds a file no build of CONFIG_CLUSTER_DIR='{paths.cluster_dir}' wrote (or one edited since): a "
            "cluster build would write over it; move it away, or choose a new path")


def written_here(paths: ArtifactPaths, target: Path) -> bool:
    """`target` (a resolved path) holds what a build of this cluster directory wrote there."""
    return target.is_file() and file_sha256(target) in _known(paths, target)


def claim(paths: ArtifactPaths, target: Path, data: bytes) -> None:
    """Records that a build is about to write `data` to `target` (a resolved path)."""
    ledger = _ledger(paths)
    key = paths.key(target)
    digests = [d for d in ledger.get(key, []) if d != _sha256(data)]
    ledger[key] = [*digests, _sha256(data)][-KEPT_DIGESTS:]
    atomic_write_json(paths.cluster_dir / LEDGER_FILE, {"files": ledger})


def _known(paths: ArtifactPaths, target: Path) -> set[str]:
    """The digests builds of this cluster directory wrote to `target`: claimed in the
    ledger, or recorded by a build from before it."""
    known = set(_ledger(paths).get(paths.key(target), []))
    record = read_record(paths) or {}
    hashes = record.get("sha256")
    if isinstance(hashes, dict) and isinstance(hashes.get(paths.key(target)), str):
        known.add(hashes[paths.key(target)])
    initial = record.get("initial_deltas")
    if isinstance(initial, dict) and initial.get("path") == str(target) and isinstance(initial.get("sha256"), str):
        known.add(initial["sha256"])
    return known


def _ledger(paths: ArtifactPaths) -> dict[str, list[str]]:
    """The ledger's entries; one that cannot be read claims nothing (a build then refuses
    more, never less)."""
    try:
        raw = json.loads((paths.cluster_dir / LEDGER_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    files = raw.get("files") if isinstance(raw, dict) else None
    if not isinstance(files, dict):
        return {}
    return {key: [d for d in digests if isinstance(d, str)] for key, digests in files.items()
            if isinstance(key, str) and isinstance(digests, list)}


def _is_sidecar(path: Path) -> bool:
    """What `deltas.write_fingerprint` writes, and nothing else."""
    if path.stat().st_size > 1024:
        return False
    try:
        return _SIDECAR.fullmatch(path.read_text(encoding="utf-8")) is not None
    except (OSError, UnicodeDecodeError):
        return False


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()

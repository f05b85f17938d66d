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
the user edited since) is never written over. Which file is an input, and which a build
writes (`builds`), is held in one table by the commands (commands/files.py), which
refuses either named as the other.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from compressor_2.clusters.clusterset import ArtifactPaths, file_sha256, read_build_record
from compressor_2.clusters.layout import LEDGER_FILE
from compressor_2.common import atomic_write_json

KEPT_DIGESTS = 2  # the file's content is one of them whether the write after its claim happened or not
_SIDECAR = re.compile(r'\{\s*"cluster_map"\s*:\s*"[0-9a-f]{64}"\s*\}\s*')  # deltas.write_sidecar's


def builds(paths: ArtifactPaths, given: Path, sidecar: bool = False) -> bool:
    """A build writes `given`: it is new, or holds what a build wrote there."""
    target = given.resolve()
    return not target.exists() or written_here(paths, target) or (sidecar and target.is_file() and _is_sidecar(target))


def why_not_writable(paths: ArtifactPaths, given: Path, sidecar: bool = False) -> str | None:
    """Why a build may not write the file the config names as `given`, phrased to follow
    the path; None when it may. `sidecar`: `given` is a deltas file's sidecar (its cluster map digest),
    which a build may replace whoever wrote it (a stale one stays when its deltas file is
    deleted to have it written again)."""
    if given.is_symlink():
        return "is a symbolic link: a cluster build never writes through one; name the file itself"
    target = given.resolve()
    if not target.is_file():
        return None  # new, or not a regular file, which the commands' `Files.check_output` names
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
    record = read_build_record(paths) or {}
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
    """What `deltas.write_sidecar` writes, and nothing else."""
    if path.stat().st_size > 1024:
        return False
    try:
        return _SIDECAR.fullmatch(path.read_text(encoding="utf-8")) is not None
    except (OSError, UnicodeDecodeError):
        return False


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()

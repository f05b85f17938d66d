"""The built clusters as the rest of the code sees them, and the artifact layout.

`fingerprint.json` in the cluster directory, the build record, is written last by a build
and removed first by a rebuild, so its presence means a complete set. It records the
build digest (the sha256 of the build's inputs, under the key "fingerprint") and the
sha256 of the two artifacts everything downstream reads (`token_clusters.npy` and the
cluster descriptions), so a half-written or hand-edited set is refused rather than trusted.

A set is keyed by what determines it: the settings (`config_inputs`) and the model's
vocabulary, never where the model lies, so a copied or moved model keeps its clusters and
their build digest (which a deployed processor steering by reference checks). A set built
when the model's path was an input (its record still names it) is taken as it is, its
build digest unchanged: that key is ignored.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compressor_2.clusters.layout import (
    EMBEDDINGS_FILE,
    EMBEDDINGS_KEY_FILE,
    BUILD_RECORD_FILE,
    KMEANS_FILE,
    LEDGER_FILE,
    CLUSTER_LOCK_FILE,
    PCA_FILE,
    TOKEN_CLUSTERS_FILE,
)
from compressor_2.clusters.roles import ROLES_VERSION
from compressor_2.clusters.special import RULES_VERSION
from compressor_2.clusters.vocab import load_vocabulary, tokenizer_files_digest
from compressor_2.common import ConfigError
from compressor_2.config import Config
from compressor_2.deltas import canonical_ids

FORMAT_VERSION = 1
REBUILD_HINT = "run `python -m compressor_2 build-clusters --config <your .config>`"


@dataclass(frozen=True)
class ClusterSet:
    cluster_ids: tuple[str, ...]  # canonical order: index i <-> cluster id cluster_ids[i]
    token_clusters: np.ndarray  # int64, the cluster index of every tokenizer token id
    token_clusters_path: Path  # absolute
    descriptions: dict[str, dict]
    build_digest: str  # the build record's digest of the build's inputs (its key "fingerprint")


def cluster_map_digest(clusters: ClusterSet) -> str:
    """What a deltas file depends on: which token is in which cluster, and the cluster ids.
    Unlike the build digest it holds no path, so the same clusters built on another
    machine (or a copied directory) have the same digest."""
    return map_digest(clusters.token_clusters, clusters.cluster_ids)


def map_digest(token_clusters: np.ndarray, cluster_ids: Sequence[str]) -> str:
    """`cluster_map_digest` of a set not read back yet (a build writing it)."""
    digest = hashlib.sha256(np.ascontiguousarray(token_clusters, dtype=np.int64).tobytes())
    digest.update(",".join(cluster_ids).encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class ArtifactPaths:
    cluster_dir: Path
    embeddings: Path
    embeddings_key: Path
    pca: Path
    kmeans: Path
    token_clusters: Path
    record: Path
    descriptions: Path
    initial_deltas: Path

    @classmethod
    def from_config(cls, config: Config) -> ArtifactPaths:
        d = config.cluster_dir.resolve()
        return cls(
            cluster_dir=d,
            embeddings=d / EMBEDDINGS_FILE,
            embeddings_key=d / EMBEDDINGS_KEY_FILE,
            pca=d / PCA_FILE,
            kmeans=d / KMEANS_FILE,
            token_clusters=d / TOKEN_CLUSTERS_FILE,
            record=d / BUILD_RECORD_FILE,
            descriptions=config.cluster_descriptions_path.resolve(),
            initial_deltas=config.initial_deltas_path.resolve(),
        )

    def key(self, path: Path) -> str:
        """How the record names an artifact: relative to the cluster directory when inside
        it, so a copied directory is still recognised."""
        try:
            return str(path.relative_to(self.cluster_dir))
        except ValueError:
            return str(path)

    def built(self) -> tuple[Path, ...]:
        return (self.embeddings, self.pca, self.kmeans, self.token_clusters, self.descriptions)

    def own_files(self) -> tuple[Path, ...]:
        """Every file a build writes in the cluster directory under a name of its own."""
        return (self.embeddings, self.embeddings_key, self.pca, self.kmeans, self.token_clusters, self.record,
                self.cluster_dir / LEDGER_FILE, self.cluster_dir / CLUSTER_LOCK_FILE)


ROLES_INPUT = "roles"  # an input only with CONFIG_ROLE_CLUSTERS=y: a build without roles keeps its build digest
NAMES = {"embedding_model": "CONFIG_EMBEDDING_MODEL", "pca_components": "CONFIG_PCA_COMPONENTS",
         "num_clusters": "CONFIG_NUM_CLUSTERS", "seed": "CONFIG_CLUSTER_SEED", ROLES_INPUT: "CONFIG_ROLE_CLUSTERS",
         "vocabulary": "the vocabulary of CONFIG_MODEL_PATH"}


def config_inputs(config: Config) -> dict[str, Any]:
    """The inputs the config's settings determine (checked without loading the tokenizer);
    the vocabulary is the other one (`vocabulary_problem`)."""
    inputs = {
        "format": FORMAT_VERSION,
        "rules": RULES_VERSION,
        "embedding_model": config.embedding_model,
        "pca_components": config.pca_components,
        "num_clusters": config.num_clusters,
        "seed": config.cluster_seed,  # the key predates CONFIG_CLUSTER_SEED: same value, same build digest
    }
    if config.role_clusters:
        inputs[ROLES_INPUT] = f"y (role rules {ROLES_VERSION})"
    return inputs


def build_digest_of(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode("utf-8")).hexdigest()


def file_sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def read_build_record(paths: ArtifactPaths) -> dict[str, Any] | None:
    try:
        record = json.loads(paths.record.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def record_problem(record: dict[str, Any] | None, paths: ArtifactPaths) -> str | None:
    """Why the recorded set cannot be trusted as it is on disk, or None."""
    if record is None:
        return f"no complete cluster set in {paths.cluster_dir}"
    missing = [p for p in paths.built() if not p.is_file()]
    if missing:
        return f"{missing[0]} is missing"
    hashes = record.get("sha256", {})
    for path in (paths.token_clusters, paths.descriptions):
        if hashes.get(paths.key(path), hashes.get(str(path))) != file_sha256(path):
            return f"{path} does not match the build that recorded it (modified or half-written)"
    return None


def changed_input(recorded: dict[str, Any], current: dict[str, Any]) -> str | None:
    """The first of `current`'s inputs the record holds otherwise, in words; keys only the
    record has (a model path, from before sets were keyed by the vocabulary) are not inputs,
    but the roles, which only a build with them records, are."""
    for key in (*current, *([ROLES_INPUT] if ROLES_INPUT in recorded else [])):
        if recorded.get(key) != current.get(key):
            return (f"{NAMES.get(key, f'the {key} version')} is {_shown(key, current.get(key))} but the clusters were "
                    f"built with {_shown(key, recorded.get(key))}")
    return None


def _shown(key: str, value: Any) -> str:
    return "n" if key == ROLES_INPUT and value is None else repr(value)


def vocabulary_problem(record: dict[str, Any], config: Config) -> str | None:
    """Why the recorded set is not of CONFIG_MODEL_PATH's vocabulary, or None: known from
    its tokenizer files when they are the ones the build read, else by loading it."""
    files = tokenizer_files_digest(config.model_path)
    if files is not None and record.get("tokenizer_files") == files:
        return None
    if record.get("inputs", {}).get("vocabulary") == load_vocabulary(config.model_path).sha256:
        return None
    return f"CONFIG_MODEL_PATH={config.model_path!r} has another vocabulary than the clusters were built from"


def read_cluster_set(paths: ArtifactPaths, build_digest: str) -> ClusterSet:
    descriptions = json.loads(paths.descriptions.read_text(encoding="utf-8"))
    ids = tuple(canonical_ids(descriptions))
    token_clusters = np.load(paths.token_clusters, allow_pickle=False).astype(np.int64, copy=False)
    return ClusterSet(cluster_ids=ids, token_clusters=token_clusters,
                      token_clusters_path=paths.token_clusters, descriptions=descriptions,
                      build_digest=build_digest)


def load_cluster_set(config: Config, paths: ArtifactPaths | None = None) -> ClusterSet:
    """The clusters built for `config` (at `paths`, made from it when not handed);
    ConfigError (saying to run build-clusters) when they are missing, incomplete, or were
    built from other settings or another vocabulary."""
    paths = paths or ArtifactPaths.from_config(config)
    record = read_build_record(paths)
    problem = record_problem(record, paths)
    if problem is None:
        assert record is not None
        problem = changed_input(record.get("inputs", {}), config_inputs(config)) or vocabulary_problem(record, config)
    if problem is not None:
        raise ConfigError(f"{problem}: {REBUILD_HINT}")
    assert record is not None
    return read_cluster_set(paths, record["fingerprint"])

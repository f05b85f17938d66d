"""`build-clusters`: the tokenizer's vocabulary -> one cluster id per token.

EOS/EOT tokens -> "0", number tokens -> "1", other special and added tokens -> UNSTEERED,
in no cluster (clusters/special.py); with CONFIG_ROLE_CLUSTERS=y, the tokens of each role
(clusters/roles.py) -> "2", "3", ...; every other token: decoded text ->
sentence-transformers embedding -> PCA -> k-means label c -> "c + 2" (after the roles' ids).

Cached: the inputs (vocabulary, embedding model, PCA size, k, seed, rule version)
are hashed into the build digest; a rerun with the same inputs and an intact artifact set only prints
one line, wherever the model lies. A rebuild removes the record first and writes it last
(see clusterset.py), and reuses `embeddings.npy` when only PCA size, k or seed changed.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import io
import json
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from compressor_2.clusters.clusterset import (
    FORMAT_VERSION,
    ArtifactPaths,
    ClusterSet,
    changed_input,
    cluster_map_digest,
    config_inputs,
    file_sha256,
    build_digest_of,
    map_digest,
    read_cluster_set,
    read_build_record,
    record_problem,
)
from compressor_2.clusters.builder.describe import describe_clusters, unsteered
from compressor_2.clusters.embed import MAX_PIECES, embed_texts
from compressor_2.clusters.layout import CLUSTER_LOCK_FILE, UNSTEERED
from compressor_2.clusters.roles import FIRST_ROLE_ID, ROLES, Role, role_token_ids
from compressor_2.clusters.special import EMBEDDED_TEXT_VERSION, number_token_ids, strip_markers
from compressor_2.clusters.vocab import Vocabulary, load_vocabulary, tokenizer_files_digest
from compressor_2.clusters.builder.written import claim, written_here
from compressor_2.common import (
    ConfigError,
    RunError,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    file_kind,
)
from compressor_2.config import Config
from compressor_2.deltas import canonical_ids, sidecar_path, load_deltas, write_sidecar

__all__ = ["build_clusters"]

KMEANS_RESTARTS = 4
_PENDING = -2  # a token the k-means step has yet to place


def build_clusters(config: Config, force: bool = False, later: list[Callable[[], None]] | None = None,
                   paths: ArtifactPaths | None = None) -> ClusterSet:
    """Build (or reuse) the clusters of `config.model_path`'s tokenizer; prints one summary line.

    The process holds a shared lock on the cluster directory from here to its exit, and
    a rebuild needs it exclusively: a run whose clusters differ is refused at once rather
    than rebuilding the directory under a run that uses it. `later`: where a set that is up
    to date puts the writes it still owes (the record's tokenizer digest, initial deltas
    written when absent, their sidecar) instead of making them, for a caller that compares
    first and writes after (a resume that may yet be refused); a rebuild writes at once.
    `paths`: the artifacts' paths, as the command's table of files holds them (made from
    `config` when not handed)."""
    started = time.perf_counter()
    paths = paths or ArtifactPaths.from_config(config)
    lock = _directory_lock(paths.cluster_dir)
    fcntl.flock(lock, fcntl.LOCK_SH)  # waits while another process rebuilds
    files = tokenizer_files_digest(config.model_path)
    record = read_build_record(paths)
    previous = record if not force and record_problem(record, paths) is None else None
    settings = previous is not None and changed_input(previous.get("inputs", {}), config_inputs(config)) is None
    writes: list[Callable[[], None]] = [] if later is None else later
    if settings and files is not None and previous.get("tokenizer_files") == files:  # type: ignore[union-attr]
        # Same settings, same tokenizer files, same library versions: the same vocabulary,
        # known without importing transformers (and torch), the warm path's big cost.
        return _up_to_date(paths, previous, started, writes, later is None)  # type: ignore[arg-type]
    vocab = load_vocabulary(config.model_path)
    inputs = {**config_inputs(config), "vocabulary": vocab.sha256}
    if settings and changed_input(previous.get("inputs", {}), inputs) is None:  # type: ignore[union-attr]
        assert previous is not None
        if previous.get("tokenizer_files") != files:
            previous["tokenizer_files"] = files
            writes.append(functools.partial(atomic_write_json, paths.record, dict(previous)))
        return _up_to_date(paths, previous, started, writes, later is None)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        why = changed_input(record.get("inputs", {}) if record else {}, config_inputs(config)) or "a rebuild"
        raise RunError(f"'{paths.cluster_dir}' is in use by another run on other clusters ({why}): wait for it "
                       "to finish, or set another CONFIG_CLUSTER_DIR") from None
    try:
        return _rebuild(config, paths, vocab, inputs, files, record, started)
    finally:
        fcntl.flock(lock, fcntl.LOCK_SH)


_LOCKS: dict[Path, int] = {}  # cluster directory -> the open lock file, held until the process exits


def _directory_lock(directory: Path) -> int:
    if directory not in _LOCKS:
        directory.mkdir(parents=True, exist_ok=True)
        # Not through a link, and never blocking on a FIFO made there.
        try:
            fd = os.open(directory / CLUSTER_LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            raise ConfigError(f"'{directory / CLUSTER_LOCK_FILE}' cannot be opened ({exc.strerror}): remove it") from None
        if not stat.S_ISREG(mode := os.fstat(fd).st_mode):
            os.close(fd)
            raise ConfigError(f"'{directory / CLUSTER_LOCK_FILE}' is {file_kind(mode)}, not a regular file: remove it")
        _LOCKS[directory] = fd
    return _LOCKS[directory]


def _up_to_date(paths: ArtifactPaths, record: dict[str, Any], started: float, writes: list[Callable[[], None]],
                now: bool) -> ClusterSet:
    """The recorded set, read; what it still owes its directory goes to `writes`, made at
    once when `now`."""
    clusters = read_cluster_set(paths, record["fingerprint"])
    digest = cluster_map_digest(clusters)
    if not paths.initial_deltas.exists():
        def initial_deltas() -> None:
            record["initial_deltas"] = _sync_initial_deltas(paths, clusters.cluster_ids, digest, record)
            atomic_write_json(paths.record, record)
        writes.append(initial_deltas)
    elif not sidecar_path(paths.initial_deltas).exists() and _is_ours(paths, record):
        # A file an earlier version wrote without one.
        writes.append(functools.partial(write_sidecar, paths.initial_deltas, digest))
    if now:
        for write in writes:
            write()
        writes.clear()
    print(f"clusters up to date: {len(clusters.token_clusters):,} tokens in {len(clusters.cluster_ids)} "
          f"clusters{_unsteered_note(record.get('unsteered'))} ({paths.cluster_dir}, "
          f"{time.perf_counter() - started:.1f}s)")
    return clusters


def _unsteered_note(entry: dict[str, Any] | None) -> str:
    """How the build line names the unsteered tokens, from the record's entry."""
    if not entry or not entry.get("size"):
        return ""
    shown = ", ".join(entry["tokens"][:6]) + (", ..." if entry["size"] > 6 else "")
    return f", {entry['size']:,} special/added tokens unsteered ({shown})"


def _embedding_text(vocab: Vocabulary, token_id: int) -> str:
    # Sentence encoders ignore the leading space and read `##`/`Ġ` as literal
    # characters: embed the bare text; whitespace-only tokens as escapes (`\n`, `\t`),
    # so newlines and tabs do not all embed as the empty string.
    text = vocab.texts[token_id]
    return strip_markers(text) or text.encode("unicode_escape").decode("ascii")


def _embeddings(config: Config, paths: ArtifactPaths, vocab: Vocabulary) -> tuple[np.ndarray, bool]:
    """Every token's embedding, reused from disk when the token texts and model match."""
    key = hashlib.sha256(
        f"{FORMAT_VERSION}|{EMBEDDED_TEXT_VERSION}|{MAX_PIECES}|{vocab.texts_sha256}|{config.embedding_model}".encode()
    ).hexdigest()
    try:
        if paths.embeddings_key.read_text(encoding="utf-8").strip() == key:
            cached = np.load(paths.embeddings, allow_pickle=False)
            if cached.ndim == 2 and cached.shape[0] == len(vocab):
                return cached, True
    except (OSError, ValueError):
        pass
    paths.embeddings_key.unlink(missing_ok=True)
    embeddings = embed_texts([_embedding_text(vocab, i) for i in range(len(vocab))],
                             config.embedding_model, config.embed_batch_size)
    _save_npy(paths.embeddings, embeddings)
    atomic_write_text(paths.embeddings_key, key + "\n")
    return embeddings, False


def _save_npy(path: Path, array: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    atomic_write_bytes(path, buffer.getvalue())


def _save_joblib(path: Path, obj: object) -> None:
    import joblib

    buffer = io.BytesIO()
    joblib.dump(obj, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def _rebuild(config: Config, paths: ArtifactPaths, vocab: Vocabulary, inputs: dict[str, Any],
             files: str | None, previous: dict[str, Any] | None, started: float) -> ClusterSet:
    from sklearn.cluster import KMeans
    from sklearn.decomposition import PCA

    for target in (paths.descriptions, paths.initial_deltas):
        if written_here(paths, target):  # known by the record alone, which goes now: into the ledger
            claim(paths, target, target.read_bytes())
    paths.record.unlink(missing_ok=True)
    token_clusters, roles = _fixed_clusters(vocab, config.role_clusters)
    first = FIRST_ROLE_ID + len(roles)  # the first k-means cluster's id
    kmeans_ids = np.flatnonzero(token_clusters == _PENDING)
    k = config.num_clusters
    if len(kmeans_ids) < k:
        raise ConfigError(
            f"CONFIG_NUM_CLUSTERS={k} is more than the {len(kmeans_ids)} tokens of "
            f"CONFIG_MODEL_PATH={config.model_path!r} left for k-means"
        )

    embeddings, reused = _embeddings(config, paths, vocab)
    selected = embeddings[kmeans_ids]
    components = min(config.pca_components, *selected.shape)
    pca = PCA(n_components=components, random_state=config.cluster_seed).fit(selected)
    points = pca.transform(selected)
    kmeans = KMeans(n_clusters=k, random_state=config.cluster_seed, n_init=KMEANS_RESTARTS).fit(points)
    token_clusters[kmeans_ids] = kmeans.labels_ + first
    descriptions = describe_clusters(vocab, token_clusters, points, kmeans.cluster_centers_, roles)

    _save_joblib(paths.pca, pca)
    _save_joblib(paths.kmeans, kmeans)
    _save_npy(paths.token_clusters, token_clusters)
    _write_claimed(paths, paths.descriptions, descriptions)
    cluster_ids = tuple(descriptions)
    record = {
        "fingerprint": build_digest_of(inputs),
        "inputs": inputs,
        "tokenizer_files": files,
        "vocab_size": len(vocab),
        "cluster_ids": list(cluster_ids),
        "unsteered": unsteered(vocab, token_clusters),
        "sha256": {paths.key(p): file_sha256(p) for p in (paths.token_clusters, paths.descriptions)},
        "initial_deltas": _sync_initial_deltas(paths, cluster_ids, map_digest(token_clusters, canonical_ids(cluster_ids)),
                                               previous),
    }
    # Last: only now is the set complete.
    atomic_write_json(paths.record, record)

    counts = np.bincount(token_clusters[token_clusters >= 0], minlength=k + first)
    pca_note = f"PCA {components}" + (f" (clipped from {config.pca_components})"
                                      if components < config.pca_components else "")
    role_note = "".join(f"{FIRST_ROLE_ID + i} ({role.name}) {counts[FIRST_ROLE_ID + i]:,}, "
                        for i, role in enumerate(roles))
    print(
        f"built {k + first} clusters for {len(vocab):,} tokens in {time.perf_counter() - started:.1f}s: "
        f"0 (EOS/EOT) {counts[0]}, 1 (numbers) {counts[1]:,}, {role_note}{first}..{k + first - 1} k-means over "
        f"{len(kmeans_ids):,} tokens ({pca_note}{', embeddings reused' if reused else ''})"
        f"{_unsteered_note(record['unsteered'])} -> {paths.cluster_dir}"
    )
    return read_cluster_set(paths, record["fingerprint"])


def _fixed_clusters(vocab: Vocabulary, by_role: bool) -> tuple[np.ndarray, tuple[Role, ...]]:
    """The cluster map before k-means: the unsteered tokens, EOS "0", numbers "1", and with
    `by_role` each role's tokens from FIRST_ROLE_ID on; every other token _PENDING. Returns
    the roles made."""
    token_clusters = np.full(len(vocab), _PENDING, dtype=np.int64)
    token_clusters[sorted(vocab.unsteered_ids)] = UNSTEERED
    token_clusters[sorted(vocab.eos_ids)] = 0
    fixed = vocab.eos_ids | vocab.unsteered_ids
    numbers = number_token_ids(vocab.texts, exclude=fixed)
    token_clusters[sorted(numbers)] = 1
    if not by_role:
        return token_clusters, ()
    for index, ids in enumerate(role_token_ids(vocab.texts, exclude=fixed | numbers)):
        token_clusters[ids] = FIRST_ROLE_ID + index
    return token_clusters, ROLES


def _is_ours(paths: ArtifactPaths, record: dict[str, Any] | None) -> bool:
    """The initial deltas file is the untouched one a build wrote."""
    ours = (record or {}).get("initial_deltas") or {}
    return written_here(paths, paths.initial_deltas) or (
        paths.initial_deltas.is_file() and ours.get("path") == str(paths.initial_deltas)
        and ours.get("sha256") == file_sha256(paths.initial_deltas))


def _write_claimed(paths: ArtifactPaths, target: Path, content: dict[str, Any]) -> None:
    """Writes `content` as JSON to `target` (the descriptions, the initial deltas), claimed in
    the cluster directory's ledger first (builder/written.py)."""
    data = (json.dumps(content, indent=2) + "\n").encode("utf-8")
    claim(paths, target, data)
    atomic_write_bytes(target, data)


def _sync_initial_deltas(paths: ArtifactPaths, cluster_ids: tuple[str, ...], digest: str,
                         previous: dict[str, Any] | None) -> dict[str, str] | None:
    """Write all-zero initial deltas, with the sidecar that names their clusters (`digest`),
    when the file is absent, or when it is the untouched file an earlier build wrote (for
    maybe other cluster ids). A file the user wrote is left alone, with a warning when its
    ids no longer match. Returns the record entry of a file this build owns."""
    path = paths.initial_deltas
    absent = not path.exists()
    if absent or _is_ours(paths, previous):
        _write_claimed(paths, path, {cid: 0.0 for cid in cluster_ids})
        write_sidecar(path, digest)
        if absent:
            print(f"wrote all-zero initial deltas to {path}")
        return {"path": str(path), "sha256": file_sha256(path) or ""}
    try:
        load_deltas(path, cluster_ids, phases=None)  # the run's CONFIG_DELTA_PHASES is evolve's to check
    except ConfigError as exc:
        print(f"warning: {exc} (the clusters are now {', '.join(cluster_ids)}); evolve will refuse it")
    return None

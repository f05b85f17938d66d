"""Cost of the steering bias at one decode step: 152k-token vocabulary, CPU.

For batch 1, 32 and 128 rows of float32 logits 152,064 wide (Qwen2's model vocab;
the cluster map covers 151,646 tokenizer ids, 12 clusters) it times, side by side:

  baseline    `logits + 0` of the same shape (one pass over the logits)
  apply_bias  steering/bias.py alone (in place)
  processor   the SGLang `SteeringProcessor` call with one `custom_params` per row,
              as the server makes it every step (cluster map cached on the class)

and prints each against the baseline. The machine is shared: torch runs one thread
and each figure is the minimum over interleaved repeats of this process's CPU time.
Run: .venv/bin/python benchmarks/bench_bias.py
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from compressor_2.clusters.layout import FINGERPRINT_FILE, TOKEN_CLUSTERS_FILE
from compressor_2.steering.bias import apply_bias
from compressor_2.steering.processor import SteeringProcessor

MODEL_WIDTH, TOKENIZER_VOCAB, CLUSTERS = 152_064, 151_646, 12
BATCHES = (1, 32, 128)
REPEATS = 7


def _cpu_time(step: Callable[[], object], calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        step()
    return (time.process_time() - start) / calls


def main() -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    token_clusters = rng.integers(0, CLUSTERS, TOKENIZER_VOCAB).astype(np.int64)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / TOKEN_CLUSTERS_FILE
        np.save(path, token_clusters)
        (Path(folder) / FINGERPRINT_FILE).write_text(json.dumps({"fingerprint": "bench"}))
        clusters = torch.from_numpy(token_clusters)
        print(f"bias step, {MODEL_WIDTH:,}-wide float32 logits, {CLUSTERS} clusters, CPU, 1 thread "
              f"(ms per step, min of {REPEATS})")
        for batch in BATCHES:
            logits = torch.randn(batch, MODEL_WIDTH)
            deltas = rng.normal(0, 1, (batch, CLUSTERS)).tolist()
            params = [{"deltas": d, "token_clusters": str(path), "fingerprint": "bench"} for d in deltas]
            rows = torch.tensor(deltas, dtype=torch.float32)
            processor = SteeringProcessor()
            variants: dict[str, Callable[[], object]] = {
                "baseline": lambda: logits + 0,
                "apply_bias": lambda: apply_bias(logits, rows, clusters),
                "processor": lambda: processor(logits, params),
            }
            calls = max(3, 200 // batch)
            for step in variants.values():
                step()  # warm up: allocator, and the processor's cluster-map cache
            best = dict.fromkeys(variants, float("inf"))
            for _ in range(REPEATS):
                for name, step in variants.items():
                    best[name] = min(best[name], _cpu_time(step, calls))
            base = best["baseline"]
            print(f"batch {batch:>3}: logits + 0 {base * 1e3:7.2f} ms | "
                  f"apply_bias {best['apply_bias'] * 1e3:7.2f} ms = {best['apply_bias'] / base:4.1f}x | "
                  f"processor {best['processor'] * 1e3:7.2f} ms = {best['processor'] / base:4.1f}x")


if __name__ == "__main__":
    main()

"""Cost of the steering at one decode step: 152k-token vocabulary, batch 1 to 256.

For float32 logits 152,064 wide (Qwen2's model vocab; the cluster map covers 151,646
tokenizer ids, 12 clusters), each row with its own deltas, it times side by side:

  add         the step's own logits add: `logits += bias` with the (rows, width) bias
              already made, the least any steering can cost
  apply_bias  steering/bias.py alone (in place), the deltas already a tensor
  sglang      what SGLang itself does around every processor call: select the rows
              (a copy) and copy the result back (layers/sampler.py)
  processor   the SGLang `SteeringProcessor` call with one `custom_params` per row, as
              the server makes it at every step after the first (deltas cached on the
              class, on the logits' device)
  first step  the same call with the class's caches empty: the map and every row's
              deltas are loaded then, once per server process

and prints each against `add`. On the CPU torch runs one thread (the machine is shared)
and each figure is the minimum over interleaved repeats of this process's CPU time; on
a CUDA GPU, when there is one, the wall time between two synchronisations. The
CPU-only machines this project is built on have no GPU: the output says when CUDA was
not measured.
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
from compressor_2.steering.bias import apply_bias, bias_matrix
from compressor_2.steering.processor import SteeringProcessor

MODEL_WIDTH, TOKENIZER_VOCAB, CLUSTERS = 152_064, 151_646, 12
BATCHES = (1, 8, 32, 128, 256)
REPEATS = 7


def _timer(device: torch.device) -> Callable[[Callable[[], object], int], float]:
    """Seconds per call of `step`: CPU time on the CPU, synchronised wall time on a GPU."""
    if device.type == "cuda":
        def timed(step: Callable[[], object], calls: int) -> float:
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            for _ in range(calls):
                step()
            torch.cuda.synchronize(device)
            return (time.perf_counter() - start) / calls
        return timed

    def cpu_timed(step: Callable[[], object], calls: int) -> float:
        start = time.process_time()
        for _ in range(calls):
            step()
        return (time.process_time() - start) / calls
    return cpu_timed


def _first_step(processor: SteeringProcessor, logits: torch.Tensor, params: list[dict]) -> float:
    """One call with empty class caches (the map reloads from disk, every row's deltas move)."""
    SteeringProcessor._maps.clear()
    SteeringProcessor._rows.clear()
    return _timer(logits.device)(lambda: processor(logits, params), 1)


def bench_device(device: torch.device, path: Path, token_clusters: np.ndarray, rng: np.random.Generator) -> None:
    clusters = torch.from_numpy(token_clusters).to(device)
    timed = _timer(device)
    clock = "wall time, synchronised" if device.type == "cuda" else "CPU time, 1 thread"
    print(f"{device.type}: ms per decode step ({clock}, min of {REPEATS}); ratio = time / add")
    for batch in BATCHES:
        logits = torch.randn(batch, MODEL_WIDTH, device=device)
        deltas = rng.normal(0, 1, (batch, CLUSTERS)).tolist()
        params = [{"deltas": d, "token_clusters": str(path), "fingerprint": "bench"} for d in deltas]
        rows = torch.tensor(deltas, dtype=torch.float32, device=device)
        bias = bias_matrix(rows, clusters, MODEL_WIDTH)
        processor = SteeringProcessor()
        indices = torch.arange(batch, device=device)
        variants: dict[str, Callable[[], object]] = {
            "add": lambda: logits.add_(bias),
            "apply_bias": lambda: apply_bias(logits, rows, clusters),
            "sglang": lambda: logits.index_copy_(0, indices, logits.index_select(0, indices)),
            "processor": lambda: processor(logits, params),
        }
        first = _first_step(processor, logits, params)
        calls = max(3, 200 // batch) if device.type == "cpu" else 50
        for step in variants.values():
            step()  # warm up: the allocator, and the processor's caches
        best = dict.fromkeys(variants, float("inf"))
        for _ in range(REPEATS):
            for name, step in variants.items():
                best[name] = min(best[name], timed(step, calls))
        base = best["add"]
        print(f"  batch {batch:>3}: add {base * 1e3:7.3f} | "
              f"apply_bias {best['apply_bias'] * 1e3:7.3f} = {best['apply_bias'] / base:4.1f}x | "
              f"sglang {best['sglang'] * 1e3:7.3f} = {best['sglang'] / base:4.1f}x | "
              f"processor {best['processor'] * 1e3:7.3f} = {best['processor'] / base:4.1f}x | "
              f"first step {first * 1e3:7.3f} = {first / base:5.1f}x")


def main() -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    token_clusters = rng.integers(0, CLUSTERS, TOKENIZER_VOCAB).astype(np.int64)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / TOKEN_CLUSTERS_FILE
        np.save(path, token_clusters)
        (Path(folder) / FINGERPRINT_FILE).write_text(json.dumps({"fingerprint": "bench"}))
        print(f"steering one decode step: {MODEL_WIDTH:,}-wide float32 logits, {CLUSTERS} clusters, "
              "one delta list per row")
        bench_device(torch.device("cpu"), path, token_clusters, rng)
        if torch.cuda.is_available():
            bench_device(torch.device("cuda"), path, token_clusters, rng)
        else:
            print("cuda: not measured (torch sees no CUDA GPU on this machine)")


if __name__ == "__main__":
    main()

"""Transformers engine: batching a generation's delta vectors, and the cost of steering.

1. 8 delta vectors x the same prompts in ONE batched call (one bias row per sequence)
   vs one call per vector (target: >= 8x).
2. Steered vs unsteered generation of the same requests (target: <= 3% slower).

A small random GPT-2 with a 32k word-level vocabulary is built here, saved with
`save_pretrained` and loaded through `from_pretrained`. Random weights never emit
EOS, so every answer runs to max_new_tokens and all variants do the same work.

The machine is shared, so torch runs one thread and the ratios use this process's
CPU time (wall time is printed too); each figure is the median of interleaved
repeats. Run: .venv/bin/python benchmarks/bench_engine.py
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from compressor_2.engines import GenerationRequest  # noqa: E402
from compressor_2.engines.transformers_engine import TransformersEngine  # noqa: E402
from compressor_2.steering.hf_processor import DeltaBiasProcessor  # noqa: E402

VOCAB = 32_000
LAYERS, WIDTH = 4, 256
CLUSTERS = 12
VECTORS = 8
MAX_NEW_TOKENS = 32
REPEATS = 3
STEERING_REPEATS = 9  # the effect is ~1%, below one run's jitter here


def build_model(directory: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = {"<|endoftext|>": 0, "<pad>": 1} | {f"w{i}": i + 2 for i in range(VOCAB - 2)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<pad>")
    fast.save_pretrained(directory)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=512, n_embd=WIDTH, n_layer=LAYERS, n_head=4,
                        bos_token_id=0, eos_token_id=0, pad_token_id=1)
    GPT2LMHeadModel(config).save_pretrained(directory)


Timing = tuple[float, float]  # (CPU seconds, wall seconds)


def timed(run: Callable[[], object]) -> Timing:
    cpu, wall = time.process_time(), time.perf_counter()
    run()
    return time.process_time() - cpu, time.perf_counter() - wall


def best_of(runs: dict[str, Callable[[], object]], repeats: int = REPEATS) -> dict[str, Timing]:
    """Interleaved repeats, so load from other processes hits every variant alike."""
    times: dict[str, list[Timing]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(timed(run))
    return {name: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v))
            for name, v in times.items()}


class TimedProcessor(DeltaBiasProcessor):
    """The real processor, adding up the CPU time spent inside it."""

    spent = 0.0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        start = time.process_time()
        out = super().__call__(input_ids, scores)
        TimedProcessor.spent += time.process_time() - start
        return out


def processor_share(engine: TransformersEngine, requests: list[GenerationRequest]) -> float:
    """Share of a steered generate call's CPU time spent adding the bias: the steering
    cost measured directly rather than as a small difference of two noisy timings."""
    padded = engine.tokenizer.pad({"input_ids": [engine.encode(r.prompt) for r in requests]},
                                  padding=True, return_tensors="pt")
    rows = torch.tensor([r.deltas for r in requests])
    shares = []
    for _ in range(REPEATS):
        TimedProcessor.spent = 0.0
        start = time.process_time()
        with torch.inference_mode():
            engine.model.generate(**padded, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                  eos_token_id=engine.eos_ids, pad_token_id=engine.tokenizer.pad_token_id,
                                  logits_processor=[TimedProcessor(rows, engine.token_clusters)])
        shares.append(TimedProcessor.spent / (time.process_time() - start))
    return statistics.median(shares)


def main() -> None:
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        build_model(Path(tmp))
        token_clusters = rng.integers(0, CLUSTERS, VOCAB).astype(np.int64)
        token_clusters[0] = 0
        prompts = [" ".join(f"w{rng.integers(2, VOCAB)}" for _ in range(n)) for n in (20, 24, 28, 32)]
        vectors = [tuple(rng.normal(0, 0.5, CLUSTERS).round(3)) for _ in range(VECTORS)]
        per_vector = [[GenerationRequest(p, v) for p in prompts] for v in vectors]
        everything = [r for group in per_vector for r in group]
        engine = TransformersEngine(tmp, token_clusters, CLUSTERS, batch_size=len(everything),
                                    max_new_tokens=MAX_NEW_TOKENS, device="cpu")
        engine.generate(everything[:2])  # warm-up

        print(f"torch {torch.__version__}, 1 thread; GPT-2 {LAYERS}x{WIDTH}, vocab {VOCAB}, "
              f"{CLUSTERS} clusters, {MAX_NEW_TOKENS} new tokens; CPU s / wall s, median of interleaved runs")
        t = best_of({
            "one batched call": lambda: engine.generate(everything),
            "one call per vector": lambda: [engine.generate(group) for group in per_vector],
        })
        batched, separate = t["one batched call"][0], t["one call per vector"][0]
        print(f"\n1. {VECTORS} vectors x {len(prompts)} prompts = {len(everything)} answers")
        for name, (cpu, wall) in t.items():
            print(f"   {name:<20} {cpu:6.2f} / {wall:6.2f} s")
        print(f"   one call of {len(everything)} rows costs {batched / (separate / VECTORS):.2f}x one call of "
              f"{len(prompts)} rows here (compute-bound CPU); {VECTORS}x needs a wider batch to be free")
        print(f"   RATIO batched vs one call per vector: {separate / batched:.2f}x (target >= 8x)")

        zeros = [GenerationRequest(r.prompt, (0.0,) * CLUSTERS) for r in everything]
        s = best_of({
            "unsteered": lambda: engine.generate(zeros),
            "steered": lambda: engine.generate(everything),
        }, repeats=STEERING_REPEATS)
        print(f"\n2. {len(everything)} answers in one batch, steered vs unsteered")
        for name, (cpu, wall) in s.items():
            print(f"   {name:<10} {cpu:6.2f} / {wall:6.2f} s")
        print(f"   time inside the steering processor: {processor_share(engine, everything):.2%} of a steered call")
        print(f"   RATIO steered / unsteered: {s['steered'][0] / s['unsteered'][0]:.3f} (target <= 1.03)")
        engine.close()


if __name__ == "__main__":
    sys.exit(main())

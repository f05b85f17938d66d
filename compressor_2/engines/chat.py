"""The prompt as token ids, inside the model's chat template: identical for every engine.

A server reached through SGLang's router cannot be sent token ids (the router refuses
them on /v1/completions), so the prompt also has a text form: the one a server that
tokenizes text the usual way turns back into exactly the same ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChatPrompt:
    ids: list[int]
    # What a server turns into exactly `ids` when it tokenizes a text prompt with the
    # tokenizer's special tokens added (SGLang's tokenizer manager does); None when no
    # text does (a tokenizer that appends EOS, say).
    text: str | None


def _chat_text(tokenizer: Any, prompt: str) -> str | None:
    """The user prompt in the chat template as text; None when the tokenizer has none."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)


def _encode(tokenizer: Any, prompt: str) -> tuple[str | None, list[int]]:
    """The templated text (None when the tokenizer has no chat template) and the prompt's
    ids: rendered once, so `chat_prompt` derives its text form from the very text whose
    ids it returns."""
    text = _chat_text(tokenizer, prompt)
    if text is None:
        return None, list(tokenizer(prompt)["input_ids"])
    return text, list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of the user prompt in the chat template, or of the raw prompt when the
    tokenizer has none. Ids, not text, go to the server: a template that already starts
    with BOS would otherwise get a second one when the server tokenizes it."""
    return _encode(tokenizer, prompt)[1]


def chat_prompt(tokenizer: Any, prompt: str) -> ChatPrompt:
    """The prompt's ids (`encode_prompt`) and the text a server tokenizes into them: the
    templated text itself, or without its leading BOS when the tokenizer adds one."""
    text, ids = _encode(tokenizer, prompt)
    if text is None:
        return ChatPrompt(ids, prompt)
    candidates = [text]
    bos = getattr(tokenizer, "bos_token", None)
    if bos and text.startswith(bos):
        candidates.append(text[len(bos):])
    # Lazy: the BOS-less candidate is tokenized only when the text itself does not fit.
    fits = next((c for c in candidates if list(tokenizer(c)["input_ids"]) == ids), None)
    return ChatPrompt(ids, fits)


def prompt_label(prompt: str) -> str:
    """How an error names a prompt, for every engine. Its end, because the end is the
    question in the default template: it names the example."""
    return f"prompt ending {prompt[-60:]!r}"

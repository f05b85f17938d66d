"""The prompt as token ids, inside the model's chat template: identical for every engine."""

from __future__ import annotations

from typing import Any


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of the user prompt in the chat template, or of the raw prompt when the
    tokenizer has none. Ids, not text, go to the server: a template that already starts
    with BOS would otherwise get a second one when the server tokenizes it."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(prompt)["input_ids"])

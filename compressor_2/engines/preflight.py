"""What can be known of the model before any work, from its files alone: that its weights
are its architecture's, and that every prompt a command will send fits its context with
CONFIG_MAX_NEW_TOKENS. A command makes this check before it writes anything (the run's
archive, its lock, the clusters), so that a refusal leaves every file as it was.

The transformers engine's model is the one at CONFIG_MODEL_PATH; an SGLang server serves
its own: its context is the server's, checked when the engine starts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from compressor_2.common import ConfigError
from compressor_2.data import INSTRUCTED
from compressor_2.engines.chat import encode_prompt, prompt_label
from compressor_2.model import load_tokenizer, model_context

if TYPE_CHECKING:
    from compressor_2.config import Config


def check_model(config: Config, prompts: Mapping[str, str]) -> None:
    """The transformers engine's model checked against `prompts` (every prompt the command
    will send, by example id): ConfigError in one line for the first that does not fit."""
    if config.engine != "transformers":
        return
    context = model_context(config.model_path)
    if context is None:
        return
    tokenizer = load_tokenizer(config.model_path)
    for example_id, prompt in prompts.items():
        tokens = len(encode_prompt(tokenizer, prompt))
        if tokens + config.max_new_tokens > context:
            raise ConfigError(_too_long(config, example_id, prompt, tokens, context))


def _too_long(config: Config, example_id: str, prompt: str, tokens: int, context: int) -> str:
    """The refusal of one prompt, naming the instruction where the prompt carries it."""
    fix = "lower CONFIG_EVIDENCE_MAX_CHARS or CONFIG_MAX_NEW_TOKENS"
    carries = ""
    if example_id.endswith(INSTRUCTED):
        where = "every prompt of the search carries" if config.instruction_in_search else \
            "the instruction tool's prompts carry"
        carries = (f", CONFIG_COMPARE_INSTRUCTION ({len(config.compare_instruction)} characters) included, as "
                   f"{where} it (CONFIG_INSTRUCTION_IN_SEARCH={'y' if config.instruction_in_search else 'n'})")
        fix = f"shorten CONFIG_COMPARE_INSTRUCTION, or {fix}"
    return (f"example {example_id.removesuffix(INSTRUCTED)} ({prompt_label(prompt)}): a prompt of {tokens} tokens"
            f"{carries}, plus CONFIG_MAX_NEW_TOKENS={config.max_new_tokens}, exceeds the context of {context} tokens "
            f"of CONFIG_MODEL_PATH={config.model_path!r}; {fix}")

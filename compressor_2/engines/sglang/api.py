"""The two request paths to an SGLang server: what a request's body is on each, and what
the engine reads from the answer. Chosen by name (CONFIG_SGLANG_API).

- `generate`: SGLang's native POST /generate, the prompt as token ids, the deltas in
  `sampling_params.custom_params`.
- `completions`: POST /v1/completions, the only path through SGLang's router
  (sglang-router 0.3.2 measured): the router drops `sampling_params.custom_params` from
  /generate, and refuses a token-id prompt on /v1/completions (422) before any worker
  sees it, while it passes a text prompt, `custom_logit_processor`, a top-level
  `custom_params` and `return_token_ids` on. So the prompt goes as the text that
  tokenizes into the prompt's ids (`ChatPrompt.text`), and the answer's
  `prompt_token_ids` let the engine check, for every request, that the server did
  tokenize it into exactly those ids.

Both ask SGLang for the same SamplingParams (tests/test_sglang_contract.py checks it with
SGLang's own request classes), so the same prompt, deltas and server give the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from compressor_2.engines.chat import ChatPrompt

# SGLang's CompletionRequest names of the /generate sampling fields it renames.
_COMPLETION_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "sampling_seed": "seed"}
# /generate sampling fields that CompletionRequest does not have (a request cannot state
# them there, so the server's preferred value applies: facts.py guards them).
NOT_ON_COMPLETIONS = frozenset({"spaces_between_special_tokens"})
# SGLang's default model name: no adapter is chosen by it, and the router requires the field.
COMPLETION_MODEL = "default"


@dataclass(frozen=True)
class ServerReply:
    text: str
    completion_tokens: int
    output_ids: list[int] | None  # the answer's token ids, when the path returns them
    prompt_ids: list[int] | None  # the ids the server tokenized the prompt into (completions)


class Api(Protocol):
    name: str
    path: str
    fields: str  # what a well-formed answer holds, for the error that names a malformed one

    def body(self, prompt: ChatPrompt, processor: str, sampling: dict[str, Any]) -> dict[str, Any]:
        """The request: `sampling` holds /generate's sampling fields, custom_params included."""
        ...

    def reply(self, data: Any) -> ServerReply:
        """The answer; raises KeyError, TypeError or ValueError when it is malformed."""
        ...


def _ids(values: Any) -> list[int] | None:
    return None if values is None else [int(token) for token in values]


class GenerateApi:
    name = "generate"
    path = "/generate"
    fields = "text and meta_info.completion_tokens"

    def body(self, prompt: ChatPrompt, processor: str, sampling: dict[str, Any]) -> dict[str, Any]:
        return {"input_ids": prompt.ids, "custom_logit_processor": processor, "sampling_params": sampling}

    def reply(self, data: Any) -> ServerReply:
        return ServerReply(text=str(data["text"]), completion_tokens=int(data["meta_info"]["completion_tokens"]),
                     output_ids=_ids(data.get("output_ids")), prompt_ids=None)


class CompletionsApi:
    name = "completions"
    path = "/v1/completions"
    fields = "choices[0].text, choices[0].prompt_token_ids and usage.completion_tokens"

    def body(self, prompt: ChatPrompt, processor: str, sampling: dict[str, Any]) -> dict[str, Any]:
        if prompt.text is None:
            raise ValueError("this prompt has no text form")  # the engine refuses such prompts first
        fields = {_COMPLETION_NAMES.get(name, name): value for name, value in sampling.items()
                  if name not in NOT_ON_COMPLETIONS}
        return {"model": COMPLETION_MODEL, "prompt": prompt.text, "custom_logit_processor": processor,
                "return_token_ids": True, **fields}

    def reply(self, data: Any) -> ServerReply:
        choice = data["choices"][0]
        prompt_ids = _ids(choice["prompt_token_ids"])
        return ServerReply(text=str(choice["text"]), completion_tokens=int(data["usage"]["completion_tokens"]),
                     output_ids=_ids(choice.get("token_ids")), prompt_ids=prompt_ids)


APIS: dict[str, Api] = {"generate": GenerateApi(), "completions": CompletionsApi()}

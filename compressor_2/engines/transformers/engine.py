"""The embedded engine: the model in this process, greedy padded batches, one bias row per sequence.

Requests are sorted by prompt length before batching so a batch pads little, and
each row carries its own deltas, so a whole generation of individuals shares batches.
A batch decodes from its prompts' cached keys and values (`prompt_cache.py`), each row
leaving it at its end token (`decode.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np
import torch
from transformers import DynamicCache, LogitsProcessorList, PreTrainedModel

from compressor_2.clusters.vocab import load_vocabulary
from compressor_2.common import ConfigError
from compressor_2.engines.base import Generation, GenerationRequest, Progress
from compressor_2.engines.chat import encode_prompt, prompt_label
from compressor_2.engines.transformers.decode import Decoding, decode
from compressor_2.engines.transformers.prompt_cache import PromptCache, UnsupportedCache
from compressor_2.model import load_causal_lm, load_tokenizer
from compressor_2.steering.bias import gather_index
from compressor_2.steering.hf_processor import DeltaBiasProcessor
from compressor_2.steering.phases import PhaseTables, check_phases, phase_rows, vocabulary_classes

if TYPE_CHECKING:
    from compressor_2.clusters.clusterset import ClusterSet
    from compressor_2.config import Config


def resolve_device(name: str) -> torch.device:
    """'auto' is the GPU when there is one, else the CPU."""
    if name.strip() == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name.strip())
    except RuntimeError:
        raise ConfigError(f"CONFIG_TRANSFORMERS_DEVICE={name!r} is not a torch device") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"CONFIG_TRANSFORMERS_DEVICE={name!r} but torch sees no CUDA GPU (use auto or cpu)")
    return device


class _SpuriousMaskWarning(logging.Filter):
    """transformers >= 5 drops an all-ones attention mask in `generate` (a batch whose
    prompts need no padding, e.g. one question for several genomes). Once a row has
    finished, generate feeds it pad tokens, and GPT-2's forward then warns "We strongly
    recommend passing in an `attention_mask`" in the middle of the progress bars. The
    engine does pass the mask, and a finished row's pad tokens are never read: this one
    message is dropped, and only while the engine generates."""

    MESSAGE = "We strongly recommend passing in an `attention_mask`"

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.MESSAGE)


_SPURIOUS_MASK_WARNING = _SpuriousMaskWarning()


@contextmanager
def _without_spurious_mask_warning() -> Iterator[None]:
    logger = logging.getLogger("transformers.modeling_utils")  # where the warning is logged
    logger.addFilter(_SPURIOUS_MASK_WARNING)
    try:
        yield
    finally:
        logger.removeFilter(_SPURIOUS_MASK_WARNING)


class TransformersEngine:
    """Implements `Engine` with a Hugging Face causal LM loaded through `from_pretrained`
    (a GGUF file's weights dequantised once, when the engine starts)."""

    def __init__(self, model_path: str, token_clusters: np.ndarray, num_clusters: int, *,
                 batch_size: int = 256, max_new_tokens: int = 256, temperature: float = 0.0,
                 device: str = "auto", threads: int = 0, prompt_cache_mb: int = 2048, phases: int = 1) -> None:
        if threads > 0:
            torch.set_num_threads(threads)
        self.model_path = model_path
        self.num_clusters = num_clusters
        self.phases = check_phases(phases)
        self.batch_size = batch_size
        self.device = resolve_device(device)
        self.tokenizer = load_tokenizer(model_path)
        # Counted as build-clusters counts it (a vocabulary may have holes in its ids).
        vocab_size = max(len(self.tokenizer), max(self.tokenizer.get_vocab().values(), default=-1) + 1)
        if len(token_clusters) != vocab_size:
            raise ConfigError(
                f"the cluster map covers {len(token_clusters)} tokens but the tokenizer of "
                f"{model_path!r} has {vocab_size}: rerun build-clusters for this model"
            )
        self.model: PreTrainedModel | None = load_causal_lm(model_path, gpu=self.device.type == "cuda")
        self.model.to(self.device).eval()
        self.token_clusters = torch.as_tensor(np.asarray(token_clusters, dtype=np.int64), device=self.device)
        self.tokenizer.padding_side = "left"
        self.eos_ids = self._eos_ids(token_clusters)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.convert_ids_to_tokens(self.eos_ids[0])
        self.context = getattr(self.model.config, "max_position_embeddings", None)
        self.prompts: PromptCache | None = PromptCache(self.model, prompt_cache_mb << 20)
        self.decoding = Decoding(torch.tensor(self.eos_ids, device=self.device),
                                 gather_index(self.token_clusters, num_clusters), max_new_tokens, temperature,
                                 self._phase_tables(len(token_clusters)))

    def _phase_tables(self, vocab_size: int) -> PhaseTables | None:
        """The phases' DFA on the engine's device, its token classes from the tokenizer's
        vocabulary as build-clusters decodes it; None for one phase (nothing of it runs)."""
        if self.phases == 1:
            return None
        classes = vocabulary_classes(load_vocabulary(self.model_path))
        if len(classes) != vocab_size:
            raise ConfigError(f"{self.model_path!r}: {len(classes)} token classes for a cluster map of {vocab_size}")
        return PhaseTables.make(classes, self.phases, self.device)

    @property
    def max_new_tokens(self) -> int:
        return self.decoding.max_new_tokens

    @property
    def temperature(self) -> float:
        return self.decoding.temperature

    @classmethod
    def from_config(cls, config: Config, clusters: ClusterSet, phases: int = 1) -> TransformersEngine:
        return cls(
            config.model_path, clusters.token_clusters, len(clusters.cluster_ids),
            batch_size=config.transformers_batch_size, max_new_tokens=config.max_new_tokens,
            temperature=config.temperature, device=config.transformers_device,
            threads=config.transformers_threads, prompt_cache_mb=config.transformers_prompt_cache_mb,
            phases=phases,
        )

    def _eos_ids(self, token_clusters: np.ndarray) -> list[int]:
        """The ids generation stops at: generation_config's (int or list), the tokenizer's, and
        every other token of cluster 0 (a chat model's other end markers: SmolLM2's
        `<|endoftext|>` beside its eos `<|im_end|>`), so that what the EOS delta raises ends
        the answer whichever end token the model emits."""
        configured = self.model.generation_config.eos_token_id
        ids = [configured] if isinstance(configured, int) else list(configured or [])
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        ids += np.flatnonzero(np.asarray(token_clusters) == 0).tolist()
        ids = list(dict.fromkeys(ids))
        if not ids:
            raise ConfigError(f"CONFIG_MODEL_PATH={self.model_path!r}: the model defines no EOS token")
        return ids

    def encode(self, prompt: str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    def generate(self, requests: Sequence[GenerationRequest],
                 progress: Progress | None = None) -> list[Generation]:
        if self.model is None:
            raise RuntimeError("the engine is closed")
        for i, request in enumerate(requests):
            if len(request.deltas) != self.phases * self.num_clusters:
                raise ValueError(f"request {i}: {len(request.deltas)} deltas for {self.num_clusters} clusters"
                                 + (f" in {self.phases} phases" if self.phases > 1 else ""))
        encoded = [self.encode(r.prompt) for r in requests]
        self._check_context(requests, encoded)
        order = sorted(range(len(requests)), key=lambda i: len(encoded[i]))
        results: list[Generation | None] = [None] * len(requests)
        for start in range(0, len(order), self.batch_size):
            batch = order[start:start + self.batch_size]
            outputs = self._generate_batch([encoded[i] for i in batch], [requests[i].deltas for i in batch])
            for i, generation in zip(batch, outputs):
                results[i] = generation
            if progress is not None:
                progress(len(batch))
        return [r for r in results if r is not None]

    def _check_context(self, requests: Sequence[GenerationRequest], encoded: list[list[int]]) -> None:
        if self.context is None:
            return
        for i, ids in enumerate(encoded):
            if len(ids) + self.max_new_tokens > self.context:
                raise ConfigError(
                    f"request {i} ({prompt_label(requests[i].prompt)}): a prompt of "
                    f"{len(ids)} tokens plus CONFIG_MAX_NEW_TOKENS="
                    f"{self.max_new_tokens} exceeds the model's context of {self.context} tokens; "
                    "lower CONFIG_EVIDENCE_MAX_CHARS or CONFIG_MAX_NEW_TOKENS"
                )

    @torch.inference_mode()
    def _generate_batch(self, encoded: list[list[int]], deltas: list[tuple[float, ...]]) -> list[Generation]:
        """The batch decoded from its prompts' caches, each row leaving at its end token;
        through `generate` from scratch for a model whose cache cannot be padded."""
        # An all-zero batch (the unsteered baseline) needs no bias at all.
        rows = torch.tensor(deltas, dtype=torch.float32, device=self.device) \
            if any(any(row) for row in deltas) else None
        cache = self._prompt_cache(encoded)
        if cache is None:
            return [self._finish(row) for row in self._generate_from_scratch(encoded, rows)]
        if rows is None:
            table = None
        elif self.phases > 1:
            table = phase_rows(rows, self.phases)  # a row per DFA state, each with the zero column
        else:
            table = torch.nn.functional.pad(rows, (0, 1))  # the unsteered tokens' zero column
        return [self._finish(row) for row in decode(self.model, cache, encoded, table, self.decoding)]

    def _generate_from_scratch(self, encoded: list[list[int]], rows: torch.Tensor | None) -> list[list[int]]:
        padded = self.tokenizer.pad({"input_ids": encoded}, padding=True, return_tensors="pt").to(self.device)
        processors = LogitsProcessorList(
            [] if rows is None else [DeltaBiasProcessor(rows, self.token_clusters, self.decoding.phases)])
        sampling = {"do_sample": True, "temperature": self.temperature, "top_p": 1.0, "top_k": 0} \
            if self.temperature > 0 else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        with _without_spurious_mask_warning():
            output = self.model.generate(
                **padded, logits_processor=processors, max_new_tokens=self.max_new_tokens,
                eos_token_id=self.eos_ids, pad_token_id=self.tokenizer.pad_token_id, **sampling,
            )
        return output[:, padded["input_ids"].shape[1]:].tolist()

    def _prompt_cache(self, encoded: list[list[int]]) -> DynamicCache | None:
        """The batch's prompts but their last tokens, from the prompt cache (an empty
        cache when every prompt is one token); None for a model whose cache cannot be
        padded (it then prefills every row)."""
        if self.prompts is None:
            return None
        try:
            cache = self.prompts.batch(encoded, self.max_new_tokens)
        except UnsupportedCache as exc:
            logging.getLogger("compressor_2.engines").info("prompt cache off: %s", exc)
            self.prompts = None
            return None
        return DynamicCache() if cache is None else cache

    def _finish(self, tokens: list[int]) -> Generation:
        """Cut at the first EOS; like SGLang's completion_tokens, the EOS itself counts."""
        eos = set(self.eos_ids)
        end = next((k for k, t in enumerate(tokens) if t in eos), None)
        answer = tokens if end is None else tokens[:end]
        text = self.tokenizer.decode(answer, skip_special_tokens=True)
        return Generation(text=text, completion_tokens=len(tokens) if end is None else end + 1)

    def close(self) -> None:
        if self.model is None:
            return
        on_gpu = self.device.type == "cuda"
        self.model = None
        if on_gpu:
            torch.cuda.empty_cache()

"""CONFIG_REFLECTOR_* -> a reflector: a name -> proposer factory dict, wrapped in the one
set of validation rules and the prompt log."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from compressor_2.archive import CallRecord
from compressor_2.clusters.tokens import AnswerTokens
from compressor_2.judges import NumericJudge
from compressor_2.reflector.base import Proposer
from compressor_2.reflector.evidence import PaddingEvidence
from compressor_2.reflector.prompt_log import PROMPT_DIR, PromptLog
from compressor_2.reflector.validation import ValidatingReflector

if TYPE_CHECKING:
    from compressor_2.clusters.clusterset import ClusterSet
    from compressor_2.config import Config

# (config, the run's answers retokenised through the cluster map) -> a proposer
ProposerFactory = Callable[["Config", AnswerTokens], Proposer]


def _local(config: Config, tokens: AnswerTokens) -> Proposer:
    from compressor_2.reflector.local import LocalProposer

    return LocalProposer(tokens, config.local_reflector_step, config.seed)


def _openai(config: Config, tokens: AnswerTokens) -> Proposer:
    del tokens
    from compressor_2.reflector.openai_reflector import OpenAIProposer

    return OpenAIProposer.from_config(config)


PROPOSERS: dict[str, ProposerFactory] = {"local": _local, "openai": _openai}


def padding_evidence(config: Config, tokens: AnswerTokens) -> PaddingEvidence | None:
    """The stop oracle's evidence for the reflectors (CONFIG_REFLECTOR_PADDING_EVIDENCE), made
    only with the numeric judge: any other would be asked once per prefix of every answer."""
    if not config.reflector_padding_evidence or config.judge != "numeric":
        return None
    from compressor_2.clusters.vocab import load_vocabulary
    from compressor_2.steering.phases import vocabulary_classes

    return PaddingEvidence(tokens, NumericJudge(tolerance=config.correctness_tolerance), config.delta_phases,
                           lambda: vocabulary_classes(load_vocabulary(config.model_path)))


def make_reflector(config: Config, clusters: ClusterSet, recorder: Callable[[CallRecord], None] | None = None,
                   tokens: AnswerTokens | None = None) -> ValidatingReflector:
    """The configured reflector, every attempt logged under output_dir/reflector_prompts/
    and, with a `recorder`, in the run archive. `tokens`: the run's, when the strategy
    retokenises answers too. The caller closes it."""
    tokens = tokens or AnswerTokens.from_config(config, clusters)
    proposer = PROPOSERS[config.reflector](config, tokens)
    label = f"openai {config.reflector_model}" if config.reflector == "openai" else proposer.name
    log = PromptLog(config.output_dir / PROMPT_DIR, label)
    return ValidatingReflector(proposer, clusters.descriptions, config.reflector_answer_max_chars, log, recorder,
                               config.reflector_max_consecutive_failures if config.reflector == "openai" else 0,
                               padding_evidence(config, tokens))

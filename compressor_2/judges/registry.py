"""Judges by name, as chosen by CONFIG_JUDGE_*."""

from __future__ import annotations

from collections.abc import Callable

from compressor_2.common import ConfigError
from compressor_2.config import Config
from compressor_2.judges.base import Judge
from compressor_2.judges.hybrid import HybridJudge
from compressor_2.judges.llm import LLMJudge
from compressor_2.judges.numeric import NumericJudge


def _numeric(config: Config) -> NumericJudge:
    return NumericJudge(tolerance=config.correctness_tolerance)


JUDGES: dict[str, Callable[[Config], Judge]] = {
    "numeric": _numeric,
    "llm": LLMJudge.from_config,
    "hybrid": lambda config: HybridJudge(_numeric(config), LLMJudge.from_config(config)),
}


def make_judge(config: Config) -> Judge:
    try:
        factory = JUDGES[config.judge]
    except KeyError:
        raise ConfigError(f"unknown judge {config.judge!r}; use one of {', '.join(JUDGES)}") from None
    return factory(config)

"""CONFIG_ENGINE_* -> an engine: a name -> factory dict, imported lazily so the server
engines cost nothing (and need nothing) when the transformers engine is chosen."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from compressor_2.engines.base import Engine, Generation, GenerationRequest, Progress

if TYPE_CHECKING:
    from compressor_2.clusters.clusterset import ClusterSet
    from compressor_2.config import Config

# (config, clusters, every prompt the run will send by example id) -> engine. The SGLang
# engine checks the prompts against the served context before any work; the transformers
# engine checks each call's prompts against the model it holds.
EngineFactory = Callable[["Config", "ClusterSet", Mapping[str, str]], Engine]


def _transformers(config: Config, clusters: ClusterSet, prompts: Mapping[str, str]) -> Engine:
    from compressor_2.engines.transformers.engine import TransformersEngine

    del prompts
    return TransformersEngine.from_config(config, clusters, **phases(config))


def _sglang(config: Config, clusters: ClusterSet, prompts: Mapping[str, str]) -> Engine:
    from compressor_2.engines.sglang.engine import SGLangEngine

    return SGLangEngine.from_config(config, clusters, prompts=prompts, **phases(config))


def phases(config: Config) -> dict[str, int]:
    """The engine's `phases` argument (its deltas: that many vectors, phase-major), passed only
    when CONFIG_DELTA_PHASES asks for several: one phase is how every engine always ran."""
    return {"phases": config.delta_phases} if config.delta_phases > 1 else {}


def _logit_bias(config: Config, clusters: ClusterSet, prompts: Mapping[str, str]) -> Engine:
    from compressor_2.engines.logit_bias.engine import LogitBiasEngine

    return LogitBiasEngine.from_config(config, clusters, prompts=prompts)


ENGINES: dict[str, EngineFactory] = {"transformers": _transformers, "sglang": _sglang, "logit_bias": _logit_bias}


def make_engine(config: Config, clusters: ClusterSet, prompts: Mapping[str, str] | None = None) -> Engine:
    """The configured engine, ready to generate `prompts` (by example id); the caller closes it."""
    return ENGINES[config.engine](config, clusters, prompts or {})


class LazyEngine:
    """Makes the configured engine on the first `generate`: a resumed run whose answers
    are all in the archive, or one stopped by its budget, never loads the model."""

    def __init__(self, config: Config, clusters: ClusterSet, prompts: Mapping[str, str] | None = None) -> None:
        self._factory = lambda: make_engine(config, clusters, prompts)
        self._engine: Engine | None = None

    def generate(self, requests: Sequence[GenerationRequest], progress: Progress | None = None) -> list[Generation]:
        if self._engine is None:
            self._engine = self._factory()
        return self._engine.generate(requests, progress)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()

"""Engines turn (prompt, deltas) pairs into answers (`Engine`, `make_engine`, `LazyEngine`), chosen by name; `check_model` before any work."""

from compressor_2.engines.base import Engine, GenerationRequest, Progress
from compressor_2.engines.preflight import check_model
from compressor_2.engines.registry import LazyEngine, make_engine
from compressor_2.engines.sglang.server import LOG_NAME

__all__ = ["LOG_NAME", "Engine", "GenerationRequest", "LazyEngine", "Progress", "check_model", "make_engine"]

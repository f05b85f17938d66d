"""The reflector (`Reflector`, `make_reflector`, its requests): every LLM call of the loop, every prompt."""

from compressor_2.reflector.base import (
    MergeRequest, MutationRequest, MutationResult, Outstanding, PopulationMember, Reflector, Selected, SelectionRequest,
    VectorRequest, VectorResult,
)
from compressor_2.reflector.limits import keep_recent
from compressor_2.reflector.prompt_log import PROMPT_DIR
from compressor_2.reflector.prompts import estimated_call_tokens
from compressor_2.reflector.registry import make_reflector

__all__ = ["PROMPT_DIR", "MergeRequest", "MutationRequest", "MutationResult", "Outstanding", "PopulationMember",
           "Reflector", "Selected", "SelectionRequest", "VectorRequest", "VectorResult", "estimated_call_tokens",
           "keep_recent", "make_reflector"]

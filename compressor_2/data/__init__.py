"""FinanceBench-shaped datasets (`Example`, the pool and held-out questions) and the prompts built from them."""

from compressor_2.data.example import Example
from compressor_2.data.financebench import (
    as_asked, examples_from_config, holdout_examples, load_examples, parse_indices,
)
from compressor_2.data.prompt import DEFAULT_TEMPLATE, INSTRUCTED, build_prompt, instructed, uninstructed

__all__ = ["DEFAULT_TEMPLATE", "INSTRUCTED", "Example", "as_asked", "build_prompt", "examples_from_config",
           "holdout_examples", "instructed", "load_examples", "parse_indices", "uninstructed"]

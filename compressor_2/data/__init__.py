"""FinanceBench-shaped datasets (`Example`, the pool and held-out questions) and the prompts built from them."""

from compressor_2.data.example import Example
from compressor_2.data.financebench import examples_from_config, holdout_examples, load_examples, parse_indices
from compressor_2.data.prompt import DEFAULT_TEMPLATE, build_prompt

__all__ = ["DEFAULT_TEMPLATE", "Example", "build_prompt", "examples_from_config", "holdout_examples", "load_examples",
           "parse_indices"]

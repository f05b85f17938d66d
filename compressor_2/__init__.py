"""compressor_2: evolve per-cluster logit steering deltas so an LLM answers briefly and correctly."""

__version__ = "0.1.0"

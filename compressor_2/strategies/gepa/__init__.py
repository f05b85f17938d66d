"""`CONFIG_STRATEGY="gepa"`, GEPA's proposers over delta vectors: its decisions (`strategy`) and the Pareto
arithmetic (`pareto`). What the registry reads is here."""

from compressor_2.strategies.gepa.strategy import FILES, IDENTITY, estimate, make, read_options

__all__ = ["FILES", "IDENTITY", "estimate", "make", "read_options"]

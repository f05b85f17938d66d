"""`CONFIG_STRATEGY="ga"`, the genetic algorithm: its decisions (`strategy`), its individuals and their operators
(`individual`), its round robin, pairs, options and selections (`operators`). What the registry reads is here."""

from compressor_2.strategies.ga.strategy import FILES, IDENTITY, SENTINELS, estimate, make, read_options

__all__ = ["FILES", "IDENTITY", "SENTINELS", "estimate", "make", "read_options"]

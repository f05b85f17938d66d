"""`CONFIG_STRATEGY="archive"`, the weighted candidate archive: its decisions (`strategy`) and their arithmetic
(`ops`). What the registry reads is here, and the meta key of its viability rule that `show` reads."""

from compressor_2.strategies.archive.strategy import FILES, IDENTITY, VIABILITY_META, estimate, make, read_options

__all__ = ["FILES", "IDENTITY", "VIABILITY_META", "estimate", "make", "read_options"]

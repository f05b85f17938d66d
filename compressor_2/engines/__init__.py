"""Engines turn (prompt, deltas) pairs into answers; chosen by name from the config."""

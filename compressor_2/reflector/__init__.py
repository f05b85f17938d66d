"""Reflectors propose mutations and merge scratchpads; every LLM call of the loop sits here."""

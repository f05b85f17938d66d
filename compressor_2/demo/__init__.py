"""The embedded default: a synthetic FinanceBench-shaped task (`task`) and a small model trained on it (`train`)."""

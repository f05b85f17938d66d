"""The embedded default: a synthetic FinanceBench-shaped task and a small model trained on it."""

"""FinanceBench-shaped datasets and the prompts built from them."""

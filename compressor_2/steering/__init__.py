"""The logit bias the deltas become: the one place the steering arithmetic lives (the
bias rows, the transformers and SGLang processors, the standalone processor module)."""

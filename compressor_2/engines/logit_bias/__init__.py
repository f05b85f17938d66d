"""The engine for OpenAI-compatible servers that honour logit_bias (`engine.LogitBiasEngine`), and what it asks of a server first (`server`)."""

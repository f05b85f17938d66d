"""The transformers engine (`engine.TransformersEngine`) and what it stands on: the prompt cache (each prompt prefilled once) and the decode loop (each row only until its own end)."""

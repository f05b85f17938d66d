"""The model CONFIG_MODEL_PATH names: loaded as transformers loads it (`pretrained`), compared by what it holds
(`digest`), and what attached servers say they serve (`served`)."""

from compressor_2.model.digest import file_digest, model_digest, model_files
from compressor_2.model.pretrained import (
    check_model_path, generation_eos, gguf_file, load_causal_lm, load_tokenizer, model_context,
)
from compressor_2.model.served import served_models

__all__ = ["check_model_path", "file_digest", "generation_eos", "gguf_file", "load_causal_lm", "load_tokenizer",
           "model_context", "model_digest", "model_files", "served_models"]

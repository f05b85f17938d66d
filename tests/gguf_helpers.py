"""A tiny GGUF model written by the `gguf` package itself: a random llama with a byte-level
BPE tokenizer in SmolLM2's shape (ChatML template with a default system turn, eos
`<|im_end|>`, `<|endoftext|>` a control token beside it), its 2-D weights Q8_0 as a real
quantised file's are. Written in well under a second, loaded through transformers' own
`from_pretrained(folder, gguf_file=...)`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2, as in SmolLM2
EOS = "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "Revenue was $1,577 million in FY2018, up 3.2% from $1,528 million.",
    "Based on the information provided, net income was 5,363 million dollars.",
    "Yes. The company's operating margin exceeded 20% in 2019.",
    "No, capital expenditure did not exceed $2,000 million.",
    "The answer is 1.9%. I hope this helps! What was the total?",
    "Total assets (in millions): 36,500; total liabilities: 26,652.",
    "system user assistant You are a helpful assistant.",
]
# llama metadata: small enough to write and load in a fraction of a second.
HIDDEN, HEADS, KV_HEADS, FFN, LAYERS, CONTEXT = 32, 4, 2, 64, 2, 2048


def _bpe(vocab_size: int) -> tuple[list[str], list[str]]:
    """Tokens (by id) and merges of a byte-level BPE trained on CORPUS, SPECIAL first."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def write_tiny_gguf(path: Path, *, architecture: str = "llama", vocab_size: int = 320,
                    weight_type: str = "Q8_0", seed: int = 0,
                    without: tuple[str, ...] = (), context: int = CONTEXT) -> Path:
    """Write the tiny model to `path` (a `.gguf`). `architecture` is what the header calls it
    (the tensors are a llama's whatever it says); `weight_type` is the GGML type of every 2-D
    weight, written as raw blocks when the `gguf` package cannot quantise to it; the tensors
    named in `without` are left out (a damaged file); `context` is the context length its
    header declares."""
    import gguf

    tokens, merges = _bpe(vocab_size)
    qtype = gguf.GGMLQuantizationType[weight_type]
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny test llama")
    writer.add_context_length(context)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    file_type = {"F32": "ALL_F32", "F16": "MOSTLY_F16"}.get(weight_type, f"MOSTLY_{weight_type}")
    if file_type in gguf.LlamaFileType.__members__:
        writer.add_file_type(gguf.LlamaFileType[file_type])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in SPECIAL else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index(EOS))
    writer.add_unk_token_id(tokens.index("<|endoftext|>"))
    writer.add_pad_token_id(tokens.index(EOS))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    rng = np.random.default_rng(seed)

    def weight(name: str, rows: int, cols: int) -> None:
        if name in without:
            return
        data = rng.normal(0.0, 0.2, size=(rows, cols)).astype(np.float32)
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, data)
            return
        try:
            writer.add_tensor(name, gguf.quantize(data, qtype), raw_dtype=qtype)
        except NotImplementedError:  # a type gguf cannot write: zero blocks of its size
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            raw = np.zeros((rows, cols // block * size), dtype=np.uint8)
            writer.add_tensor(name, raw, raw_dtype=qtype)

    head_dim = HIDDEN // HEADS
    weight("token_embd.weight", len(tokens), HIDDEN)  # tied: no output.weight
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    for layer in range(LAYERS):
        block = f"blk.{layer}"
        for norm in (f"{block}.attn_norm.weight", f"{block}.ffn_norm.weight"):
            if norm not in without:
                writer.add_tensor(norm, np.ones(HIDDEN, dtype=np.float32))
        weight(f"{block}.attn_q.weight", HIDDEN, HIDDEN)
        weight(f"{block}.attn_k.weight", KV_HEADS * head_dim, HIDDEN)
        weight(f"{block}.attn_v.weight", KV_HEADS * head_dim, HIDDEN)
        weight(f"{block}.attn_output.weight", HIDDEN, HIDDEN)
        weight(f"{block}.ffn_gate.weight", FFN, HIDDEN)
        weight(f"{block}.ffn_up.weight", FFN, HIDDEN)
        weight(f"{block}.ffn_down.weight", HIDDEN, FFN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

"""Configs whose clusters live in a temp folder, and a byte-level BPE with whole-word tokens."""

from __future__ import annotations

from pathlib import Path

from compressor_2.config import Config, load_config
from tests.conftest import REPO


def cluster_config(folder: Path, model_dir: Path, name: str = "test.config", **settings: object) -> Config:
    """The defconfig, with cluster artifacts below `folder` and `settings` (NAME=value)."""
    values: dict[str, object] = {
        "MODEL_PATH": str(model_dir),
        "CLUSTER_DIR": str(folder / "clusters"),
        "CLUSTER_DESCRIPTIONS_PATH": str(folder / "clusters" / "cluster_descriptions.json"),
        "INITIAL_DELTAS_PATH": str(folder / "clusters" / "initial_deltas.json"),
        "NUM_CLUSTERS": 3,
        "PCA_COMPONENTS": 8,
        **settings,
    }
    kept = [line for line in (REPO / "defconfig").read_text().splitlines()
            if line.split("=", 1)[0].removeprefix("CONFIG_") not in values]
    assigned = [f'CONFIG_{k}="{v}"' if isinstance(v, str) else f"CONFIG_{k}={'y' if v else 'n'}"
                if isinstance(v, bool) else f"CONFIG_{k}={v}" for k, v in values.items()]
    path = folder / name
    path.write_text("\n".join(kept + assigned) + "\n")
    return load_config(path)


WORD_CORPUS = [
    "Revenue rose to $1,000 million in FY2018, up 3.5% from 2017.",
    "Costs were 1,000 and margin 3.5% (12) with x2 growth in FY2018.",
    "It costs $ 5 = 2 + 3 and the answer is 42 . Done ,",
]


def build_word_bpe(directory: Path, eos_token: str = "<|endoftext|>") -> Path:
    """A byte-level BPE whose pre-tokenizer keeps whole space-separated words, so the
    vocabulary has tokens such as `Ġ1,000`, `Ġ3.5%`, `ĠFY2018` and `Ġ$`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r" ?\S+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", "<|im_end|>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(WORD_CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos_token, pad_token="<pad>")
    fast.save_pretrained(directory)
    return directory

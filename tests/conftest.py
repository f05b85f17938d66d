"""Shared fixtures: a tiny random causal LM saved to disk, and the FinanceBench folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FINANCEBENCH_DIR = REPO.parent / "shared" / "data" / "financebench"

# Tests run on 2 shared cores: keep torch from oversubscribing them.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_CORPUS = [
    "Revenue was $1,577 million in FY2018, up 3.2% from $1,528 million.",
    "Based on the information provided, net income was 5,363 million dollars.",
    "Yes. The company's operating margin exceeded 20% in 2019.",
    "No, capital expenditure did not exceed $2,000 million.",
    "The answer is 1.9%. I hope this helps!",
    "Total assets (in millions): 36,500; total liabilities: 26,652.",
]


def build_tiny_model(directory: Path, vocab_size: int = 300, n_layer: int = 2) -> Path:
    """A randomly initialised GPT-2 with a byte-level BPE tokenizer trained on a few
    finance sentences, saved with `save_pretrained` so tests load it through the real
    `from_pretrained` path."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<pad>")
    fast.save_pretrained(directory)

    import torch

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(fast), n_positions=256, n_embd=32, n_layer=n_layer, n_head=2,
        bos_token_id=fast.eos_token_id, eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    GPT2LMHeadModel(config).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def financebench_dir() -> Path:
    if not (FINANCEBENCH_DIR / "financebench_open_source.jsonl").is_file():
        pytest.skip(f"FinanceBench data not found at {FINANCEBENCH_DIR} (only in the dev workspace)")
    return FINANCEBENCH_DIR


@pytest.fixture(scope="session")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The evolution tests' training file and cluster artifacts, built once per session."""
    from tests.test_evolution_support import shared_dir

    return shared_dir(tmp_path_factory)


@pytest.fixture(scope="session")
def shared_eight_clusters(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Like `shared`, for configs with NUM_CLUSTERS="6" (cluster ids 0..7), built once per
    session by the first run that uses it."""
    return tmp_path_factory.mktemp("eight_clusters")


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, shared: Path, tiny_model_dir: Path) -> Path:
    """The output dir of the shared 4-generation run (GA_DEFAULTS) that no one interrupted;
    tests only read it."""
    from tests.test_evolution_support import default_run

    return default_run(tmp_path_factory, shared, tiny_model_dir)

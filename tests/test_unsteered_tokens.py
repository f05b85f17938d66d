"""Special and added tokens are never steered: on tokenizers with Qwen-like added tokens and
Llama-like reserved tokens, every special or added token but EOS is in no k-means cluster
(UNSTEERED in the map), the build records and prints them, and their bias is 0 under any
deltas, as is every logit column past the tokenizer, on every path the bias takes: the
transformers engine's bias rows, the SGLang processor by reference, and the standalone
module `generate-processor` writes."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from compressor_2.clusters.builder import build_clusters
from compressor_2.clusters.clusterset import ArtifactPaths, ClusterSet
from compressor_2.clusters.layout import UNSTEERED
from compressor_2.clusters.vocab import load_vocabulary
from compressor_2.deltas import DELTA_BOUND
from compressor_2.steering.bias import bias_matrix
from compressor_2.steering.generate import render_processor
from compressor_2.steering.processor import SteeringProcessor, custom_params
from tests.cluster_helpers import cluster_config
from tests.conftest import _CORPUS

QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
# Added, but not marked special (as in Qwen2.5's tokenizer): unsteered all the same.
QWEN_ADDED = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
              "<|repo_name|>", "<|file_sep|>"]
LLAMA_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", *(f"<|reserved_special_token_{i}|>" for i in range(248)),
                 "<|finetune_right_pad_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                 "<|python_tag|>"]
WIDER = 64  # logit columns past the tokenizer, as a checkpoint's padded embedding has


def _tokenizer(directory: Path, special: list[str], added: list[str], eos: str, generation_eos: list[str]) -> Path:
    """A byte-level BPE over the finance corpus with these special and added tokens, and a
    generation config whose eos ids are `generation_eos` (as Qwen's and Llama's have)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tok.add_special_tokens(special)
    tok.add_tokens([AddedToken(text, special=False) for text in added])
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos).save_pretrained(directory)
    (directory / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [tok.token_to_id(t) for t in generation_eos]}))
    return directory


TOKENIZERS = {
    "qwen": dict(special=QWEN_SPECIAL, added=QWEN_ADDED, eos="<|im_end|>",
                 generation_eos=["<|im_end|>", "<|endoftext|>"]),
    "llama": dict(special=LLAMA_SPECIAL, added=[], eos="<|eot_id|>",
                  generation_eos=["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"]),
}


@pytest.fixture(scope="module", params=sorted(TOKENIZERS))
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(the tokenizer's spec, its directory, its built clusters, what the build printed)."""
    spec = TOKENIZERS[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    model = _tokenizer(folder / "tokenizer", **spec)
    config = cluster_config(folder, model)
    clusters = build_clusters(config)
    return spec, model, config, clusters


def _ids(model: Path, texts: list[str]) -> set[int]:
    vocab = load_vocabulary(str(model))
    return {vocab.tokens.index(text) for text in texts}


def test_every_special_or_added_token_but_eos_is_in_no_cluster(built):
    spec, model, _, clusters = built
    eos = _ids(model, spec["generation_eos"])
    unsteered = _ids(model, spec["special"] + spec["added"]) - eos
    token_clusters = clusters.token_clusters
    assert set(np.flatnonzero(token_clusters == UNSTEERED)) == unsteered
    assert set(np.flatnonzero(token_clusters == 0)) == eos
    assert all(token_clusters[i] == UNSTEERED for i in unsteered)
    # The k-means clusters and the numbers cluster hold ordinary text only.
    steered = np.flatnonzero(token_clusters >= 1)
    assert not unsteered & set(steered) and len(steered) > 200


def test_the_build_records_the_unsteered_tokens_and_says_so(built, capsys):
    spec, model, config, clusters = built
    paths = ArtifactPaths.from_config(config)
    record = json.loads(paths.record.read_text())
    count = int((clusters.token_clusters == UNSTEERED).sum())
    assert record["unsteered"]["size"] == count
    assert set(record["unsteered"]["tokens"]) <= set(spec["special"] + spec["added"])
    descriptions = json.loads(paths.descriptions.read_text())
    assert sum(entry["size"] for entry in descriptions.values()) == len(clusters.token_clusters) - count
    capsys.readouterr()
    build_clusters(config)  # the cached set: its one line names them too
    assert f"{count:,} special/added tokens unsteered" in capsys.readouterr().out


def _deltas_draws(clusters: ClusterSet) -> list[list[float]]:
    rng = random.Random(0)
    width = len(clusters.cluster_ids)
    return [[rng.uniform(-DELTA_BOUND, DELTA_BOUND) for _ in range(width)],
            [-DELTA_BOUND] * width, [DELTA_BOUND] * width, [1000.0] * width]


def _check_bias(bias: torch.Tensor, deltas: list[float], token_clusters: np.ndarray) -> None:
    """Each token's bias is its cluster's delta; unsteered tokens and the columns past the
    tokenizer get exactly 0."""
    vocab = len(token_clusters)
    mapped = token_clusters >= 0
    expected = np.zeros(vocab, dtype=np.float32)
    expected[mapped] = np.asarray(deltas, dtype=np.float32)[token_clusters[mapped]]
    assert torch.equal(bias[:vocab], torch.from_numpy(expected))
    assert (bias[:vocab][torch.from_numpy(token_clusters == UNSTEERED)] == 0).all() and (bias[vocab:] == 0).all()


def test_the_transformers_bias_of_unsteered_tokens_and_padding_columns_is_zero(built):
    _, _, _, clusters = built
    width = len(clusters.token_clusters) + WIDER
    for deltas in _deltas_draws(clusters):
        bias = bias_matrix(torch.tensor([deltas]), torch.from_numpy(clusters.token_clusters), width)[0]
        _check_bias(bias, deltas, clusters.token_clusters)


def test_the_sglang_processor_leaves_unsteered_tokens_and_padding_columns_alone(built):
    _, _, _, clusters = built
    draws = _deltas_draws(clusters)
    logits = torch.zeros(len(draws), len(clusters.token_clusters) + WIDER)
    steered = SteeringProcessor()(logits, [custom_params(deltas, clusters) for deltas in draws])
    for row, deltas in zip(steered, draws):
        _check_bias(row, deltas, clusters.token_clusters)


def test_the_generated_standalone_processor_leaves_them_alone_too(built, tmp_path: Path):
    _, _, _, clusters = built
    deltas = _deltas_draws(clusters)[0]
    namespace: dict[str, object] = {"__name__": "generated"}
    exec(compile(render_processor(deltas, clusters, tmp_path / "d.json", "processor"), "processor.py", "exec"),
         namespace)
    logits = torch.zeros(2, len(clusters.token_clusters) + WIDER)
    steered = namespace["SteeringProcessor"]()(logits, [None, {"deltas": [DELTA_BOUND] * len(deltas)}])
    _check_bias(steered[0], deltas, clusters.token_clusters)
    _check_bias(steered[1], [DELTA_BOUND] * len(deltas), clusters.token_clusters)


def test_the_shipped_demo_models_chat_tokens_are_unsteered():
    vocab = load_vocabulary(str(Path(__file__).resolve().parent.parent / "compressor_2" / "demo" / "model"))
    assert {vocab.tokens[i] for i in vocab.unsteered_ids} == {"<pad>", "<|user|>", "<|assistant|>"}
    assert {vocab.tokens[i] for i in vocab.eos_ids} == {"<|endoftext|>"}

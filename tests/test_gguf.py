"""A GGUF file as CONFIG_MODEL_PATH (issue Y item 1): build-clusters, evaluate, evolve,
generate-processor and the model digest take it, on a tiny llama each test session writes
with the `gguf` package (tests/gguf_helpers.py), loaded through transformers' own GGUF path."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from compressor_2.cli import main
from compressor_2.clusters.builder import build_clusters
from compressor_2.config import load_config
from compressor_2.config.sglang import same_model
from compressor_2.engines.base import GenerationRequest
from compressor_2.engines.transformers.engine import TransformersEngine
from compressor_2.model import model_digest
from tests.test_evolution_support import write_config
from tests.gguf_helpers import write_tiny_gguf

MAX_NEW_TOKENS = 8


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model as one file, in a folder of its own."""
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf_model") / "tiny-llama.Q8_0.gguf")


@pytest.fixture(scope="module")
def work(gguf_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder whose .config names the GGUF, its clusters built once."""
    folder = tmp_path_factory.mktemp("gguf_run")
    write_config(folder, folder, gguf_model, NGEN="1", MAX_NEW_TOKENS=str(MAX_NEW_TOKENS), NUM_CLUSTERS="2",
                 PCA_COMPONENTS="4")
    return folder


def config_path(work: Path) -> str:
    return str(work / "test.config")


def ids_of(tokenizer_tokens: list[str], *names: str) -> set[int]:
    return {tokenizer_tokens.index(name) for name in names}


@pytest.mark.slow
def test_build_clusters_reads_the_tokenizer_and_every_end_token_from_the_file(work, gguf_model, capsys):
    """Cluster 0 holds both of SmolLM2's end tokens: `<|im_end|>`, the file's eos, and
    `<|endoftext|>`; `<|im_start|>` is in no cluster. A rebuild with the file unchanged
    reads nothing of it."""
    from compressor_2.model import load_tokenizer

    assert main(["build-clusters", "--config", config_path(work)]) == 0, capsys.readouterr().err
    assert "built 4 clusters for 320 tokens" in capsys.readouterr().out
    clusters = build_clusters(load_config(config_path(work)))
    tokens = load_tokenizer(str(gguf_model)).convert_ids_to_tokens(list(range(320)))
    assert set(np.flatnonzero(clusters.token_clusters == 0)) == ids_of(tokens, "<|im_end|>", "<|endoftext|>")
    assert set(np.flatnonzero(clusters.token_clusters < 0)) == ids_of(tokens, "<|im_start|>")
    record = json.loads((work / "clusters" / "fingerprint.json").read_text())
    assert record["tokenizer_files"] is not None  # the warm path needs no tokenizer
    assert "clusters up to date: 320 tokens in 4 clusters" in capsys.readouterr().out


@pytest.mark.slow
def test_evaluate_answers_with_the_dequantised_model(work, gguf_model, capsys):
    out = work / "baseline.json"
    assert main(["evaluate", "--config", config_path(work), "--out", str(out)]) == 0, capsys.readouterr().err
    report = json.loads(out.read_text())
    assert report["model_path"] == str(gguf_model) and report["engine"] == "transformers"
    assert len(report["records"]) == 3
    assert all(1 <= r["tokens"] <= MAX_NEW_TOKENS for r in report["records"])


@pytest.mark.slow
def test_evolve_runs_on_the_file_and_deploys_its_processor(work, gguf_model, capsys):
    assert main(["evolve", "--config", config_path(work)]) == 0, capsys.readouterr().err
    out = work / "out"
    assert (out / "deltas_best.json").is_file() and (out / "processor_best.py").is_file()
    processor = work / "processor.py"
    assert main(["generate-processor", "--config", config_path(work), "--deltas", str(out / "deltas_best.json"),
                 "--out", str(processor)]) == 0, capsys.readouterr().err
    assert "cluster map of 320 tokens embedded" in capsys.readouterr().out
    compile(processor.read_text(), str(processor), "exec")


def test_the_engine_stops_at_every_token_of_cluster_0_not_only_at_the_files_eos(gguf_model):
    """`<|endoftext|>` is not the file's eos (`<|im_end|>` is), but it is an end token of
    cluster 0: an answer that emits it ends there, as SGLang's answer does at a stop id."""
    from compressor_2.model import load_tokenizer

    tokenizer = load_tokenizer(str(gguf_model))
    clusters = np.ones(len(tokenizer), dtype=np.int64)
    clusters[tokenizer.convert_tokens_to_ids("<|endoftext|>")] = 0  # the eos <|im_end|> is in cluster 1
    engine = TransformersEngine(str(gguf_model), clusters, 2, max_new_tokens=MAX_NEW_TOKENS, device="cpu")
    try:
        [forced] = engine.generate([GenerationRequest("What was revenue?", (30.0, -30.0))])
    finally:
        engine.close()
    assert (forced.completion_tokens, forced.text) == (1, "")


@pytest.mark.parametrize(("architecture", "weight_type", "named"), [
    ("grok9", "Q8_0", r"architecture 'grok9', quantisation Q8_0\): GGUF model with architecture grok9 is not "),
    ("llama", "Q8_1", r"architecture 'llama', quantisation Q8_1\): the gguf package \S+ cannot dequantise its "
                      r"Q8_1 tensors$"),
], ids=["architecture", "quantisation"])
def test_a_gguf_transformers_cannot_load_is_one_line_naming_its_architecture_and_quantisation(
        architecture, weight_type, named, tmp_path, capsys):
    model = write_tiny_gguf(tmp_path / "model.gguf", architecture=architecture, weight_type=weight_type)
    write_config(tmp_path, tmp_path, model, NUM_CLUSTERS="2", PCA_COMPONENTS="4")
    capsys.readouterr()
    assert main(["build-clusters", "--config", str(tmp_path / "test.config")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: CONFIG_MODEL_PATH='{model}': transformers ") and " cannot load this GGUF (" in line
    assert re.search(named, line), line
    assert not (tmp_path / "clusters" / "embeddings.npy").exists()  # refused before any work


def test_the_digest_of_a_gguf_is_its_sha256_cached_by_size_and_mtime(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPRESSOR_2_CACHE", str(tmp_path / "cache"))
    (tmp_path / "a").mkdir()
    model = write_tiny_gguf(tmp_path / "a" / "m.gguf")
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    first = model_digest(model)
    assert first == f"1 file, sha256 {sha[:16]}"
    (tmp_path / "b").mkdir()
    assert model_digest(shutil.copy2(model, tmp_path / "b" / "renamed.gguf")) == first  # the same bytes elsewhere
    stamp = model.stat()
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    model.write_bytes(bytes(data))
    os.utime(model, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # the same size and mtime: the cache answers
    assert model_digest(model) == first
    os.utime(model, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1))
    assert model_digest(model) == f"1 file, sha256 {hashlib.sha256(bytes(data)).hexdigest()[:16]}" != first


def test_a_server_serving_the_same_gguf_by_another_path_serves_the_configured_model(gguf_model, tmp_path):
    link = tmp_path / "link.gguf"
    link.symlink_to(gguf_model)
    other = write_tiny_gguf(tmp_path / "other.gguf", seed=1)
    assert same_model(str(link), str(gguf_model)) and not same_model(str(other), str(gguf_model))


def test_a_process_converts_a_gguf_tokenizer_once_and_hands_out_copies(tmp_path, monkeypatch):
    import compressor_2.model.pretrained as pretrained
    from compressor_2.clusters.vocab import load_vocabulary

    model = write_tiny_gguf(tmp_path / "m.gguf")
    loads: list[str] = []
    real = pretrained._auto_tokenizer
    monkeypatch.setattr(pretrained, "_auto_tokenizer", lambda name, **kwargs: loads.append(name) or real(name, **kwargs))
    first, second = pretrained.load_tokenizer(str(model)), pretrained.load_tokenizer(str(model))
    load_vocabulary(str(model))
    assert loads == [str(tmp_path)]
    first.padding_side = "left"
    second.padding_side = "right"
    assert first.padding_side == "left" and first.encode("Revenue was") == second.encode("Revenue was")

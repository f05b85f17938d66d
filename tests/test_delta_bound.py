"""One bound on every delta (`deltas.DELTA_BOUND`): refused where a user gives a delta (a
`--deltas` file, initial deltas), clamped where a strategy proposes one (reflector replies,
random and CMA-ES draws); crossover and merges of bounded parents stay inside it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from deap import cma

from compressor_2.cli import main
from compressor_2.clusters.builder import build_clusters
from compressor_2.config import Config
from compressor_2.deltas import DELTA_BOUND, load_deltas
from compressor_2.reflector.base import Reply, Usage
from compressor_2.reflector.validation import InvalidOutput, parse_mutation, parse_vector
from compressor_2.strategies.cmaes import CmaesSampler
from compressor_2.strategies.gepa.pareto import merge_components
from compressor_2.strategies.operators import weighted_average
from compressor_2.strategies.random import RandomSampler
from tests.cluster_helpers import cluster_config


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Config:
    folder = tmp_path_factory.mktemp("bound")
    # Answers short enough for the tiny model's context: the deltas are what is refused.
    config = cluster_config(folder, tiny_model_dir, OUTPUT_DIR=str(folder / "run"), MAX_NEW_TOKENS=8,
                            EVIDENCE_MAX_CHARS=1)
    build_clusters(config)
    return config


def _deltas_file(path: Path, config: Config, cluster: str, value: float) -> Path:
    ids = json.loads(config.cluster_descriptions_path.read_text())
    path.write_text(json.dumps({cid: value if cid == cluster else 0.0 for cid in ids}))
    return path


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_the_bound_itself_is_a_valid_delta(built: Config, tmp_path: Path):
    for value in (DELTA_BOUND, -DELTA_BOUND):
        path = _deltas_file(tmp_path / "edge.json", built, "2", value)
        assert load_deltas(path, json.loads(built.cluster_descriptions_path.read_text()))["2"] == value


def test_a_deltas_file_beyond_the_bound_is_refused_naming_the_file_and_the_cluster(built, tmp_path, capsys):
    path = _deltas_file(tmp_path / "big.json", built, "3", 30.5)
    assert main(["evaluate", "--config", str(built_config_path(built)), "--deltas", str(path)]) == 2
    line = _one_line(capsys)
    assert str(path) in line and "cluster 3" in line and "30.5" in line and "[-30, 30]" in line


def test_initial_deltas_beyond_the_bound_are_refused_before_the_run_starts(built, tiny_model_dir, tmp_path, capsys):
    path = _deltas_file(tmp_path / "initial.json", built, "0", -1e6)
    folder = built.cluster_dir.parent
    cluster_config(folder, tiny_model_dir, name="bad_initial.config", INITIAL_DELTAS_PATH=str(path),
                   OUTPUT_DIR=str(tmp_path / "run"), MAX_NEW_TOKENS=8, EVIDENCE_MAX_CHARS=1)
    assert main(["evolve", "--config", str(folder / "bad_initial.config")]) == 2
    line = _one_line(capsys)
    assert str(path) in line and "cluster 0" in line and "-1e+06" in line
    assert not (tmp_path / "run" / "run.sqlite").exists()


def built_config_path(config: Config) -> Path:
    return config.cluster_dir.parent / "test.config"


def _reply(payload: object) -> Reply:
    return Reply(json.dumps(payload), Usage())


def test_a_reflector_proposal_beyond_the_bound_is_clamped():
    assert parse_mutation(_reply({"delta": 1e6, "scratchpad": "up"}), 0.0) == (DELTA_BOUND, "up")
    assert parse_mutation(_reply({"delta": -45, "scratchpad": ""}), 0.0)[0] == -DELTA_BOUND
    deltas, _ = parse_vector(_reply({"deltas": {"0": 99.0, "1": -1e300, "2": 1.5}, "summary": ""}),
                             {"0": 0.0, "1": 0.0, "2": 0.0})
    assert deltas == {"0": DELTA_BOUND, "1": -DELTA_BOUND, "2": 1.5}


def test_a_proposal_that_clamps_to_the_current_value_is_no_change():
    with pytest.raises(InvalidOutput, match="equals the current value"):
        parse_mutation(_reply({"delta": 45.0, "scratchpad": ""}), DELTA_BOUND)
    with pytest.raises(InvalidOutput, match="equal the current ones"):
        parse_vector(_reply({"deltas": {"0": 31.0}, "summary": ""}), {"0": DELTA_BOUND})


@pytest.mark.parametrize("distribution", ["uniform", "normal"])
def test_random_draws_stay_within_the_bound(distribution: str):
    np.random.seed(0)
    batch = np.asarray(RandomSampler([25.0, 0.0, -25.0], distribution, 1000.0, 64).ask())
    assert np.abs(batch).max() == DELTA_BOUND  # clamped, not merely small
    assert (np.abs(batch) < DELTA_BOUND).any()


def test_cmaes_draws_stay_within_the_bound_and_update_from_them():
    np.random.seed(0)
    sampler = CmaesSampler(cma.Strategy(centroid=[0.0] * 5, sigma=1000.0, lambda_=16))
    for _ in range(3):
        batch = sampler.ask()
        assert np.abs(np.asarray(batch)).max() <= DELTA_BOUND
        sampler.tell(batch, [-abs(row[0] - 3.0) for row in batch])
    assert np.abs(np.asarray(batch)).max() == DELTA_BOUND


def test_crossover_and_merges_of_bounded_parents_stay_bounded():
    rng = random.Random(0)
    for _ in range(2000):
        a = [rng.choice([-DELTA_BOUND, DELTA_BOUND, rng.uniform(-DELTA_BOUND, DELTA_BOUND)]) for _ in range(6)]
        b = [rng.choice([-DELTA_BOUND, DELTA_BOUND, rng.uniform(-DELTA_BOUND, DELTA_BOUND)]) for _ in range(6)]
        ancestor = [rng.uniform(-DELTA_BOUND, DELTA_BOUND) for _ in range(6)]
        fa, fb = rng.choice([0.0, rng.random()]), rng.choice([0.0, rng.random()])  # fitness is never negative
        child = weighted_average(a, b, fa, fb)
        merged, _ = merge_components(ancestor, a, b, fa, fb, (1, 2), 1e-6, rng)
        assert all(abs(v) <= DELTA_BOUND for v in child + merged)


@pytest.mark.slow
def test_a_run_whose_reflector_proposes_huge_deltas_keeps_every_candidate_within_the_bound(
        tmp_path, shared, tiny_model_dir, monkeypatch):
    from compressor_2.commands.evolve import evolve
    from tests.fakes.openai_server import FakeOpenAIServer, chat_completion
    from tests.test_evolution_support import config_for, query

    monkeypatch.setenv("C2_TEST_REFLECTOR_KEY", "sk-test")
    calls: list[dict] = []

    def answer(body: dict) -> tuple[int, object]:
        calls.append(body)
        if "delta" in body["response_format"]["json_schema"]["schema"]["properties"]:
            huge = 1e6 if len(calls) % 2 else -1e6
            return 200, chat_completion(json.dumps({"delta": huge, "scratchpad": "all in"}))
        return 200, chat_completion('{"scratchpad": "merged"}')

    with FakeOpenAIServer(answer) as server:
        config = config_for(tmp_path, shared, tiny_model_dir, NGEN="2", REFLECTOR_OPENAI="y",
                            REFLECTOR_BASE_URL=f'"{server.base_url}"', REFLECTOR_MODEL='"fake-reflector"',
                            REFLECTOR_API_KEY_ENV='"C2_TEST_REFLECTOR_KEY"', REFLECTOR_MAX_RETRIES="0")
        evolve(config)
    values = [v for (deltas,) in query(config.output_dir, "SELECT deltas FROM candidates")
              for v in json.loads(deltas).values()]
    assert max(map(abs, values)) == DELTA_BOUND and calls
    assert max(map(abs, json.loads((config.output_dir / "deltas_best.json").read_text()).values())) <= DELTA_BOUND

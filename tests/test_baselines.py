"""The numeric baselines, `random` and `cmaes`: their samplers, then each strategy end to
end on the tiny model (one engine call per batch, budget, resume)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from deap import cma

from compressor_2.commands.evolve import evolve
from compressor_2.engines.transformers.engine import TransformersEngine
from compressor_2.run.services import Run
from compressor_2.strategies.cmaes import CmaesSampler
from compressor_2.strategies.random import RandomSampler
from tests.test_evolution_support import (
    ROWS,
    config_for,
    interrupted_then_resumed,
    query,
    read_json,
    whole_and_resumed,
)

RANDOM = {"STRATEGY_RANDOM": "y", "RANDOM_BATCH_SIZE": "4", "RANDOM_BATCHES": "3", "RANDOM_SCALE": '"1.5"'}
CMAES = {"STRATEGY_CMAES": "y", "CMAES_GENERATIONS": "3", "CMAES_SIGMA": '"0.5"'}
CANDIDATES = "SELECT id, operator, deltas, generation, fitness FROM candidates ORDER BY id"
LINEAGE = "SELECT child, parent, position FROM lineage ORDER BY child, position"


def test_random_draws_are_the_initial_deltas_plus_noise_of_the_configured_scale():
    centre = [1.0, -2.0, 0.0]
    np.random.seed(0)
    uniform = np.asarray(RandomSampler(centre, "uniform", 0.5, 2000).ask()) - centre
    assert uniform.shape == (2000, 3) and np.abs(uniform).max() <= 0.5 and np.abs(uniform).max() > 0.49
    normal = np.asarray(RandomSampler(centre, "normal", 2.0, 4000).ask()) - centre
    assert np.allclose(normal.mean(axis=0), 0, atol=0.15) and np.allclose(normal.std(axis=0), 2.0, atol=0.1)
    assert RandomSampler(centre, "normal", 2.0, 4).tell([], []) == []


def test_a_restored_cma_es_proposes_what_the_original_would_have():
    def fitness(genome):
        return -sum((x - 1.0) ** 2 for x in genome)

    np.random.seed(1)
    original = CmaesSampler(cma.Strategy(centroid=[0.0] * 4, sigma=0.5, lambda_=6))
    for _ in range(3):
        batch = original.ask()
        parents = original.tell(batch, [fitness(g) for g in batch])
    assert len(parents) == 3 and fitness(batch[parents[0]]) == max(fitness(g) for g in batch)
    state, rng = original.state(), np.random.get_state()
    restored = CmaesSampler(cma.Strategy(centroid=[0.0] * 4, sigma=0.5, lambda_=6))
    restored.restore(state)
    np.random.set_state(rng)
    expected = original.ask()
    np.random.set_state(rng)
    assert restored.ask() == expected
    assert original.strategy.update_count == 3 and state["sigma"] != 0.5  # it did learn
    assert np.array_equal(restored.strategy.BD, original.strategy.BD)


@pytest.mark.parametrize("symbols, steps, size", [(RANDOM, "batches", 4), (CMAES, "generations", 8)])
def test_each_batch_is_one_engine_call_and_becomes_archived_candidates(tmp_path, shared, tiny_model_dir,
                                                                      monkeypatch, symbols, steps, size):
    calls = []
    generate = TransformersEngine.generate

    def counted(self, requests, progress=None):  # noqa: ANN001, ANN202 - the engine's signature
        calls.append(len(requests))
        return generate(self, requests, progress)

    monkeypatch.setattr(TransformersEngine, "generate", counted)
    config = config_for(tmp_path, shared, tiny_model_dir, **symbols)
    evolve(config)
    out, n = config.output_dir, len(ROWS)
    # The initial deltas, then one call per batch of `size` vectors (5 clusters: DEAP's
    # default CMA-ES population is 4 + 3 ln 5 = 8). Repeated vectors would be cache hits.
    assert calls == [n] + [size * n] * 3
    rows = query(out, "SELECT operator, generation, count(*) FROM candidates GROUP BY generation ORDER BY generation")
    name = "random" if symbols is RANDOM else "cmaes"
    assert rows == [("initial", -1, 1)] + [(name, g, size) for g in range(3)]
    history = read_json(out / "history.json")
    assert [h["generation"] for h in history] == [0, 1, 2]
    assert history[-1]["stop_reason"] == f"all 3 {steps} ran"
    assert history[-1]["best_ever_fitness"] == max(f for (f,) in query(out, "SELECT fitness FROM candidates"))
    assert (out / "deltas_best.json").exists() and (out / "evolution_tree.png").exists()


def test_cma_es_candidates_descend_from_the_better_half_of_the_generation_before(tmp_path, shared,
                                                                                tiny_model_dir):
    config = config_for(tmp_path, shared, tiny_model_dir, **CMAES)
    evolve(config)
    out = config.output_dir
    fitness = dict(query(out, "SELECT id, fitness FROM candidates"))
    generation = dict(query(out, "SELECT id, generation FROM candidates"))
    parents: dict[int, set[int]] = {}
    for child, parent in query(out, "SELECT child, parent FROM lineage"):
        parents.setdefault(child, set()).add(parent)
    for g in (1, 2):
        chosen = {frozenset(parents[c]) for c in fitness if generation[c] == g}
        assert len(chosen) == 1  # one distribution: every vector of a generation has the same parents
        before = sorted((c for c in fitness if generation[c] == g - 1), key=lambda c: (-fitness[c], c))
        assert chosen == {frozenset(before[:4])}  # mu = 8 // 2


@pytest.mark.parametrize("symbols", [RANDOM, CMAES])
def test_a_budget_stops_the_run_and_a_raised_one_continues_it_to_the_uninterrupted_end(
        tmp_path, shared, tiny_model_dir, symbols):
    whole, split = whole_and_resumed(tmp_path, shared, tiny_model_dir, symbols, {"MAX_METRIC_CALLS": "10"})
    first_leg = read_json(split / "history.json")
    assert query(whole, CANDIDATES) == query(split, CANDIDATES)
    assert query(whole, LINEAGE) == query(split, LINEAGE)
    state_file = "random_state.json" if symbols is RANDOM else "cmaes_state.json"
    assert read_json(whole / state_file) == read_json(split / state_file)
    assert (whole / "deltas_best.json").read_text() == (split / "deltas_best.json").read_text()
    assert len(first_leg) == 3
    stops = [json.loads(detail)["reason"] for (detail,) in
             query(split, "SELECT detail FROM events WHERE kind = 'stop' ORDER BY id")]
    assert stops[0].startswith("CONFIG_MAX_METRIC_CALLS=10 reached") and stops[-1].startswith("all 3")


@pytest.mark.parametrize("symbols", [RANDOM, CMAES])
def test_ctrl_c_inside_a_step_resumes_to_the_uninterrupted_end(tmp_path, shared, tiny_model_dir, monkeypatch,
                                                              symbols):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir()
    cut.mkdir()
    evolve(config_for(whole, shared, tiny_model_dir, **symbols))
    # Step 1's batch ("batch 1", "generation 1") is being evaluated when Ctrl+C comes.
    at = (Run, "evaluate", lambda _self, _genomes, label, *_: label.endswith(" 1"))
    interrupted_then_resumed(cut, shared, tiny_model_dir, symbols, 1, monkeypatch, at)
    assert query(whole / "out", CANDIDATES) == query(cut / "out", CANDIDATES)
    strip = [{k: v for k, v in e.items() if k != "seconds"} for e in read_json(whole / "out" / "history.json")]
    assert strip == [{k: v for k, v in e.items() if k != "seconds"}
                     for e in read_json(cut / "out" / "history.json")]


def test_the_baselines_options_are_checked(tmp_path, shared, tiny_model_dir):
    from compressor_2.common.errors import ConfigError

    with pytest.raises(ConfigError, match="CONFIG_RANDOM_DISTRIBUTION='cauchy' is unknown"):
        config_for(tmp_path, shared, tiny_model_dir, **{**RANDOM, "RANDOM_DISTRIBUTION": '"cauchy"'})
    with pytest.raises(ConfigError, match="CONFIG_CMAES_POPULATION=1 must be 0"):
        config_for(tmp_path, shared, tiny_model_dir, **{**CMAES, "CMAES_POPULATION": "1"})
    with pytest.raises(ConfigError, match=r"CONFIG_CMAES_SIGMA=0 must be in \[1e-6, 1000\]"):
        config_for(tmp_path, shared, tiny_model_dir, **{**CMAES, "CMAES_SIGMA": '"0"'})


def test_cma_es_names_its_step_a_generation_and_resumes_a_state_that_called_it_an_iteration(
        tmp_path, shared, tiny_model_dir):
    """Issue AA: CMA-ES saved its step as "iteration" and named it "generation"; it now saves
    "generation", and a state file of an earlier compressor_2 (the same fields, the step
    under "iteration") still resumes to the uninterrupted end."""
    whole, split = tmp_path / "whole", tmp_path / "split"
    whole.mkdir()
    split.mkdir()
    evolve(config_for(whole, shared, tiny_model_dir, **CMAES))
    evolve(config_for(split, shared, tiny_model_dir, **CMAES, MAX_METRIC_CALLS="10"))
    state_path = split / "out" / "cmaes_state.json"
    state = read_json(state_path)
    assert "iteration" not in state and state["generation"] == 1
    state_path.write_text(json.dumps({"iteration": state.pop("generation"), **state}))
    evolve(config_for(split, shared, tiny_model_dir, **CMAES))
    assert query(whole / "out", CANDIDATES) == query(split / "out", CANDIDATES)
    assert read_json(state_path) == read_json(whole / "out" / "cmaes_state.json")
    assert read_json(state_path)["generation"] == 3

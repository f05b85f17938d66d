"""The GA's pure operators and its selection rules."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from compressor_2.common.errors import ConfigError
from compressor_2.config import load_config
from compressor_2.strategies.ga.operators import RRState, Tournament, Truncation, make_selection, next_target, pairs
from compressor_2.strategies.individual import new_individual
from compressor_2.strategies.operators import weighted_average
from tests.conftest import REPO


def population(fitnesses: list[float]) -> list:
    pop = []
    for i, f in enumerate(fitnesses):
        ind = new_individual([float(i)])
        ind.fitness.values = (f,)
        pop.append(ind)
    return pop


def test_weighted_average_weights_by_fitness():
    assert weighted_average([0.0, 4.0], [3.0, -4.0], 0.25, 0.75) == [2.25, -2.0]
    assert weighted_average([1.0], [3.0], 1.0, 0.0) == [1.0]


def test_weighted_average_is_the_plain_mean_when_both_fitnesses_are_zero():
    assert weighted_average([1.0, -2.0], [3.0, 2.0], 0.0, 0.0) == [2.0, 0.0]


def test_weighted_average_refuses_vectors_of_different_lengths():
    with pytest.raises(ValueError):
        weighted_average([1.0, 2.0], [1.0], 0.5, 0.5)


def test_round_robin_cycles_through_the_clusters_in_order():
    rr = RRState(["0", "1", "2"], rr_idx=1)
    assert [next_target(rr) for _ in range(5)] == ["1", "2", "0", "1", "2"]
    assert rr.rr_idx == 0


def test_pairs_take_consecutive_parents():
    assert pairs(["a", "b", "c", "d"]) == [("a", "b"), ("c", "d")]
    with pytest.raises(ValueError):
        pairs(["a", "b", "c"])


def test_tournament_returns_references_and_favours_the_fit():
    pop = population([0.1, 0.9, 0.5, 0.3])
    random.seed(3)
    chosen = Tournament(size=3).select(pop, 400)
    assert len(chosen) == 400 and all(any(c is p for p in pop) for c in chosen)
    wins = [sum(c is p for c in chosen) for p in pop]
    # Aspirants are drawn with replacement, so anyone can win, but in fitness order.
    assert wins[1] > wins[2] > wins[3] > wins[0]


def test_truncation_draws_with_replacement_from_the_top_k_only():
    pop = population([0.1, 0.9, 0.5, 0.3, 0.7])
    random.seed(0)
    chosen = Truncation(top_k=2).select(pop, 12)  # more parents than the pool: replacement
    assert len(chosen) == 12
    assert {id(c) for c in chosen} == {id(pop[1]), id(pop[4])}


def test_selection_is_reproducible_from_the_random_state():
    pop = population([0.1, 0.9, 0.5, 0.3, 0.7])
    random.seed(11)
    first = [pop.index(c) for c in Tournament(3).select(pop, 8)]
    random.seed(11)
    assert [pop.index(c) for c in Tournament(3).select(pop, 8)] == first


@pytest.fixture(scope="module")
def base_config():
    return load_config(REPO / "defconfig")


def test_make_selection_takes_the_checked_sizes(base_config):
    for size in (2, 6):
        options = dataclasses.replace(base_config.ga, population_size=6, selection="truncation", truncation_top_k=size)
        assert make_selection(options) == Truncation(size)
        options = dataclasses.replace(base_config.ga, population_size=6, selection="tournament", tournament_size=size)
        assert make_selection(options) == Tournament(size)


@pytest.mark.parametrize(("text", "symbol"), [
    ('CONFIG_SELECTION="truncation"\nCONFIG_TRUNCATION_TOP_K=1\n', "CONFIG_TRUNCATION_TOP_K"),
    ('CONFIG_SELECTION="truncation"\nCONFIG_TRUNCATION_TOP_K=9\n', "CONFIG_TRUNCATION_TOP_K"),
    ('CONFIG_SELECTION="truncation"\n', "CONFIG_TRUNCATION_TOP_K"),  # still at its sentinel
    ('CONFIG_SELECTION="tournament"\nCONFIG_TOURNAMENT_SIZE=1\n', "CONFIG_TOURNAMENT_SIZE"),
    ('CONFIG_SELECTION="tournament"\nCONFIG_TOURNAMENT_SIZE=9\n', "CONFIG_TOURNAMENT_SIZE"),
    ('CONFIG_SELECTION="tournament"\n', "CONFIG_TOURNAMENT_SIZE"),
    ('CONFIG_SELECTION="roulette"\n', "CONFIG_SELECTION"),
])
def test_the_loader_checks_the_selection_rules_once(tmp_path: Path, text: str, symbol: str):
    """The defconfig (population 8) with its selection lines replaced by `text`: the sizes
    lie in [2, population], and a selection needs its size (checked once, when the config
    loads; the GA takes them as they are)."""
    base = "".join(line + "\n" for line in (REPO / "defconfig").read_text().splitlines()
                   if not line.startswith(("CONFIG_SELECTION=", "CONFIG_TOURNAMENT_SIZE=",
                                           "CONFIG_TRUNCATION_TOP_K=")))
    path = tmp_path / "x.config"
    path.write_text(base + text)
    with pytest.raises(ConfigError, match=symbol):
        load_config(path)

"""GEPA's proposers: the Pareto arithmetic on hand-built states checked against
values worked out by hand, then the strategy end to end on the tiny model (budget,
resume, outputs)."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from compressor_2.cli import main
from compressor_2.commands.evolve import evolve
from compressor_2.common.errors import ConfigError
from compressor_2.strategies.gepa.pareto import (
    EpochSampler,
    example_fronts as pareto_front,
    find_merge_triplet,
    has_desirable_component,
    is_dominated,
    merge_accepted,
    merge_components,
    mutation_accepted,
    remove_dominated,
    select_from_front,
    stratified_subsample,
)
from tests.test_evolution_support import (
    config_for,
    interrupted_then_resumed,
    query,
    read_json,
    whole_and_resumed,
)

# Three candidates on four examples: 1 leads a, 2 leads b, 3 ties 2 on c and leads d.
SCORES = {1: {"a": 0.9, "b": 0.1, "c": 0.5, "d": 0.2},
          2: {"a": 0.5, "b": 0.8, "c": 0.7, "d": 0.2},
          3: {"a": 0.4, "b": 0.3, "c": 0.7, "d": 0.6}}


def test_the_front_keeps_each_examples_best_score_and_its_holders():
    front = pareto_front(SCORES)
    assert front == {"a": (0.9, {1}), "b": (0.8, {2}), "c": (0.7, {2, 3}), "d": (0.6, {3})}
    # A fourth candidate that ties 3 on d joins that front; a better one replaces it.
    assert pareto_front({**SCORES, 4: {"a": 0, "b": 0, "c": 0, "d": 0.6}})["d"] == (0.6, {3, 4})
    assert pareto_front({**SCORES, 4: {"a": 0, "b": 0, "c": 0, "d": 0.65}})["d"] == (0.65, {4})


def test_domination_and_dominator_removal():
    fronts = [{1}, {2}, {2, 3}, {3}]
    assert not is_dominated(3, {1, 2, 3}, fronts)  # alone on d
    assert is_dominated(3, {1, 2, 3}, [{1}, {2}, {2, 3}])  # every front it is on has 2 too
    assert remove_dominated([{1}, {2}, {2, 3}], {1: 0.4, 2: 0.55, 3: 0.5}) == {1, 2}
    # Lowest aggregate first: of two candidates always tied, the weaker goes, the other stays.
    assert remove_dominated([{5, 6}, {5, 6}], {5: 0.2, 6: 0.3}) == {6}


def test_pareto_selection_draws_in_proportion_to_fronts_led():
    fronts = [{1}, {2}, {2}, {2}]
    rng = random.Random(0)
    drawn = [select_from_front(fronts, {1: 0.5, 2: 0.6}, rng) for _ in range(400)]
    assert 0.15 < drawn.count(1) / 400 < 0.35  # 1 of 4 fronts


def test_the_epoch_sampler_pads_the_last_minibatch_as_gepa_does():
    """10 ids in minibatches of 3: every epoch is 4 minibatches and sees every id; the last
    one is padded with the ids drawn least often so far (a tie: the earliest of this
    epoch's order), never with an id it already holds."""
    ids = [f"e{i}" for i in range(10)]
    sampler, rng = EpochSampler(ids, 3), random.Random(1)
    for epoch in range(3):
        batches = [sampler.next(rng) for _ in range(4)]
        assert sampler.epoch == epoch and all(len(b) == 3 and len(set(b)) == 3 for b in batches)
        seen = [i for b in batches for i in b]
        assert set(seen) == set(ids)
        order, padded = sampler.order, seen[10:]
        if epoch == 0:  # every id drawn once so far: the pads are the epoch's first two
            assert padded == order[:2]
    # Over 3 epochs 6 pads went to 6 different ids: the least drawn are chosen first.
    assert sorted(sampler.counts.values()) == [3] * 4 + [4] * 6
    assert sampler.next(rng) and sampler.epoch == 3


def test_the_epoch_sampler_resumes_exactly_from_its_saved_state():
    ids = [f"e{i}" for i in range(7)]
    whole, rng = EpochSampler(ids, 3), random.Random(4)
    for _ in range(4):  # into the second epoch
        whole.next(rng)
    saved = json.loads(json.dumps(dataclasses.asdict(whole)))  # as gepa_state.json holds it
    resumed, rng_copy = EpochSampler(**saved), random.Random()
    rng_copy.setstate(rng.getstate())
    assert [resumed.next(rng_copy) for _ in range(7)] == [whole.next(rng) for _ in range(7)]
    assert resumed.counts == whole.counts


EPS = 1e-6


def test_the_three_merge_rules_with_eps():
    ancestor = [0.0, 1.0, 2.0, 3.0]
    a = [0.0 + 1e-9, 5.0, 7.0, 3.0]  # kept 0 (within eps), changed 1, changed 2, kept 3
    b = [4.0, 1.0, 8.0, 3.0]  # changed 0, kept 1, changed 2, kept 3
    merged, sources = merge_components(ancestor, a, b, 0.6, 0.5, (10, 20), EPS, random.Random(0))
    # 0: only B changed -> B; 1: only A changed -> A; 2: both changed -> the higher scorer A; 3: same -> A.
    assert merged == [4.0, 5.0, 7.0, 3.0] and sources == (20, 10, 10, 10)
    merged, sources = merge_components(ancestor, a, b, 0.4, 0.5, (10, 20), EPS, random.Random(0))
    assert merged[2] == 8.0 and sources[2] == 20
    # A tie draws: both outcomes happen over seeds.
    drawn = {merge_components(ancestor, a, b, 0.5, 0.5, (10, 20), EPS, random.Random(s))[1][2] for s in range(20)}
    assert drawn == {10, 20}
    assert has_desirable_component(ancestor, a, b, EPS)
    assert not has_desirable_component(ancestor, [9.0] * 4, [8.0] * 4, EPS)  # both changed everything


def test_common_ancestor_search():
    # 1 -> 2 -> 4, 1 -> 3; 5 unrelated. 2 and 3 share ancestor 1; 4 descends from 2.
    parents = {2: {1}, 3: {1}, 4: {2}}

    def ancestors(c: int) -> set[int]:
        found, todo = set(), list(parents.get(c, ()))
        while todo:
            p = todo.pop()
            found.add(p)
            todo += parents.get(p, ())
        return found

    aggregate = {1: 0.5, 2: 0.6, 3: 0.7, 4: 0.8, 5: 0.9}
    genomes = {1: [0.0, 0.0], 2: [1.0, 0.0], 3: [0.0, 1.0], 4: [1.0, 0.5], 5: [3.0, 3.0]}
    rng = random.Random(0)
    assert find_merge_triplet([2, 3], ancestors, aggregate, genomes, set(), EPS, rng) == (2, 3, 1)
    assert find_merge_triplet([2, 4], ancestors, aggregate, genomes, set(), EPS, rng) is None  # 4 descends from 2
    assert find_merge_triplet([3, 5], ancestors, aggregate, genomes, set(), EPS, rng) is None  # no common ancestor
    assert find_merge_triplet([2, 3], ancestors, aggregate, genomes, {(2, 3, 1)}, EPS, rng) is None  # tried
    assert find_merge_triplet([2, 3], ancestors, {**aggregate, 1: 0.65}, genomes, set(), EPS, rng) is None
    same_as_ancestor = {**genomes, 2: [0.0, 0.0], 3: [0.0, 0.0]}
    assert find_merge_triplet([2, 3], ancestors, aggregate, same_as_ancestor, set(), EPS, rng) is None


def test_the_stratified_subsample():
    a = {"w1": 1.0, "w2": 1.0, "w3": 1.0, "l1": 0.0, "l2": 0.0, "t1": 0.5, "t2": 0.5, "t3": 0.5}
    b = {"w1": 0.0, "w2": 0.0, "w3": 0.0, "l1": 1.0, "l2": 1.0, "t1": 0.5, "t2": 0.5, "t3": 0.5, "x": 1.0}
    chosen = stratified_subsample(a, b, 5, random.Random(0))
    assert len(chosen) == 5 and len(set(chosen)) == 5 and "x" not in chosen
    assert sum(e.startswith("w") for e in chosen) == 2 and sum(e.startswith("l") for e in chosen) == 2
    assert stratified_subsample({"a": 1.0}, {"a": 0.0}, 5, random.Random(0)) == ["a"]


def test_both_acceptance_rules():
    assert mutation_accepted([0.5, 0.5], [0.6, 0.5]) and not mutation_accepted([0.5, 0.5], [0.5, 0.5])
    assert merge_accepted([0.5, 0.5], [0.4, 0.6], [0.5, 0.4])  # equal to the better parent: kept
    assert not merge_accepted([0.5, 0.49], [0.4, 0.6], [0.5, 0.4])


# -- end to end -----------------------------------------------------------------------------

GEPA = {"STRATEGY_GEPA": "y", "MAX_METRIC_CALLS": "30", "GEPA_VALSET_SIZE": "2", "GEPA_MINIBATCH_SIZE": "1",
        "GEPA_VAL_OVERLAP_FLOOR": "1", "GEPA_MERGE_SUBSAMPLE": "2"}


@pytest.mark.slow
def test_an_offline_gepa_run_to_its_budget(tmp_path, shared, tiny_model_dir, capsys):
    config = config_for(tmp_path, shared, tiny_model_dir, **GEPA)
    evolve(config)
    out = config.output_dir
    calls = query(out, "SELECT count(*) FROM evaluations")[0][0]
    history = read_json(out / "history.json")
    assert history[-1]["stop_reason"] == f"CONFIG_MAX_METRIC_CALLS=30 reached ({calls} metric calls)"
    assert calls >= 30 and history[-1]["metric_calls"] == calls
    # Budget accounting: only fresh answers count. However often a candidate was a parent,
    # its answers cost at most the 2 valset and the 1 feedback example; a rejected
    # proposal cost at most its minibatch.
    rows = dict(query(out, "SELECT genome, count(*) FROM evaluations GROUP BY genome"))
    genome = {cid: ",".join(repr(float(v)) for v in json.loads(d).values())
              for cid, d in query(out, "SELECT id, deltas FROM candidates")}
    parents = [h["parent"] for h in history if h["proposer"] == "reflective"]
    busiest = max(set(parents), key=parents.count)
    assert parents.count(busiest) >= 5 and rows[genome[busiest]] <= 3
    rejected = [c for (c,) in query(out, "SELECT id FROM candidates WHERE status = 'rejected'")]
    assert rejected and all(rows.get(genome[c], 0) <= 1 for c in rejected)
    state = read_json(out / "gepa_state.json")
    assert len(state["valset"]) == 2 and len(state["sampler"]["ids"]) == 1
    front = read_json(out / "pareto_front.json")
    assert set(front) == set(state["valset"])
    assert all(set(e["candidates"]) <= set(state["pool"]) for e in front.values())
    kept = query(out, "SELECT id FROM candidates WHERE status = 'evaluated'")
    assert sorted(state["pool"]) == sorted(c for (c,) in kept)
    for h in history:
        assert h["proposer"] in {"reflective", "merge"}
        if "after" in h and h["proposer"] == "reflective":
            assert h["accepted"] == (h["after"] > h["before"])
    for png in ("gepa_progress.png", "evolution_tree.png", "fitness_vs_generation.png"):
        assert (out / png).exists()
    capsys.readouterr()
    assert main(["show", "--config", str(tmp_path / "test.config")]) == 0
    assert "Pareto front over 2 valset examples" in capsys.readouterr().out


@pytest.mark.slow
def test_a_resumed_gepa_run_ends_where_an_uninterrupted_one_does(tmp_path, shared, tiny_model_dir):
    whole, split = whole_and_resumed(tmp_path, shared, tiny_model_dir, GEPA, {"MAX_METRIC_CALLS": "12"})
    a, b = read_json(whole / "gepa_state.json"), read_json(split / "gepa_state.json")
    assert a == b
    for sql in ("SELECT id, operator, deltas, status, note, fitness FROM candidates ORDER BY id",
                "SELECT * FROM merges ORDER BY candidate"):
        assert query(whole, sql) == query(split, sql), sql


def test_a_pool_too_small_for_the_split_is_a_config_error(tmp_path, shared, tiny_model_dir):
    config = config_for(tmp_path, shared, tiny_model_dir, **{**GEPA, "GEPA_VALSET_SIZE": "3"})
    with pytest.raises(ConfigError, match="a pool of 3 examples is too small for a valset of 3"):
        evolve(config)


def test_gepa_needs_a_metric_call_budget(tmp_path, shared, tiny_model_dir):
    with pytest.raises(ConfigError, match="CONFIG_STRATEGY_GEPA needs CONFIG_MAX_METRIC_CALLS > 0"):
        config_for(tmp_path, shared, tiny_model_dir, **{**GEPA, "MAX_METRIC_CALLS": "0"})


def test_the_tree_marks_a_merges_ancestor(tmp_path):
    from compressor_2.archive import Candidate, Placement, RunArchive, Spot
    from compressor_2.outputs.tree import EvolutionTree

    archive = RunArchive.open(tmp_path / "run.sqlite")
    made = archive.add([Candidate({"0": x}, "", op, parents, "gepa", g, fitness=0.5)
                        for x, op, parents, g in [(0.0, "initial", (), 0), (1.0, "mutation", (1,), 1),
                                                  (2.0, "mutation", (1,), 2), (3.0, "merge", (2, 3), 3)]])
    archive.place([Placement(c.id, Spot(c.generation, "cand", 0)) for c in made], 0)
    archive.record_merge(4, 2, 3, 1, (2, 3), True)
    graph = EvolutionTree.from_archive(archive).graph
    assert {(u, v, d["kind"]) for u, v, d in graph.edges(data=True)} == {
        ("c1", "c2", "mutation"), ("c1", "c3", "mutation"), ("c2", "c4", "parent"), ("c3", "c4", "parent"),
        ("c1", "c4", "ancestor")}
    assert graph.nodes["c4"]["merge_ancestor"] == 1
    archive.close()


@pytest.mark.slow
def test_a_gepa_run_interrupted_mid_iteration_resumes_to_the_same_end(tmp_path, shared, tiny_model_dir,
                                                                      monkeypatch):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir()
    cut.mkdir()
    evolve(config_for(whole, shared, tiny_model_dir, **GEPA))
    interrupted_then_resumed(cut, shared, tiny_model_dir, GEPA, 3, monkeypatch)
    assert read_json(whole / "out" / "gepa_state.json") == read_json(cut / "out" / "gepa_state.json")
    sql = "SELECT id, operator, deltas, status, note, fitness FROM candidates ORDER BY id"
    assert query(whole / "out", sql) == query(cut / "out", sql)


@pytest.mark.slow
def test_a_kept_child_continues_its_parents_round_robin(tmp_path, shared_eight_clusters, tiny_model_dir,
                                                        monkeypatch):
    """As GEPA's update_state_with_new_program does, a new candidate takes its parents'
    round-robin position, the highest among them, instead of starting again at cluster 0.
    The GEPA loop runs on the real services of `evolve`, with 8 clusters (ids 0..7)."""
    import compressor_2.commands.evolve
    from compressor_2.strategies.gepa import strategy as gepa

    records: list[dict] = []

    def drive(run, g: gepa.Gepa, begin) -> str:  # noqa: ANN001 - evolve's own arguments
        begin()
        g.start()
        [seed] = g.state.pool
        g.state.next_component[str(seed)] = 5  # the parent's next component is cluster 5
        monkeypatch.setattr(gepa, "mutation_accepted", lambda before, after: True)  # the child is kept
        records.append(g.reflect(0))
        g.state.pool = [records[0]["candidate"]]  # the child is the only parent to draw
        records.append(g.reflect(1))
        return "driven"

    monkeypatch.setattr(compressor_2.commands.evolve, "drive", drive)
    evolve(config_for(tmp_path, shared_eight_clusters, tiny_model_dir, **GEPA, NUM_CLUSTERS="6"))
    parent, child = records
    assert parent["accepted"] and parent["change"] == "cluster 5"
    assert child["parent"] == parent["candidate"] and child["change"] == "cluster 6"


@pytest.mark.slow
def test_a_resumed_sampling_gepa_run_recomputes_the_best_from_its_resampled_valset(tmp_path, shared,
                                                                                   tiny_model_dir, capsys):
    """For GEPA too: with CONFIG_TEMPERATURE > 0 a resume samples the pool's valset
    answers afresh; the stored best (the archive's recorded aggregate) stays unless a
    re-scored member beats it, and then the archive records the new best. The recorded
    aggregates are set to the maximum, then to 0, so the outcome does not depend on the
    samples; the spent budget stops each resume right after."""
    import sqlite3

    symbols = {**GEPA, "MAX_METRIC_CALLS": "12", "TEMPERATURE": '"1.0"'}
    config = config_for(tmp_path, shared, tiny_model_dir, **symbols)
    out = config.output_dir
    evolve(config)

    def resume_with_recorded_fitness(fitness: float) -> str:
        with sqlite3.connect(out / "run.sqlite") as db:
            db.execute("UPDATE candidates SET fitness = ? WHERE status = 'evaluated'", (fitness,))
        db.close()
        calls = query(out, "SELECT count(*) FROM evaluations")[0][0]
        capsys.readouterr()
        evolve(config)
        assert query(out, "SELECT count(*) FROM evaluations")[0][0] > calls  # the valset was sampled afresh
        return capsys.readouterr().out

    printed = resume_with_recorded_fitness(1.0)  # lambda_shortness + lambda_correctness: nothing beats it
    assert "best fitness 1.0000 (candidate 1)" in printed.splitlines()[-1] and "new best" not in printed

    printed = resume_with_recorded_fitness(0.0)  # any re-scored member beats it
    [(best, fitness, deltas)] = query(out, "SELECT id, fitness, deltas FROM candidates WHERE fitness > 0")
    assert "new best fitness" in printed and f"best fitness {fitness:.4f} (candidate {best})" in printed
    assert read_json(out / "deltas_best.json") == json.loads(deltas)

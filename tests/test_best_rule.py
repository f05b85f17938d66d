"""Which candidate a run calls its best (CONFIG_BEST_FITTEST, default, or CONFIG_BEST_SHORTEST):
the best-ever's rank, the archive's `best` ordering its rows the same way, the floor a run
records, and a run and its resume under the shortest rule."""

from __future__ import annotations

import json

import pytest

from compressor_2.archive import BEST_FLOOR, Candidate, RunArchive
from compressor_2.common import ConfigError
from compressor_2.findings import training_baseline
from compressor_2.fitness import Evaluation
from compressor_2.resume import Member
from compressor_2.resume.identity import RunInputs, changes, run_identity
from compressor_2.archive import rank
from compressor_2.run.best import BestEver
from tests.test_evolution_support import config_for, query, read_json, refused_resume, whole_and_resumed

SHORTEST = {"BEST_FITTEST": "n", "BEST_SHORTEST": "y"}

# (fitness, tokens, correctness) of five candidates on a pool; the baseline is 40% correct.
SCORES = [(0.60, 30.0, 0.40), (0.70, 36.0, 0.60), (0.65, 20.0, 0.20), (0.62, 24.0, 0.40), (0.61, 24.0, 0.40)]
FLOOR = 0.40


def test_without_a_floor_the_rank_is_the_fitness_and_with_one_the_correct_enough_shortest_come_first():
    assert rank(0.7, 36.0, 0.6, None) > rank(0.6, 10.0, 0.9, None)
    ranked = sorted(range(len(SCORES)), key=lambda i: rank(*SCORES[i], FLOOR), reverse=True)
    # 24 tokens twice at the floor (the fitter first), then 30, then 36; the 20-token one is below it.
    assert ranked == [3, 4, 0, 1, 2]
    # Correctness equal to the floor up to the last bit counts as reaching it.
    assert rank(0.5, 10.0, 0.4 - 1e-12, 0.4)[0] == 1.0 and rank(0.5, 10.0, 0.39, 0.4)[0] == 0.0
    # Below the floor, the fittest leads.
    assert rank(0.65, 20.0, 0.2, 0.9) > rank(0.6, 5.0, 0.1, 0.9)


def add_scored(archive: RunArchive) -> None:
    archive.add([Candidate({"0": float(i)}, "", "initial", (), "ga", 0, fitness=f, mean_tokens=t, correctness=c)
                 for i, (f, t, c) in enumerate(SCORES)])


def test_the_archive_best_is_the_fittest_unless_a_floor_is_recorded(tmp_path):
    archive = RunArchive.open(tmp_path / "run.sqlite")
    try:
        add_scored(archive)
        assert archive.best().id == 2  # the fittest
        archive.set_meta({BEST_FLOOR: repr(FLOOR)})
        assert archive.best().id == 4  # 24 tokens at the floor, the fitter of two
        archive.set_meta({BEST_FLOOR: "0.9"})
        assert archive.best().id == 2  # none reaches it: the fittest
    finally:
        archive.close()


def evaluation(fitness: float, tokens: float, correctness: float) -> Evaluation:
    return Evaluation((), (), tokens, correctness, 0.0, fitness, ())


def test_the_best_ever_takes_what_the_archive_calls_best(tmp_path):
    """Offered one at a time, in id order, as a search offers them: it ends on the archive's best."""
    written = []
    best = BestEver(tmp_path, lambda deltas, processor: written.append(processor))
    best.floor = FLOOR
    for i, scores in enumerate(SCORES):
        best.consider([(Member({"0": float(i)}, "", i + 1), evaluation(*scores))])
    assert best.member is not None and best.member.candidate_id == 4
    assert read_json(tmp_path / "deltas_best.json") == {"0": 3.0}
    assert len(written) == 2  # the first, then the 24-token one; never the fitter 36-token one
    restored = BestEver(tmp_path, lambda *_: None)
    restored.floor = FLOOR
    restored.restore(best.member, best.fitness, 24.0, 0.40)
    assert not restored.consider([(Member({"0": 9.0}, "", 9), evaluation(0.61, 24.0, 0.40))])  # less fit
    assert not restored.consider([(Member({"0": 9.0}, "", 9), evaluation(0.62, 24.0, 0.40))])  # equal: the earlier
    assert not restored.consider([(Member({"0": 9.0}, "", 9), evaluation(0.99, 10.0, 0.35))])  # under the floor
    assert restored.consider([(Member({"0": 9.0}, "", 9), evaluation(0.5, 23.0, 0.45))])


def test_the_shortest_rule_with_gepa_is_refused_in_one_line(tmp_path, shared, tiny_model_dir):
    """GEPA scores its candidates on its valset, not on the pool the floor was measured on."""
    with pytest.raises(ConfigError) as refused:
        config_for(tmp_path, shared, tiny_model_dir, **SHORTEST, STRATEGY_GA="n", STRATEGY_GEPA="y")
    assert "CONFIG_BEST_SHORTEST" in str(refused.value) and "CONFIG_STRATEGY_GEPA" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_the_rule_is_part_of_the_identity_only_away_from_the_default(tmp_path, shared, tiny_model_dir):
    def identity(**symbols: str) -> dict[str, str]:
        config = config_for(tmp_path, shared, tiny_model_dir, **symbols)
        return run_identity(config, RunInputs("digest", (), None, "the model"))

    fittest, shortest = identity(), identity(**SHORTEST)
    assert not any("BEST" in name for name in fittest)
    refused, allowed = changes(fittest, shortest)
    assert refused == ["CONFIG_BEST_*: fittest when the run started, shortest now"] and allowed == []


@pytest.mark.slow
def test_a_resume_with_the_other_rule_is_refused_in_one_line_writing_nothing(tmp_path, shared, tiny_model_dir,
                                                                             uninterrupted, capsys):
    changed = refused_resume(tmp_path, shared, tiny_model_dir, uninterrupted, capsys, **SHORTEST)
    assert changed == ["  CONFIG_BEST_*: fittest when the run started, shortest now"], changed


@pytest.mark.slow
def test_a_run_under_the_shortest_rule_keeps_the_shortest_as_correct_as_the_baseline_and_resumes_to_it(
        tmp_path, shared, tiny_model_dir):
    whole, split = whole_and_resumed(tmp_path, shared, tiny_model_dir, SHORTEST, {"NGEN": "1"})
    assert read_json(whole / "deltas_best.json") == read_json(split / "deltas_best.json")
    assert read_json(whole / "evolution_state.json") == read_json(split / "evolution_state.json")
    [(floor,)] = query(whole, f"SELECT value FROM meta WHERE key = '{BEST_FLOOR}'")
    archive = RunArchive.open_read_only(whole / "run.sqlite")
    try:
        baseline = training_baseline(archive).correctness
    finally:
        archive.close()
    rows = query(whole, "SELECT id, deltas, fitness, mean_tokens, correctness FROM candidates "
                        "WHERE fitness IS NOT NULL")
    assert float(floor) == pytest.approx(baseline)
    eligible = [r for r in rows if r[4] >= float(floor) - 1e-9]
    assert eligible, rows
    shortest = min(r[3] for r in eligible)
    chosen = [r for r in eligible if r[3] == shortest]
    expected = max(chosen, key=lambda r: (r[2], -r[0]))
    assert read_json(whole / "deltas_best.json") == json.loads(expected[1])

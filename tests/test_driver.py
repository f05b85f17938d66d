"""The run's driver (issue V): a budget reached inside a step stops it there, a rerun with
the same budget changes nothing and a raised one ends where an uninterrupted run does; the
state keeps exactly the generators each strategy draws from; the outputs are drawn on a
clock that keeps their share of a run's wall time at most SHARE."""

from __future__ import annotations

import itertools
import json

import pytest

from compressor_2.archive import RunArchive
from compressor_2.commands.evolve import evolve
from compressor_2.outputs.refresh import FIRST_DRAWING, SHARE, Refresh
from tests.test_evolution_support import config_for, query, read_json

pytestmark = pytest.mark.slow

CANDIDATES = "SELECT id, operator, deltas, generation, status, fitness FROM candidates ORDER BY id"
# Each with a second step of two fresh evaluations or more, so that a budget can end it inside.
STRATEGIES = {
    "ga": ({"NGEN": "3"}, "evolution_state.json", "generation", {"NGEN": "1"}),
    "archive": ({"STRATEGY_ARCHIVE": "y", "ARCHIVE_ITERATIONS": "3", "ARCHIVE_ASSESSMENT_CONCURRENCY": "1"},
                "archive_state.json", "iteration", {"ARCHIVE_ITERATIONS": "1"}),
}


@pytest.mark.parametrize("name", STRATEGIES)
def test_a_budget_stops_inside_a_step_and_a_raised_one_continues_to_the_uninterrupted_end(
        name, tmp_path, shared, tiny_model_dir, capsys):
    symbols, state_file, step_key, one_step = STRATEGIES[name]
    whole, cut, first = (tmp_path / n for n in ("whole", "cut", "first"))
    for work in (whole, cut, first):
        work.mkdir()
    evolve(config_for(whole, shared, tiny_model_dir, **symbols))
    evolve(config_for(first, shared, tiny_model_dir, **{**symbols, **one_step}))
    budget = query(first / "out", "SELECT count(*) FROM evaluations")[0][0] + 1  # step 1 starts under it

    evolve(config_for(cut, shared, tiny_model_dir, **symbols, MAX_METRIC_CALLS=str(budget)))
    out = cut / "out"
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"stopped: CONFIG_MAX_METRIC_CALLS={budget} reached")
    # Step 1 made fresh answers (one evaluation), then stopped before the next: it resumes at step 1.
    assert read_json(out / state_file)[step_key] == 1
    assert query(out, "SELECT count(*) FROM evaluations")[0][0] >= budget
    assert read_json(out / "history.json")[-1]["stop_reason"].startswith("CONFIG_MAX_METRIC_CALLS")

    files = {p.name: p.read_bytes() for p in out.iterdir() if p.suffix == ".json"}
    answers, made = query(out, "SELECT count(*) FROM evaluations"), query(out, CANDIDATES)
    evolve(config_for(cut, shared, tiny_model_dir, **symbols, MAX_METRIC_CALLS=str(budget)))
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.suffix == ".json"} == files
    assert query(out, "SELECT count(*) FROM evaluations") == answers and query(out, CANDIDATES) == made

    evolve(config_for(cut, shared, tiny_model_dir, **symbols))
    assert read_json(out / state_file) == read_json(whole / "out" / state_file)
    assert query(out, CANDIDATES) == query(whole / "out", CANDIDATES)
    assert (out / "deltas_best.json").read_bytes() == (whole / "out" / "deltas_best.json").read_bytes()


@pytest.mark.parametrize(("symbols", "state_file", "drawn"), [
    ({}, "evolution_state.json", {"random", "numpy"}),
    ({"STRATEGY_RANDOM": "y", "RANDOM_BATCH_SIZE": "2", "RANDOM_BATCHES": "1"}, "random_state.json",
     {"random", "numpy"}),
    ({"STRATEGY_GEPA": "y", "MAX_METRIC_CALLS": "6", "GEPA_VALSET_SIZE": "1", "GEPA_MINIBATCH_SIZE": "1"},
     "gepa_state.json", {"random"}),
    ({"STRATEGY_ARCHIVE": "y", "ARCHIVE_ITERATIONS": "1", "ARCHIVE_PARENTS_PER_ITERATION": "1"},
     "archive_state.json", {"random"}),
])
def test_the_state_keeps_exactly_the_generators_a_strategy_draws_from(symbols, state_file, drawn, tmp_path,
                                                                       shared, tiny_model_dir):
    """The GA (DEAP's selectors) and the samplers draw from the global `random` and numpy
    generators; GEPA and the archive from their own `random.Random` only."""
    evolve(config_for(tmp_path, shared, tiny_model_dir, NGEN="1", **symbols))
    assert set(read_json(tmp_path / "out" / state_file)["rng"]) == drawn


def test_outputs_are_drawn_on_a_clock(tmp_path):
    """A drawing waits until the run has worked 1 / SHARE - 1 times as long as the last
    one took (FIRST_DRAWING before any), whatever happens between; the fake clock ticks a
    second a reading, so each drawing takes 1 s."""
    archive = RunArchive.open(tmp_path / "run.sqlite")
    ticks = itertools.count()
    refresh = Refresh(archive, tmp_path, [], [], None, clock=lambda: float(next(ticks)))
    assert refresh.due == FIRST_DRAWING * (1 / SHARE - 1)
    for drawn in (1, 2):
        while next(ticks) < refresh.due - 1:
            refresh.after_step([])
        assert refresh.seconds == drawn - 1  # not drawn while the run had worked less
        refresh.after_step([])  # asks at `due`, draws from due + 1 to due + 2
        assert refresh.seconds == drawn and refresh.due == next(ticks) - 1 + (1 / SHARE - 1)
    assert (tmp_path / "report.html").exists()
    archive.close()
    assert json.loads((tmp_path / "tree.json").read_text())["nodes"] == []

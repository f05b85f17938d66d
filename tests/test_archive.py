"""The run archive on its own: ids, lineage queries, rollback, the answer cache, read-only use."""

from __future__ import annotations

from pathlib import Path

import pytest

from compressor_2.archive import Answer, CallRecord, Candidate, Placement, ReplyTally, RunArchive, Spot, genome_key
from compressor_2.common.errors import ConfigError, RunError
from compressor_2.strategies import load_strategy


def candidate(x: float, operator: str = "initial", parents: tuple[int, ...] = (), generation: int = 0,
              fitness: float | None = None) -> Candidate:
    return Candidate({"0": x, "1": -x}, f"notes {x}", operator, parents, "ga", generation, fitness=fitness)


@pytest.fixture
def archive(tmp_path: Path):
    archive = RunArchive.open(tmp_path / "run.sqlite")
    yield archive
    archive.close()


def family(archive: RunArchive) -> list[Candidate]:
    """#1, #2 initial; #3 = cross(1, 2); #4 = mutation(3); #5 = clone(2)."""
    first = archive.add([candidate(0.0, fitness=0.5), candidate(1.0, fitness=0.6)])
    third = archive.add([candidate(0.5, "crossover", (1, 2), fitness=0.7)])
    rest = archive.add([candidate(0.7, "mutation", (3,), 1, fitness=0.7), candidate(1.0, "clone", (2,), 1)])
    return first + third + rest


def test_ids_are_consecutive_and_records_round_trip(archive):
    made = family(archive)
    assert [c.id for c in made] == [1, 2, 3, 4, 5]
    stored = archive.candidate(3)
    assert stored is not None
    assert (stored.deltas, stored.scratchpad, stored.operator, stored.parents, stored.strategy, stored.fitness) == (
        {"0": 0.5, "1": -0.5}, "notes 0.5", "crossover", (1, 2), "ga", 0.7)
    assert stored.created > 0
    # The best is the fittest; on a tie the earliest.
    assert archive.best().id == 3
    archive.assess(5, 0.9, 4.0, 1.0)
    assert archive.best().id == 5 and archive.candidate(5).mean_tokens == 4.0


def test_lineage_queries(archive):
    family(archive)
    lineage = archive.lineage()
    assert lineage.parents(3) == [1, 2] and lineage.parents(1) == []
    assert lineage.ancestors(4) == [1, 2, 3]
    assert lineage.descendants(2) == [3, 4, 5] and lineage.descendants(4) == []
    assert [lineage.children_count(i) for i in (1, 2, 3, 4, 5)] == [1, 2, 1, 0, 0]
    assert lineage.common_ancestors(4, 5) == [2]
    assert lineage.distance(4, 1) == 2 and lineage.distance(1, 1) == 0


def test_rollback_forgets_an_interrupted_step_but_keeps_answers_and_calls(archive):
    family(archive)
    archive.place([Placement(1, Spot(0, "pop", 0)), Placement(2, Spot(0, "pop", 1))], -1)
    archive.place([Placement(3, Spot(0, "pre", 0)), Placement(3, Spot(1, "pop", 0))], 0)
    archive.place([Placement(5, Spot(1, "pre", 0))], 1)
    archive.store({(genome_key([1.0, -1.0]), "q#1"): Answer("a", 3, True, "ok")}, "ctx", 0)
    archive.record_call(CallRecord("mutation", 4, (), 1, 1, 10, 2, 0.1, "accepted"))

    assert archive.rollback(3, from_step=1) == 2
    assert [c.id for c in archive.candidates()] == [1, 2, 3]
    assert [p[0] for p in archive.placements()] == ["g0_pop0", "g0_pop1", "g0_child0_pre", "g1_pop0"]
    assert archive.lineage().descendants(2) == [3]
    assert archive.metric_calls() == 1 and archive.reflector_tokens() == (1, 10, 2)
    # The next candidate takes the forgotten one's id again.
    assert archive.add([candidate(0.7, "mutation", (3,), 1)])[0].id == 4
    assert archive.integrity() == "ok"


def test_the_reply_tally_counts_the_calls_after_a_boundary_and_names_the_last_rejection(archive):
    family(archive)
    for outcome in ("accepted", "rejected: delta is 'up', not a number", "rejected: equal to the current value"):
        archive.record_call(CallRecord("mutation", 4, (), 1, 1, 10, 2, 0.1, outcome))
    assert archive.reply_tally() == ReplyTally(3, 3, 1, "equal to the current value")
    assert archive.reply_tally(after=1) == ReplyTally(newest=3, calls=2, accepted=0,
                                                     last_rejection="equal to the current value")
    assert archive.reply_tally(after=3) == ReplyTally(3, 0, 0, "")
    assert [c.outcome for c in archive.calls_about(4)][0] == "accepted"


def test_one_call_admits_a_steps_candidates_with_their_placements(archive):
    family(archive)
    made = archive.admit([candidate(2.0, "mutation", (4,), 1, fitness=0.8), candidate(3.0, "mutation", (4,), 1)],
                         [Spot(1, "mut", 0), None], [Placement(4, Spot(2, "pop", 0))], 1)
    assert [c.id for c in made] == [6, 7] and archive.lineage().parents(7) == [4]
    assert [p[:2] for p in archive.placements()] == [("g1_child0_mut", 6), ("g2_pop0", 4)]
    assert Placement(9, Spot(3, "cand", 0)).label == "c9" and Placement(9, Spot(3, "pre", 2)).label == "g3_child2_pre"
    # The named queries a strategy reads the archive with.
    assert [c.id for c in archive.assessed()] == [1, 2, 3, 4, 6] and [c.id for c in archive.initial()] == [1, 2]
    assert sorted(archive.among([7, 2, 99])) == [2, 7] and archive.among([]) == {}
    assert genome_key([3.0, -3.0]) in archive.genomes() and len(archive.genomes()) == 6  # 2 and 5 share a genome
    assert archive.last_step() == 1 and archive.last_event() is None
    archive.event("stop", reason="done")
    assert archive.last_event() == "stop"


def test_opening_an_existing_archive_writes_nothing_to_it(tmp_path, archive):
    family(archive)
    archive.close()
    before = (tmp_path / "run.sqlite").read_bytes()
    RunArchive.open(tmp_path / "run.sqlite").close()
    assert (tmp_path / "run.sqlite").read_bytes() == before


def test_the_answer_cache_is_keyed_by_genome_example_and_context(archive):
    genome = genome_key([0.5, -0.5])
    archive.store({(genome, "q1#x"): Answer("Revenue: $5", 4, True, "matches"),
                   (genome, "q2#y"): Answer("No", 2, False, "gold says yes")}, "ctx", cache_hits=0)
    archive.store({}, "ctx", cache_hits=7)
    assert archive.cached([genome, genome], ["q1#x", "q3#z"], "ctx") == {
        (genome, "q1#x"): Answer("Revenue: $5", 4, True, "matches")}
    assert archive.cached([genome], ["q1#x"], "other") == {}
    assert archive.cached([genome_key([0.5, -0.5000001])], ["q1#x"], "ctx") == {}
    assert archive.metric_calls() == 2 and archive.cache_hits() == 7
    assert set(archive.answers_for(genome, "ctx")) == {"q1#x", "q2#y"}


def test_genome_keys_are_exact():
    assert genome_key([0, 1]) == genome_key([0.0, 1.0])
    assert genome_key([0.1 + 0.2]) != genome_key([0.3])


def test_read_only_opening_sees_committed_rows_and_cannot_write(tmp_path, archive):
    family(archive)
    reader = RunArchive.open_read_only(tmp_path / "run.sqlite")
    assert len(reader.candidates()) == 5
    with pytest.raises(RunError, match=r"run\.sqlite' cannot be written: attempt to write a readonly database"):
        reader.add([candidate(2.0)])
    reader.close()


def test_missing_and_foreign_files_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="no run database at"):
        RunArchive.open_read_only(tmp_path / "nothing.sqlite")
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ConfigError, match="not a usable run database"):
        RunArchive.open(junk)
    assert junk.read_bytes() == b"this is not a database" * 100


def test_an_unknown_strategy_names_its_module():
    with pytest.raises(ConfigError, match="CONFIG_STRATEGY='nope' has no module compressor_2/strategies/nope.py"):
        load_strategy("nope")
    assert callable(load_strategy("ga").make)

"""The weighted candidate archive strategy: its arithmetic on hand-computed cases, then the
strategy end to end on the tiny model (outputs, the post-check, `show`, resume)."""

from __future__ import annotations

import json
import math
import random
import sqlite3
from dataclasses import replace

import networkx as nx
import numpy as np
import pytest

from compressor_2.cli import main
from compressor_2.clusters.builder import build_clusters
from compressor_2.clusters.tokens import AnswerTokens
from compressor_2.commands.evolve import evolve
from compressor_2.fitness import Record
from compressor_2.reflector.base import Reply, Usage
from compressor_2.reflector.local import LocalProposer
from compressor_2.strategies.archive.ops import (
    feedback_scope,
    batch_target,
    issues_of,
    midpoint_of,
    named_cluster,
    parent_weights,
    sample_issue_batch,
    sample_parents,
)
from tests.test_evolution_support import (
    config_for,
    interrupted_then_resumed,
    query,
    read_json,
    whole_and_resumed,
)

ARCHIVE = {"STRATEGY_ARCHIVE": "y", "ARCHIVE_ITERATIONS": "3"}


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_weights_are_quality_times_novelty():
    weights = parent_weights([0.5, 0.8, 0.8], [0, 0, 3], sharpness=10, midpoint=0.6, novelty_weight=1.0)
    assert weights == pytest.approx([sigmoid(-1.0), sigmoid(2.0), sigmoid(2.0) / 4])
    assert parent_weights([0.7], [3], 10, 0.7, 2.0) == pytest.approx([0.5 / 16])
    assert parent_weights([0.7], [3], 10, 0.7, 0.0) == pytest.approx([0.5])  # novelty off


def test_novelty_falls_with_children():
    weights = parent_weights([0.8] * 5, [0, 1, 2, 4, 8], 10, 0.5, 1.2)
    assert weights == sorted(weights, reverse=True) and len(set(weights)) == 5


def test_percentile_and_fixed_midpoints():
    scores = [0.1, 0.2, 0.3, 0.4, 0.5]
    assert midpoint_of(scores, None, 50) == pytest.approx(0.3)
    assert midpoint_of(scores, None, 80) == pytest.approx(0.42)
    assert midpoint_of(scores, 0.25, None) == 0.25


def test_parent_sampling_with_and_without_replacement():
    rng = random.Random(3)
    drawn = sample_parents([1, 2, 3], [0.0, 1.0, 0.0], 5, True, rng)
    assert drawn == [2] * 5
    assert sorted(sample_parents([1, 2, 3], [1.0, 1.0, 1.0], 5, False, rng)) == [1, 2, 3]


def record(i: int, answer: str, tokens: int, correct: bool) -> Record:
    return Record(f"q{i}", "Q?", answer, "gold", tokens, correct, "judge")


IDS = [str(c) for c in range(8)]


def padding_in(cluster: int, tokens: int = 4) -> list[int]:
    """A padding histogram with `tokens` tokens in `cluster` and one in cluster 2."""
    counts = [0] * len(IDS)
    counts[2] += 1
    counts[cluster] += tokens
    return counts


def test_issues_are_typed_from_the_records():
    records = [record(0, "$5", 1, False), record(1, "$7 million in 2020 and 2021", 9, False),
               record(2, "Revenue was $5 million, as the page says at length", 12, True),
               record(3, "$5 million", 3, True), record(4, "I cannot answer from the page.", 8, False)]
    issues = issues_of(records, {f"q{i}": 3 for i in range(5)}, lambda r: padding_in(6), IDS)
    assert [(i.id, i.type) for i in issues] == [("q0:cut_short", "cut_short"), ("q1:wrong", "wrong"),
                                               ("q2:padded", "padded"), ("q4:refusal", "refusal")]
    # cut short: EOS; a long wrong answer, a padded one, a refusal: their padding's cluster.
    assert [i.cluster for i in issues] == ["0", "6", "6", "6"]


def test_an_issue_names_any_cluster_by_its_answers_padding():
    assert named_cluster("padded", 12, 3, padding_in(7), IDS) == "7"
    assert named_cluster("refusal", 8, 3, padding_in(5), IDS) == "5"
    assert named_cluster("padded", 12, 3, [0] * len(IDS), IDS) == "0"  # no token beyond the gold's: EOS
    assert named_cluster("cut_short", 1, 3, padding_in(7), IDS) == "0"
    assert named_cluster("wrong", 4, 3, padding_in(7), IDS) == "1"  # about the gold's length: a wrong figure
    assert named_cluster("wrong", 6, 3, padding_in(7), IDS) == "7"  # at 2x the gold's tokens: padded and wrong
    assert named_cluster("wrong", 4, 3, padding_in(7), ["0", "2", "7"]) == "0"  # no numbers cluster
    # The padding as AnswerTokens counts it: the answer's tokens the gold does not have.
    tokens = AnswerTokens(CharTokenizer(), np.array([0] * 97 + [3] * 26 + [0] * 5), 8)
    assert tokens.padding("abcab", "ab").tolist() == [0, 0, 0, 3, 0, 0, 0, 0]
    assert tokens.padding("ab", "abc").tolist() == [0] * 8


class CharTokenizer:
    """One token per character, its code point: enough to count padding by hand."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(ch) for ch in text]}


def test_an_issue_batch_is_one_type_drawn_by_weight_times_count():
    records = [record(i, "$5", 1, False) for i in range(50)] + [
        record(i, "long correct answer here", 20, True) for i in range(50, 100)]
    issues = issues_of(records, {f"q{i}": 3 for i in range(100)}, lambda r: padding_in(4), IDS)
    rng = random.Random(0)
    batches = [sample_issue_batch(issues, {"cut_short": 3, "padded": 1}, 3, rng) for _ in range(300)]
    assert all(len(b) == 3 and len({i.type for i in b}) == 1 and len({i.id for i in b}) == 3 for b in batches)
    assert 0.65 < sum(b[0].type == "cut_short" for b in batches) / 300 < 0.85  # 3 x 50 : 1 x 50 -> 75%
    only = sample_issue_batch(issues, {"cut_short": 1, "padded": 0}, 80, random.Random(1))
    assert len(only) == 50 and {i.type for i in only} == {"cut_short"}  # all there are
    assert sample_issue_batch(issues, {"wrong": 1}, 3, random.Random(1)) == []
    # The batch names the cluster most of its issues name (the first drawn's on a tie).
    mixed = [replace(issues[0], cluster=c) for c in ("5", "7", "7")]
    assert batch_target(mixed) == "7" and batch_target(mixed[:2]) == "5" and batch_target([]) == "0"


def test_feedback_scopes_on_a_hand_built_lineage():
    graph = nx.DiGraph([(1, 2), (2, 3), (3, 4), (2, 5), (6, 7)])
    assert feedback_scope(graph, 4, "none", 3) == []
    assert feedback_scope(graph, 4, "ancestors", 2) == [2, 3, 4]
    assert feedback_scope(graph, 4, "ancestors", 9) == [1, 2, 3, 4]
    assert feedback_scope(graph, 3, "neighborhood", 1) == [2, 3, 4]
    assert feedback_scope(graph, 3, "neighborhood", 2) == [1, 2, 3, 4, 5]


# -- end to end -----------------------------------------------------------------------------

@pytest.mark.slow
def test_an_offline_archive_run_writes_every_output(tmp_path, shared, tiny_model_dir, capsys):
    config = config_for(tmp_path, shared, tiny_model_dir, **ARCHIVE)
    evolve(config)
    out = config.output_dir
    for name in ("deltas_best.json", "processor_best.py", "history.json", "tree.json", "snapshots.jsonl",
                 "archive_state.json", "archive_progress.png", "evolution_tree.png", "fitness_vs_generation.png"):
        assert (out / name).exists(), name
    snapshots = [json.loads(line) for line in (out / "snapshots.jsonl").read_text().splitlines()]
    assert [s["generation"] for s in snapshots] == [0, 1, 2]
    for s in snapshots:
        assert s["p10"] <= s["p50"] <= s["p90"] <= s["best_fitness"]
        assert set(s["seconds"]) == {"selection", "generation", "postcheck", "assessment"}
    assert snapshots[-1]["metric_calls"] == query(out, "SELECT count(*) FROM evaluations")[0][0]
    assert read_json(out / "history.json")[-1]["stop_reason"] == "all 3 iterations ran"
    # Every kept proposal has a feedback entry; parents come from the archive.
    kept = query(out, "SELECT id FROM candidates WHERE status = 'evaluated' AND operator != 'initial'")
    assert len(query(out, "SELECT candidate FROM feedback WHERE outcome LIKE 'fitness %'")) == len(kept) > 0
    assert {op for (op,) in query(out, "SELECT operator FROM candidates")} >= {"initial", "mutation",
                                                                               "vector_mutation", "crossover"}
    tree = read_json(out / "tree.json")
    assert len(tree["nodes"]) == len(kept) + 1 and tree["edges"]
    capsys.readouterr()
    assert main(["show", "--config", str(tmp_path / "test.config")]) == 0
    shown = capsys.readouterr().out
    assert "strategy      archive" in shown and "feedback log" in shown and "archive members" in shown


@pytest.mark.slow
def test_an_issue_batch_is_drawn_once_per_parent_and_names_the_clusters_moved(tmp_path, shared_eight_clusters,
                                                                             tiny_model_dir, monkeypatch):
    """Each parent's generators share one issue batch, of one type; the cluster
    generator moves the cluster the batch names, any of the 8 (not only EOS or numbers)."""
    seen: dict[tuple[int, int], list[tuple[str, tuple[str, ...], str | None]]] = {}

    def spy(method: str):
        original = getattr(LocalProposer, method)

        def call(self, request, messages, attempt):
            if attempt == 1:
                labels = tuple(r.reasoning.split("]")[0] for r in request.records)
                seen.setdefault((request.generation, request.candidate), []).append(
                    (method, labels, getattr(request, "target", None)))
            return original(self, request, messages, attempt)
        monkeypatch.setattr(LocalProposer, method, call)

    spy("mutation")
    spy("vector_mutation")
    config = config_for(tmp_path, shared_eight_clusters, tiny_model_dir, **{**ARCHIVE, "ARCHIVE_ITERATIONS": "4"},
                        NUM_CLUSTERS="6", ARCHIVE_GENERATORS='"cluster,vector"', ARCHIVE_REPLACE="n",
                        MAX_NEW_TOKENS="16")
    evolve(config)
    assert len(seen) == 7  # the seed alone in iteration 0, then 2 distinct parents
    for calls in seen.values():
        assert sorted(m for m, _, _ in calls) == ["mutation", "vector_mutation"]
        [labels] = {labels for _, labels, _ in calls}  # one batch per parent, shared by its generators
        assert len({label.split(",")[0] for label in labels}) == 1  # of one issue type
    targets = [target for calls in seen.values() for m, _, target in calls if m == "mutation"]
    assert set(targets) - {"0", "1"}, targets
    moved = [c for (c,) in query(config.output_dir, "SELECT change FROM feedback WHERE generator = 'cluster'")]
    assert {c.split(":")[0] for c in moved} == {f"cluster {t}" for t in targets}


@pytest.mark.slow
def test_only_viable_candidates_become_parents(tmp_path, shared, tiny_model_dir, monkeypatch, capsys):
    """Viability: correctness at least CONFIG_ARCHIVE_MIN_CORRECTNESS (0.9) of the
    seed candidate's. The tiny model's answers are never correct, so the test plants what
    viability is about: the seed is recorded 100% correct, and a member far fitter than
    any other but 50% correct joins it. The quality sigmoid would draw that member nearly
    every time; as it is not viable, it is never a parent nor a crossover partner."""
    from compressor_2.archive import Candidate
    from compressor_2.strategies.archive import strategy

    original = strategy.Archive.seed
    planted: list[int] = []

    def seed_and_plant(self) -> None:
        original(self)
        [seed] = self.run.archive.initial()
        self.run.archive.assess(seed.id, seed.fitness, seed.mean_tokens, 1.0)
        [fit] = self.run.archive.add([Candidate({**seed.deltas, "0": 3.0}, "", "mutation", (seed.id,), "archive", 0,
                                                fitness=0.99, mean_tokens=1.0, correctness=0.5)])
        planted.append(fit.id)

    monkeypatch.setattr(strategy.Archive, "seed", seed_and_plant)
    config = config_for(tmp_path, shared, tiny_model_dir, **ARCHIVE)
    evolve(config)
    out = config.output_dir
    parents = {p for (p,) in query(out, "SELECT DISTINCT parent FROM lineage")}
    assert parents == {1} and planted == [2]  # only the seed is viable: every other answer is wrong
    assert json.loads(query(out, "SELECT value FROM meta WHERE key = 'archive_viability'")[0][0]) == {
        "min_correctness": 0.9, "seed_correctness": 1.0, "threshold": 0.9}
    snapshots = [json.loads(line) for line in (out / "snapshots.jsonl").read_text().splitlines()]
    assert [s["viable"] for s in snapshots] == [1, 1, 1]
    capsys.readouterr()
    assert main(["show", "--config", str(tmp_path / "test.config")]) == 0
    shown = capsys.readouterr().out
    assert "viability: correctness >= 90.0% (0.9 x the seed candidate's 100.0%); 1 of " in shown
    assert any(line.strip().startswith("#2 ") and line.endswith("(not viable)") for line in shown.splitlines())
    with sqlite3.connect(out / "run.sqlite") as db:  # a hand edit that broke the rule
        db.execute("UPDATE meta SET value = '{\"threshold\": \"high\"}' WHERE key = 'archive_viability'")
    assert main(["show", "--config", str(tmp_path / "test.config")]) == 2
    assert "table meta, row archive_viability: not the viability rule" in capsys.readouterr().err


@pytest.mark.slow
def test_the_post_check_rejects_and_records(tmp_path, shared, tiny_model_dir):
    # The local reflector's first steps are about 1.0: a limit of 0.5 rejects every mutation.
    config = config_for(tmp_path, shared, tiny_model_dir, **{**ARCHIVE, "ARCHIVE_ITERATIONS": "2"},
                        ARCHIVE_DELTA_LIMIT='"0.5"')
    evolve(config)
    out = config.output_dir
    rejected = query(out, "SELECT id, note FROM candidates WHERE status = 'rejected'")
    assert rejected and all(note == "a delta outside [-0.5, 0.5]" for _, note in rejected)
    outcomes = dict(query(out, "SELECT candidate, outcome FROM feedback"))
    assert all(outcomes[cid] == f"rejected by the post-check: {note}" for cid, note in rejected)
    snapshots = [json.loads(line) for line in (out / "snapshots.jsonl").read_text().splitlines()]
    assert sum(s["rejected"] for s in snapshots) == len(rejected)
    # Rejected proposals cost no metric call: only the kept genomes were evaluated.
    kept = query(out, "SELECT count(*) FROM candidates WHERE status = 'evaluated'")[0][0]
    assert query(out, "SELECT count(DISTINCT genome) FROM evaluations")[0][0] == kept


@pytest.mark.slow
def test_the_post_check_tries_proposals_on_the_parents_failures(tmp_path, shared, tiny_model_dir, monkeypatch):
    """The seed answers in one token; a vector generator that switches EOS off makes every
    answer run to max_new_tokens, which is worse on the parent's failures: the try rejects
    it before a full assessment."""

    def eos_off(self, request, messages, attempt):
        deltas = {**request.deltas, "0": -30.0}
        return Reply(json.dumps({"deltas": deltas, "summary": "EOS off"}), Usage(calls=1))

    monkeypatch.setattr(LocalProposer, "vector_mutation", eos_off)
    ids = build_clusters(config_for(tmp_path, shared, tiny_model_dir)).cluster_ids
    start = tmp_path / "eos_up.json"
    start.write_text(json.dumps({cid: 8.0 if cid == "0" else 0.0 for cid in ids}))  # one-token answers
    config = config_for(tmp_path, shared, tiny_model_dir, **ARCHIVE, ARCHIVE_POSTCHECK_EXAMPLES="2",
                        ARCHIVE_GENERATORS='"cluster,vector"', INITIAL_DELTAS_PATH=f'"{start}"')
    evolve(config)
    out = config.output_dir
    notes = [n for (n,) in query(out, "SELECT note FROM candidates WHERE status = 'rejected'")]
    tried = [n for n in notes if n.startswith("on ") and "its parent failed or padded it scores" in n]
    duplicate = "its genome is already in the archive or in another proposal of this iteration"
    assert tried and set(notes) - set(tried) <= {duplicate}
    # A proposal the try rejected was answered on at most 2 examples, never assessed in full.
    tried_only = query(out, "SELECT genome, count(*) FROM evaluations GROUP BY genome HAVING count(*) < 3")
    assert len(tried_only) == len(set(tried_only)) and all(count <= 2 for _, count in tried_only)
    assert 1 <= len(tried_only) <= len(tried)


@pytest.mark.slow
def test_a_resumed_archive_run_ends_where_an_uninterrupted_one_does(tmp_path, shared, tiny_model_dir):
    whole, split = whole_and_resumed(tmp_path, shared, tiny_model_dir, ARCHIVE, {"ARCHIVE_ITERATIONS": "1"})
    assert read_json(whole / "archive_state.json") == read_json(split / "archive_state.json")
    assert read_json(whole / "deltas_best.json") == read_json(split / "deltas_best.json")
    for sql in ("SELECT id, operator, deltas, scratchpad, status, note, fitness FROM candidates ORDER BY id",
                "SELECT * FROM lineage ORDER BY child, position", "SELECT * FROM feedback ORDER BY candidate"):
        assert query(whole, sql) == query(split, sql), sql
    assert read_json(whole / "tree.json")["nodes"] == read_json(split / "tree.json")["nodes"]


@pytest.mark.slow
def test_an_archive_run_interrupted_mid_iteration_resumes_to_the_same_end(tmp_path, shared, tiny_model_dir,
                                                                          monkeypatch):
    """Ctrl+C while iteration 1's generators run: the rerun forgets what that iteration had
    made and replays it from the saved RNG."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir()
    cut.mkdir()
    evolve(config_for(whole, shared, tiny_model_dir, **ARCHIVE))
    interrupted_then_resumed(cut, shared, tiny_model_dir, ARCHIVE, 1, monkeypatch)
    for sql in ("SELECT id, operator, deltas, scratchpad, status, note, fitness FROM candidates ORDER BY id",
                "SELECT * FROM feedback ORDER BY candidate"):
        assert query(whole / "out", sql) == query(cut / "out", sql), sql
    snapshots = [json.loads(line) for line in (cut / "out" / "snapshots.jsonl").read_text().splitlines()]
    assert [s["generation"] for s in snapshots] == [0, 1, 2]

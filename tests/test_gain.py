"""What did I gain? The held-out check inside the run, `show --front`, `export` (on a
hand-built archive, so the right answer is known) and report.html."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from compressor_2.archive import Answer, Candidate, CheckResult, RunArchive, genome_key
from compressor_2.cli import main
from compressor_2.commands.evolve import evolve
from compressor_2.common.errors import ConfigError
from compressor_2.config import load_config
from compressor_2.data.example import Example
from compressor_2.data.financebench import examples_from_config, holdout_examples
from compressor_2.fitness import example_key
from compressor_2.outputs.report import render
from compressor_2.findings.checks import BASELINE_ID, training_baseline
from tests.test_evolution_support import config_for, interrupted, query, read_json, write_config

pytestmark = pytest.mark.slow

HOSTILE = '<script>console.error("escaped?")</script><img src="x" onerror="console.error(1)">'


def last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


# -- the held-out set in the config --------------------------------------------------------

def test_held_out_questions_that_are_also_in_the_pool_are_a_config_error(tmp_path, shared, tiny_model_dir):
    config = config_for(tmp_path, shared, tiny_model_dir, HOLDOUT_INDICES='"2"')  # the pool is "all"
    pool = examples_from_config(config)
    with pytest.raises(ConfigError, match=r"CONFIG_HOLDOUT_INDICES: held-out example 'fb-c' is also in the "
                                          r"training pool"):
        holdout_examples(config, pool)
    config = config_for(tmp_path, shared, tiny_model_dir, FINANCEBENCH_POOL_INDICES='"0-1"',
                        HOLDOUT_INDICES='"2"')
    assert [ex.id for ex in holdout_examples(config, examples_from_config(config))] == ["fb-c"]
    # The same file named as CONFIG_HOLDOUT_DATA overlaps the same way.
    config = config_for(tmp_path, shared, tiny_model_dir, HOLDOUT_DATA=f'"{shared / "train.jsonl"}"')
    with pytest.raises(ConfigError, match="CONFIG_HOLDOUT_DATA: held-out example 'fb-a'"):
        holdout_examples(config, examples_from_config(config))
    assert main(["evolve", "--config", str(write_config(tmp_path, shared, tiny_model_dir,
                                                        HOLDOUT_INDICES='"2"'))]) == 2
    assert not (tmp_path / "out" / "run.sqlite").exists()  # refused before any work


def test_held_out_indices_must_be_indices(tmp_path, shared, tiny_model_dir):
    with pytest.raises(ConfigError, match="CONFIG_HOLDOUT_INDICES='2;3' must be empty, 'all' or indices"):
        config_for(tmp_path, shared, tiny_model_dir, HOLDOUT_INDICES='"2;3"')


# -- the held-out check inside the run -----------------------------------------------------

HELDOUT_RUN = {"FINANCEBENCH_POOL_INDICES": '"0-1"', "NGEN": "2"}


@pytest.fixture(scope="module")
def heldout_runs(tmp_path_factory, shared, tiny_model_dir, uninterrupted) -> tuple[Path, Path, str]:
    """The same 2-generation run without and with a held-out question (fb-c), and what the
    second printed."""
    del uninterrupted  # built the shared clusters
    plain, checked = tmp_path_factory.mktemp("plain"), tmp_path_factory.mktemp("checked")
    evolve(config_for(plain, shared, tiny_model_dir, **HELDOUT_RUN))
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        evolve(config_for(checked, shared, tiny_model_dir, **HELDOUT_RUN, HOLDOUT_INDICES='"2"'))
    return plain / "out", checked / "out", printed.getvalue()


def test_the_held_out_check_changes_nothing_the_search_did(heldout_runs):
    plain, checked, _ = heldout_runs
    assert (checked / "deltas_best.json").read_bytes() == (plain / "deltas_best.json").read_bytes()
    assert read_json(checked / "evolution_state.json") == read_json(plain / "evolution_state.json")
    search = "SELECT genome, example, answer FROM evaluations ORDER BY 1, 2"
    assert query(checked, search) == query(plain, search)  # no held-out answer among the search's
    assert query(checked, "SELECT value FROM meta WHERE key = 'cache_hits'") == query(
        plain, "SELECT value FROM meta WHERE key = 'cache_hits'")
    assert query(plain, "SELECT count(*) FROM check_answers") == [(0,)]


def test_the_run_ends_with_the_best_and_the_baseline_held_out(heldout_runs):
    _, checked, printed = heldout_runs
    archive = RunArchive.open_read_only(checked / "run.sqlite")
    try:
        best = archive.best()
        heldout = archive.checks("heldout")
        zeros = genome_key([0.0] * len(best.deltas))
        assert zeros in heldout and genome_key(list(best.deltas.values())) in heldout
        assert all(r.examples == 1 for r in heldout.values())
        fresh, _ = archive.check_calls()
        assert fresh == len(heldout)  # one held-out question per genome checked, each made once
        answers = query(checked, "SELECT DISTINCT example FROM check_answers")
        assert [e.split("#")[0] for (e,) in answers] == ["fb-c"]
        b, z = heldout[genome_key(list(best.deltas.values()))], heldout[zeros]
    finally:
        archive.close()
    [line] = [line for line in printed.splitlines() if line.startswith("held-out (")]
    assert line.startswith(f"held-out (1 questions): best #{best.id} {b.mean_tokens:.1f} tokens")
    assert f"against the baseline's {z.mean_tokens:.1f} tokens, {100 * z.correctness:.1f}% correct" in line
    assert f"gap from training: {b.mean_tokens - best.mean_tokens:+.1f} tokens" in line
    assert f"held-out check: {len(heldout)} genomes" in printed
    assert (checked / "front.png").stat().st_size > 0 and (checked / "report.html").stat().st_size > 0
    # Then the stop oracle of the baseline's and the best's held-out answers, the run's last lines.
    oracle = printed.strip().splitlines()[-2 if b.mean_tokens != z.mean_tokens else -1:]
    assert oracle[0].startswith(f"stop oracle held out (1 questions), the baseline: {z.mean_tokens:.1f} -> ")
    assert all(line.startswith("stop oracle") for line in oracle)


def test_a_rerun_serves_the_held_out_check_from_the_cache(heldout_runs, tmp_path, shared, tiny_model_dir, capsys):
    _, checked, printed = heldout_runs
    work = tmp_path / "again"
    shutil.copytree(checked.parent, work)
    (work / "out" / "run.lock").unlink(missing_ok=True)
    before = query(work / "out", "SELECT count(*) FROM check_answers")
    config = write_config(work, shared, tiny_model_dir, **HELDOUT_RUN, HOLDOUT_INDICES='"2"')
    evolve(load_config(config))
    assert query(work / "out", "SELECT count(*) FROM check_answers") == before
    assert int(query(work / "out", "SELECT value FROM meta WHERE key = 'check_cache_hits'")[0][0]) > 0
    assert last_line(capsys.readouterr().out) == last_line(printed)


def test_show_front_prints_the_front_with_held_out_results(heldout_runs, capsys):
    _, checked, _ = heldout_runs
    assert main(["show", "--front", "--config", str(checked.parent / "test.config")]) == 0
    out = capsys.readouterr().out
    archive = RunArchive.open_read_only(checked / "run.sqlite")
    try:
        best = archive.best()
    finally:
        archive.close()
    assert "the front on the training pool" in out and f"#{best.id}" in out and "(best)" in out
    assert "baseline (#1): " in out  # the initial deltas are all zero: the search's first candidate
    rows = [line for line in out.splitlines() if line.strip().startswith("#")]
    assert rows and all(len(line.split()) >= 6 for line in rows)


# -- export, on a hand-built archive -------------------------------------------------------

def hand_built(out: Path, ids: list[str], points: list[tuple[float, float, float]],
               baseline_apart: tuple[float, float] | None = None, pool: Sequence[Example] = ()) -> list[int]:
    """An archive whose candidate i+1 has deltas (i+1)/10 on the first cluster and the
    (tokens, correctness, fitness) of points[i]; the first is all-zero unless the
    baseline is measured apart, with (tokens, correctness). Each candidate's answers to
    `pool` are stored (right, in its tokens): what `show --front` reads of them."""
    out.mkdir(parents=True, exist_ok=True)
    archive = RunArchive.open(out / "run.sqlite")
    try:
        archive.set_meta({"context": "ctx"})
        added = archive.add([
            Candidate({cid: (i + 1) / 10 if k == 0 and (i or baseline_apart) else 0.0 for k, cid in enumerate(ids)},
                      "", "initial" if i == 0 else "mutation", () if i == 0 else (1,), "ga", i, fitness=f,
                      mean_tokens=t, correctness=c)
            for i, (t, c, f) in enumerate(points)])
        for candidate, (tokens, _, _) in zip(added, points):
            genome = genome_key(list(candidate.deltas.values()))
            archive.store({(genome, example_key(ex)): Answer("$5", round(tokens), True, "") for ex in pool}, "ctx", 0)
        if baseline_apart:
            tokens, correct = baseline_apart
            archive.record_checks("training", [CheckResult("training", genome_key([0.0] * len(ids)), 3, tokens,
                                                           correct, 0.5)])
        archive.event("stop", reason="all 1 generations ran")
    finally:
        archive.close()
    return [c.id for c in added]


POINTS = [  # (tokens, correctness, fitness); #1 is the unsteered baseline
    (30.0, 1.0, 0.77), (20.0, 1.0, 0.83), (12.0, 0.99, 0.88), (8.0, 0.95, 0.90),  # #4: the best fitness
    (15.0, 0.98, 0.85), (10.0, 0.985, 0.89), (7.0, 0.5, 0.60),
]


@pytest.fixture
def export_run(tmp_path, shared, tiny_model_dir, uninterrupted) -> tuple[Path, list[str]]:
    del uninterrupted  # built the shared clusters
    ids = list(read_json(shared / "clusters" / "initial_deltas.json"))
    config = write_config(tmp_path, shared, tiny_model_dir)
    hand_built(tmp_path / "out", ids, POINTS)
    return config, ids


@pytest.mark.parametrize(("drop", "expected"), [("0", 2), ("0.01", 3), ("0.02", 6), ("0.05", 4), ("0.6", 7)])
def test_export_writes_the_shortest_candidate_within_the_drop(export_run, drop, expected, capsys):
    config, ids = export_run
    out = config.parent / "out"
    assert main(["export", "--config", str(config), "--max-correctness-drop", drop]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert printed.startswith(f"candidate #{expected}, the shortest on the front within")
    assert "Unvalidated: the run has no held-out check" in printed
    deltas = read_json(out / f"deltas_candidate_{expected}.json")
    archive = RunArchive.open_read_only(out / "run.sqlite")
    try:
        assert deltas == dict(archive.candidate(expected).deltas)
    finally:
        archive.close()
    assert set(read_json(out / f"deltas_candidate_{expected}.clusters.json")) == {"cluster_map"}
    processor = (out / f"processor_candidate_{expected}.py").read_text()
    compile(processor, "processor", "exec")
    assert f"SteeringProcessor.default_deltas = {tuple(deltas[c] for c in ids)!r}" in processor


def test_without_a_held_out_check_export_says_its_choice_is_unvalidated(export_run, capsys):
    config, _ = export_run
    assert main(["export", "--config", str(config), "--max-correctness-drop", "0.02"]) == 0
    assert "Unvalidated: the run has no held-out check (CONFIG_HOLDOUT_DATA)" in capsys.readouterr().out
    assert main(["export", "--config", str(config), "--max-correctness-drop", "0.02", "--confidence", "1"]) == 2
    assert capsys.readouterr().err.strip() == "error: export --confidence 1 must be in (0, 1), e.g. 0.95"


HELD_OUT = 40


def held_out_answers(out: Path, config_path: Path, ids: list[str], lost: dict[int, int]) -> None:
    """Held-out answers to the HELD_OUT questions of `config_path`'s held-out file: the
    baseline (candidate #1) right on all, in 30 tokens; candidate i of `lost` wrong on that
    many of them, in 30 - 2 * i tokens; and their check results."""
    config = load_config(config_path)
    questions = holdout_examples(config, examples_from_config(config))
    assert len(questions) == HELD_OUT
    archive = RunArchive.open(out / "run.sqlite")
    try:
        archive.set_meta({"context": "ctx"})
        results = []
        for cid in (1, *lost):
            genome = genome_key(list(archive.candidate(cid).deltas.values()))
            wrong, tokens = lost.get(cid, 0), 30 - 2 * (cid - 1)
            archive.check_answers.store({(genome, example_key(ex)): Answer("$5", tokens, i >= wrong, "")
                                         for i, ex in enumerate(questions)}, "ctx", 0)
            results.append(CheckResult("heldout", genome, HELD_OUT, tokens, 1 - wrong / HELD_OUT, 0.5))
        archive.record_checks("heldout", results)
    finally:
        archive.close()


def test_export_chooses_by_the_held_out_upper_bound_not_the_training_estimate(tmp_path, shared, tiny_model_dir,
                                                                             uninterrupted, capsys):
    del uninterrupted  # built the shared clusters
    ids = list(read_json(shared / "clusters" / "initial_deltas.json"))
    data = tmp_path / "heldout.jsonl"
    data.write_text("".join(json.dumps({"financebench_id": f"h{i}", "question": f"What was item {i}?", "answer": "$5",
                                        "evidence": [{"evidence_text_full_page": f"Item {i} was $5."}]}) + "\n"
                            for i in range(HELD_OUT)))
    config = write_config(tmp_path, shared, tiny_model_dir, HOLDOUT_DATA=f'"{data}"')
    hand_built(tmp_path / "out", ids, POINTS, pool=examples_from_config(load_config(config)))
    # The front: #4 (8 tokens, 95%), #6 (10, 98.5%), #3 (12, 99%), #2 (20, 100%). Held out, #4 loses 6 of the 40
    # questions (its drop's upper bound is far above 0.15), the others none (an upper bound of 8.8 points).
    held_out_answers(tmp_path / "out", config, ids, {4: 6, 6: 0, 3: 0, 2: 0})
    assert main(["export", "--config", str(config), "--max-correctness-drop", "0.15"]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    # On the training pool's estimate, #4 (95% against 100%) would be within 0.15.
    assert printed.startswith("candidate #6, the shortest held out of the front's candidates whose held-out "
                              "correctness drop is at most 0.15 at 95% confidence (upper bound 8.8 points); held out "
                              "(40 questions): 20.0 tokens")
    assert "100.0% correct, +0.0 points (95% CI -8.8 to +8.8; no significant difference, McNemar p=1)" in printed
    assert (tmp_path / "out" / "deltas_candidate_6.json").is_file()
    assert main(["export", "--config", str(config), "--max-correctness-drop", "0.05"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: export --max-correctness-drop 0.05: no front candidate's held-out correctness drop is at most 0.05 at "
        "95% confidence (the smallest upper bound is 8.8 points, #6's, on 40 questions): allow a larger drop, lower "
        "--confidence, check more held-out questions, or export with --candidate ID")
    assert main(["show", "--front", "--config", str(config)]) == 0
    shown = capsys.readouterr().out
    assert "held out: -15.0 points (95% CI " in shown and "a significant loss, McNemar p=0.031" in shown


def test_export_a_chosen_candidate_and_refuse_a_run_file(export_run, capsys):
    config, _ = export_run
    out = config.parent / "out"
    assert main(["export", "--config", str(config), "--candidate", "5", "--out", str(out / "deltas_mine.json")]) == 0
    assert (out / "deltas_mine.json").is_file() and (out / "processor_mine.py").is_file()
    capsys.readouterr()
    (out / "deltas_best.json").write_text("{}")
    assert main(["export", "--config", str(config), "--candidate", "5", "--out", str(out / "deltas_best.json")]) == 2
    assert "is a file of the run in" in capsys.readouterr().err
    assert (out / "deltas_best.json").read_text() == "{}"
    assert main(["export", "--config", str(config), "--candidate", "99"]) == 2
    assert "export --candidate 99: no such candidate" in capsys.readouterr().err


def test_export_refuses_a_broken_sidecar_of_the_best_deltas(export_run, capsys):
    """The sidecar names the clusters the run evolved on: a hand-broken one is refused, never
    silently replaced by the current clusters' digest."""
    config, _ = export_run
    out = config.parent / "out"
    (out / "deltas_best.clusters.json").write_text("{}")
    assert main(["export", "--config", str(config), "--candidate", "5"]) == 2
    err = capsys.readouterr().err
    assert "deltas_best.clusters.json' holds {}" in err and "rerun evolve, which rewrites it" in err
    assert not (out / "deltas_candidate_5.json").exists()


def test_a_drop_no_candidate_meets_is_one_line_and_exit_2(tmp_path, shared, tiny_model_dir, uninterrupted, capsys):
    del uninterrupted
    ids = list(read_json(shared / "clusters" / "initial_deltas.json"))
    config = write_config(tmp_path, shared, tiny_model_dir)
    # The baseline was measured apart (100%); every candidate is less correct.
    hand_built(tmp_path / "out", ids, [(20.0, 0.9, 0.8), (10.0, 0.8, 0.85)], baseline_apart=(30.0, 1.0))
    assert main(["export", "--config", str(config), "--max-correctness-drop", "0.05"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "error: export --max-correctness-drop 0.05: no candidate on the front is within 0.05 of the baseline's "
        "correctness (100.0%) (the most correct is #1 at 90.0%): allow a larger drop, or export with --candidate ID"]
    assert not list((tmp_path / "out").glob("deltas_candidate_*"))
    assert main(["export", "--config", str(config), "--max-correctness-drop", "0.1"]) == 0
    assert (tmp_path / "out" / "deltas_candidate_1.json").is_file()


# -- report.html ---------------------------------------------------------------------------

def test_the_report_escapes_answers_and_puts_failures_first(heldout_runs, tmp_path, shared, tiny_model_dir):
    _, checked, _ = heldout_runs
    work = tmp_path / "copy"
    shutil.copytree(checked.parent, work)
    config = load_config(write_config(work, shared, tiny_model_dir, **HELDOUT_RUN, HOLDOUT_INDICES='"2"'))
    pool = examples_from_config(config)
    archive = RunArchive.open(work / "out" / "run.sqlite")
    try:
        context = archive.meta("context")
        best = archive.best()
        zeros = genome_key([0.0] * len(best.deltas))
        best_key = genome_key(list(best.deltas.values()))
        # fb-b: the baseline right and the best wrong, with a hostile answer.
        archive.store({(zeros, example_key(pool[1])): Answer("No", 2, True, "")}, context, 0)
        archive.store({(best_key, example_key(pool[1])): Answer(HOSTILE, 9, False, "")}, context, 0)
        html = render(archive, work / "out", pool, holdout_examples(config, pool))
    finally:
        archive.close()
    assert "<script>console" not in html and "&lt;script&gt;console.error(&#34;escaped?&#34;)" in html
    assert 'src="x"' not in html
    training = html.split('id="answers-training"')[1].split("</table>")[0]
    assert training.index("fb-b") < training.index("fb-a")  # the broken one comes first
    assert training.count('class="broken"') == 1 and 'class="tag broken">broken' in training
    assert html.count("data:image/png;base64,") >= 3  # front, fitness, lengths (and the tree)
    assert "Held-out questions (1)" in html and "gap from training" in html.lower()


def test_a_search_that_starts_elsewhere_gets_its_baseline_measured_apart(tmp_path, shared, tiny_model_dir,
                                                                         uninterrupted):
    del uninterrupted  # built the shared clusters
    ids = list(read_json(shared / "clusters" / "initial_deltas.json"))
    initial = tmp_path / "initial.json"
    initial.write_text(json.dumps({cid: 0.5 if k == 0 else 0.0 for k, cid in enumerate(ids)}))
    evolve(config_for(tmp_path, shared, tiny_model_dir, NGEN="1", INITIAL_DELTAS_PATH=f'"{initial}"'))
    out = tmp_path / "out"
    zeros = genome_key([0.0] * len(ids))
    assert query(out, f"SELECT count(*) FROM evaluations WHERE genome = '{zeros}'") == [(0,)]  # not the search's
    assert query(out, f"SELECT count(*) FROM check_answers WHERE genome = '{zeros}'") == [(3,)]
    archive = RunArchive.open_read_only(out / "run.sqlite")
    try:
        baseline = training_baseline(archive)
        measured = archive.checks("training")[zeros]
    finally:
        archive.close()
    assert baseline is not None and baseline.id == BASELINE_ID
    assert (baseline.tokens, baseline.correctness) == (measured.mean_tokens, measured.correctness)
    assert "unsteered baseline</td>" in (out / "report.html").read_text()


def test_report_on_an_interrupted_run(tmp_path, shared, tiny_model_dir, monkeypatch, capsys):
    interrupted(tmp_path, shared, tiny_model_dir, {**HELDOUT_RUN, "HOLDOUT_INDICES": '"2"'}, 1, monkeypatch)
    assert "held-out (" not in capsys.readouterr().out  # a Ctrl+C skips the check
    (tmp_path / "out" / "report.html").unlink()
    assert main(["report", "--config", str(tmp_path / "test.config")]) == 0
    html = (tmp_path / "out" / "report.html").read_text()
    assert "interrupted (rerun evolve to resume)" in html
    assert "The held-out check runs when the search stops" in html


def test_the_report_names_the_judge_that_scored_and_warns_when_the_numeric_judge_scored_prose(tmp_path):
    from compressor_2.data.example import Example
    from compressor_2.outputs.report import scoring_judge, weak_gold_warning

    archive = RunArchive.open(tmp_path / "run.sqlite")
    try:
        assert scoring_judge(archive) == "unknown (the run recorded no settings)"
        archive.set_meta({"identity": json.dumps({"CONFIG_JUDGE_*": "numeric", "CONFIG_JUDGE_MODEL": "x"})})
        assert scoring_judge(archive) == "numeric"
        archive.set_meta({"identity": json.dumps({"CONFIG_JUDGE_*": "hybrid", "CONFIG_JUDGE_MODEL": "gpt-4o"})})
        assert scoring_judge(archive) == "hybrid (gpt-4o)"
        golds = [Example("p", "Which?", "Trillium, Array and Therachon", "p"), Example("f", "What?", "$1577.00", "f"),
                 Example("s", "What?", "Pension benefits were $1097 million and health care $862 million", "s")]
        assert 'id="judge-warning"' not in render(archive, tmp_path, golds, [])
        archive.set_meta({"identity": json.dumps({"CONFIG_JUDGE_*": "numeric"})})
        html = render(archive, tmp_path, golds, [])
        assert 'id="judge-warning">The numeric judge scored 1 prose golds' in html
    finally:
        archive.close()
    warning = weak_gold_warning("numeric", golds)
    assert warning.startswith("The numeric judge scored 1 prose golds (it agrees with people on 81.5% of those) and 1 "
                              "figures in prose golds (it agrees with people on 82.5% of those)")
    assert weak_gold_warning("hybrid (gpt-4o)", golds) == "" and weak_gold_warning("numeric", golds[1:2]) == ""

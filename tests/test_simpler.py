"""The simpler tools (compressor_2/findings/simpler.py): the EOS-only search and the cap's
arithmetic, then whole tiny runs with CONFIG_COMPARE_SIMPLE on and off: what they add, what
they never touch, the cache on a rerun, and a Ctrl+C inside them."""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

import pytest

from compressor_2.archive import RunArchive, genome_key
from compressor_2.commands.evolve import evolve
from compressor_2.common.errors import ConfigError
from compressor_2.config import load_config
from compressor_2.data.prompt import INSTRUCTED
from compressor_2.findings.claims import Arm
from compressor_2.findings.confidence import compare
from compressor_2.findings.simpler import (
    EOS_EVALUATIONS, EOS_GRID, TOOLS_META, Tool, ToolRow, Tools, cap_for, eos_search, read_tools_record, simpler_advice,
)
from tests.test_evolution_support import config_for, query, read_json, write_config

INSTRUCTION = "Answer with the figure only."


def test_the_eos_search_tries_the_grid_at_once_then_refines_within_its_budget():
    calls: list[list[float]] = []

    def assess(deltas):  # noqa: ANN001, ANN202 - a fitness peaked at +2.3
        calls.append(list(deltas))
        return [(30 - x, 1.0, -(x - 2.3) ** 2) for x in deltas]

    tried = eos_search(assess)
    assert calls[0] == list(EOS_GRID) and all(len(c) == 1 for c in calls[1:])
    assert len(tried) <= EOS_EVALUATIONS == 12 and len({t[0] for t in tried}) == len(tried)
    best = max(tried, key=lambda t: t[3])
    assert best[0] == pytest.approx(2.3, abs=0.02) and 2.0 <= best[0] <= 3.0  # in the grid best's bracket
    assert eos_search(assess) == tried  # no RNG: the same deltas every time


def test_the_eos_search_brackets_the_top_of_the_grid_up_to_its_far_end():
    tried = eos_search(lambda deltas: [(1.0, 1.0, x) for x in deltas])  # more bias, more fitness
    assert 7.5 < max(t[0] for t in tried) <= 8.0 and len(tried) <= EOS_EVALUATIONS


def test_the_cap_is_the_one_whose_cut_mean_matches_the_target():
    tokens = [5, 10, 20, 40]  # capped at n, their mean is that of min(t, n)
    assert cap_for(tokens, 8.75) == 10  # (5 + 10 + 10 + 10) / 4
    assert cap_for(tokens, 10.0) == 13  # 12 gives 9.75, 13 gives 10.25: of two as near, the longer cap
    assert cap_for(tokens, 100.0) == 40  # no cap reaches it: the longest answer's length
    assert cap_for(tokens, 0.0) == 1


def test_a_tool_that_does_as_well_as_the_best_is_named_plainly():
    best = [(10, True)] * 40
    as_well = compare(best, [(10, True)] * 39 + [(11, False)])  # one question lost, no token longer for sure
    longer = compare(best, [(17, True)] * 40)
    eos = Tool("EOS bias alone (+2.1)", "an EOS bias of +2.1", Arm("2.1,0.0"))
    cap = Tool("a cap at 10 tokens", "a cap at 10 tokens (max_tokens)", Arm("0.0,0.0", cap=10))
    assert simpler_advice([ToolRow(eos, None, None, longer), ToolRow(cap, None, None, as_well)], 0.95) == (
        "On this model a cap at 10 tokens (max_tokens) does as well: deploy that.")
    assert simpler_advice([ToolRow(eos, None, None, longer)], 0.95) == (
        "None does as well as the evolved deltas (95% CIs, paired): the search earned its keep.")


# -- whole runs ------------------------------------------------------------------------------------

RUN = {"FINANCEBENCH_POOL_INDICES": '"0-1"', "NGEN": "2", "HOLDOUT_INDICES": '"2"'}
SIMPLE = {"COMPARE_SIMPLE": "y", "COMPARE_INSTRUCTION": f'"{INSTRUCTION}"'}


def printed_by(work: Path, shared: Path, model: Path, **symbols: str) -> str:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        evolve(config_for(work, shared, model, **symbols))
    return printed.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shared, tiny_model_dir, uninterrupted) -> tuple[Path, Path, str, list[dict[str, str]]]:
    """The same run with the simpler tools off and on (with an instruction), what the second
    printed, and the prompts its engine was given before any work."""
    del uninterrupted  # built the shared clusters
    off, on = tmp_path_factory.mktemp("simple_off"), tmp_path_factory.mktemp("simple_on")
    printed_by(off, shared, tiny_model_dir, **RUN)
    printed, prompts = recorded(on, shared, tiny_model_dir, **RUN, **SIMPLE)
    return off / "out", on / "out", printed, prompts


def recorded(work: Path, shared: Path, model: Path, **symbols: str) -> tuple[str, list[dict[str, str]]]:
    """What a run printed, and the prompts its engine was given before any work."""
    import compressor_2.engines.registry as registry

    prompts: list[dict[str, str]] = []
    make_engine = registry.make_engine

    def recording(config, clusters, given=None):  # noqa: ANN001, ANN202 - make_engine's signature
        prompts.append(dict(given or {}))
        return make_engine(config, clusters, given)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(registry, "make_engine", recording)
        printed = printed_by(work, shared, model, **symbols)
    return printed, prompts


def nonzero(genome: str) -> list[int]:
    return [i for i, x in enumerate(genome.split(",")) if float(x) != 0]


@pytest.mark.slow
def test_off_makes_no_extra_call_and_on_changes_nothing_the_search_did(runs):
    off, on, _, _ = runs
    assert (on / "deltas_best.json").read_bytes() == (off / "deltas_best.json").read_bytes()
    search = "SELECT genome, example, answer FROM evaluations ORDER BY 1, 2"
    assert query(on, search) == query(off, search)
    hits = "SELECT value FROM meta WHERE key = 'cache_hits'"
    assert query(on, hits) == query(off, hits)
    # Off: the held-out check's answers alone (one held-out question per genome), and nothing recorded.
    checked = query(off, "SELECT count(*) FROM check_results WHERE split = 'heldout'")[0][0]
    assert query(off, "SELECT count(*) FROM check_answers") == [(checked,)]
    assert query(off, f"SELECT count(*) FROM meta WHERE key = '{TOOLS_META}'") == [(0,)]
    assert query(on, "SELECT count(*) FROM check_answers")[0][0] > checked


@pytest.mark.slow
def test_the_eos_search_spends_at_most_its_evaluations_outside_the_budget(runs):
    _, on, _, _ = runs
    archive = RunArchive.open_read_only(on / "run.sqlite")
    try:
        record = read_tools_record(archive)
        metric_calls = archive.metric_calls()
    finally:
        archive.close()
    assert record is not None and 0 < len(record.eos) <= EOS_EVALUATIONS
    assert nonzero(record.eos_genome) == [0]  # cluster 0 alone
    # The EOS genomes that answered the pool, all in the checks' table: at most the budget, two questions each.
    on_pool = query(on, "SELECT genome, count(*) FROM check_answers WHERE example LIKE 'fb-a#%' OR example LIKE "
                        "'fb-b#%' GROUP BY genome")
    eos_only = {g: n for g, n in on_pool if nonzero(g) == [0]}
    assert 0 < len(eos_only) <= EOS_EVALUATIONS and set(eos_only.values()) == {2}
    assert {genome_key([t[0], *[0.0] * (len(cluster_ids(on)) - 1)]) for t in record.eos} >= set(eos_only)
    assert query(on, "SELECT count(*) FROM evaluations")[0][0] == metric_calls  # none among the search's
    assert record.eos_genome in {g for (g,) in query(on, "SELECT genome FROM check_results WHERE split = 'heldout'")}


@pytest.mark.slow
def test_the_instruction_and_the_cap_are_answered_and_the_engine_saw_the_instruction_first(runs):
    _, on, _, prompts = runs
    zeros = genome_key([0.0] * len(read_json(on / "deltas_best.json")))
    instructed = query(on, f"SELECT example FROM check_answers WHERE example LIKE '%{INSTRUCTED}#%' "
                           f"AND genome = '{zeros}'")
    assert sorted(e.split("#")[0] for (e,) in instructed) == [f"fb-{c}{INSTRUCTED}" for c in "abc"]
    best = genome_key(list(read_json(on / "deltas_best.json").values()))
    assert best != zeros  # the best's deltas with the instruction: on the held-out question alone
    with_best = query(on, f"SELECT example FROM check_answers WHERE example LIKE '%{INSTRUCTED}#%' "
                          f"AND genome = '{best}'")
    assert [e.split("#")[0] for (e,) in with_best] == [f"fb-c{INSTRUCTED}"]
    [given] = prompts  # the engine was made once, with every prompt of the run
    assert {k for k in given if k.endswith(INSTRUCTED)} == {f"fb-{c}{INSTRUCTED}" for c in "abc"}
    assert all(given[f"fb-{c}{INSTRUCTED}"] == f"{given[f'fb-{c}']}\n\n{INSTRUCTION}" for c in "abc")
    cap = read_json_meta(on)["cap"]
    long = query(on, f"SELECT count(*) FROM check_answers WHERE context NOT LIKE '%:cap%' AND genome = '{zeros}' "
                     f"AND tokens > {cap} AND example NOT LIKE '%{INSTRUCTED}#%'")[0][0]
    long += query(on, f"SELECT count(*) FROM evaluations WHERE genome = '{zeros}' AND tokens > {cap}")[0][0]
    cut = query(on, f"SELECT tokens FROM check_answers WHERE context LIKE '%:cap{cap}'")
    assert long > 0 and len(cut) == long and all(t == cap for (t,) in cut)  # those longer than the cap, cut at it


def cluster_ids(out: Path) -> list[str]:
    """The run's cluster ids, from its best deltas."""
    return list(read_json(out / "deltas_best.json"))


def read_json_meta(out: Path) -> dict:
    import json

    return json.loads(query(out, f"SELECT value FROM meta WHERE key = '{TOOLS_META}'")[0][0])


@pytest.mark.slow
def test_the_run_ends_with_the_simpler_tools_line(runs):
    _, on, printed, _ = runs
    last = [line for line in printed.splitlines() if line.strip()][-1]
    record = read_json_meta(on)
    assert last.startswith("simpler tools held out (1 questions): the evolved deltas: ")
    assert "; EOS bias alone (+" in last and f"; a cap at {record['cap']} token{'s' * (record['cap'] != 1)}: " in last
    assert "; the instruction: " in last
    assert last.endswith(("deploy that.", "the search earned its keep."))
    html = (on / "report.html").read_text()
    assert 'id="simpler-table"' in html and "EOS biases tried on the training pool" in html
    assert "judge that scored</div><div class=\"v\">numeric</div>" in html


@pytest.mark.slow
def test_a_rerun_serves_the_simpler_tools_from_the_cache(runs, tmp_path, shared, tiny_model_dir):
    _, on, printed, _ = runs
    work = tmp_path / "again"
    shutil.copytree(on.parent, work)
    (work / "out" / "run.lock").unlink(missing_ok=True)
    before = query(work / "out", "SELECT count(*) FROM check_answers")
    again = printed_by(work, shared, tiny_model_dir, **RUN, **SIMPLE)
    assert query(work / "out", "SELECT count(*) FROM check_answers") == before
    assert again.strip().splitlines()[-1] == printed.strip().splitlines()[-1]


@pytest.mark.slow
def test_ctrl_c_in_the_simpler_tools_skips_them_and_the_next_run_makes_them(tmp_path, shared, tiny_model_dir,
                                                                           uninterrupted, monkeypatch, capsys):
    del uninterrupted
    finish = Tools.finish

    def interrupted(self, best_tokens, best):  # noqa: ANN001, ANN202 - Tools.finish's signature
        raise KeyboardInterrupt

    monkeypatch.setattr(Tools, "finish", interrupted)
    with pytest.raises(KeyboardInterrupt):
        evolve(config_for(tmp_path, shared, tiny_model_dir, **RUN, **SIMPLE))
    assert "the checks after the search (held-out, simpler tools) were interrupted" in capsys.readouterr().out
    assert query(tmp_path / "out", f"SELECT count(*) FROM meta WHERE key = '{TOOLS_META}'") == [(0,)]
    monkeypatch.setattr(Tools, "finish", finish)
    evolve(config_for(tmp_path, shared, tiny_model_dir, **RUN, **SIMPLE))
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("simpler tools held out (1 questions)")
    assert read_json_meta(tmp_path / "out")["instruction"] == INSTRUCTION


def test_a_record_a_hand_edit_broke_is_one_line_naming_the_row(tmp_path):
    archive = RunArchive.open(tmp_path / "run.sqlite")
    try:
        archive.set_meta({TOOLS_META: '{"eos": [[1, 2, 3]], "eos_genome": "1.0", "cap": 3, "instruction": ""}'})
        with pytest.raises(ConfigError, match=f"table meta, row {TOOLS_META}: not what the simpler tools record"):
            read_tools_record(archive)
    finally:
        archive.close()


# -- the instruction in every prompt of the search (CONFIG_INSTRUCTION_IN_SEARCH) ----------------

IN_SEARCH = {**SIMPLE, "INSTRUCTION_IN_SEARCH": "y"}
ARMS = {  # the six arms' names, in order, on the end lines of a plain run and of an instructed one
    "n": ["the model as it is", "the evolved deltas", "EOS bias alone (", "a cap at ", "the instruction alone",
          "the instruction + the deltas evolved without it"],
    "y": ["the model as it is (no instruction)", "the deltas evolved with the instruction, without it",
          "EOS bias alone (", "a cap at ", "the instruction alone", "the instruction + the deltas evolved with it"],
}


@pytest.fixture(scope="module")
def instructed_run(tmp_path_factory, shared, tiny_model_dir, runs) -> tuple[Path, str, dict[str, str]]:
    """The plain run with an instruction (`runs`' second) with every prompt carrying it: its
    output dir, what it printed, and the prompts its engine was given before any work."""
    work = tmp_path_factory.mktemp("in_search")
    printed, [given] = recorded(work, shared, tiny_model_dir, **RUN, **IN_SEARCH)
    return work / "out", printed, given


def answers_of(out: Path, genome: str) -> dict[str, tuple[str, int, int]]:
    """Every answer of `genome` in a run's archive, the search's and the checks', by example key."""
    rows = query(out, f"SELECT example, answer, tokens, is_correct FROM evaluations WHERE genome = '{genome}' UNION "
                      f"SELECT example, answer, tokens, is_correct FROM check_answers WHERE genome = '{genome}' "
                      "AND context NOT LIKE '%:cap%'")
    return {example: (answer, tokens, correct) for example, answer, tokens, correct in rows}


@pytest.mark.slow
def test_an_instructed_run_asks_every_prompt_with_the_instruction(runs, instructed_run):
    _, plain, _, plain_prompts = runs
    out, _, given = instructed_run
    zeros = genome_key([0.0] * len(read_json(out / "deltas_best.json")))
    baseline = answers_of(out, zeros)
    # Its baseline is the instruction alone: the plain run's instruction arm, answer for answer.
    assert sorted(k.split("#")[0] for k in baseline if INSTRUCTED in k) == [f"fb-{c}{INSTRUCTED}" for c in "abc"]
    assert {k: v for k, v in baseline.items() if INSTRUCTED in k} == {
        k: v for k, v in answers_of(plain, zeros).items() if INSTRUCTED in k}
    # The model as it is answers the prompts with the instruction taken off: the plain run's own.
    assert {k: v for k, v in baseline.items() if INSTRUCTED not in k} == {
        k: v for k, v in answers_of(plain, zeros).items() if INSTRUCTED not in k}
    # The search's own answers are all to instructed prompts, and the engine knew both sides first.
    assert {e.split("#")[0] for (e,) in query(out, "SELECT example FROM evaluations")} == {
        f"fb-{c}{INSTRUCTED}" for c in "ab"}
    assert given == plain_prompts[0]
    # Its best's deltas without the instruction: on the held-out question alone.
    best = genome_key(list(read_json(out / "deltas_best.json").values()))
    assert best != zeros and [k.split("#")[0] for k in answers_of(out, best) if INSTRUCTED not in k] == ["fb-c"]
    assert read_json_meta(out)["in_search"] is True and read_json_meta(plain)["in_search"] is False


def six_arms_printed(printed: str) -> list[str]:
    lines = printed.splitlines()
    [start] = [i for i, line in enumerate(lines) if line.startswith("six arms ")]
    assert lines[start] == ("six arms held out (1 questions), each paired against the model as it is "
                            "(95% CIs, exact McNemar p):")
    return lines[start + 1:start + 7]


@pytest.mark.slow
@pytest.mark.parametrize("in_search", ["n", "y"])
def test_both_runs_end_with_all_six_arms_paired(runs, instructed_run, in_search):
    out, printed = (runs[1], runs[2]) if in_search == "n" else instructed_run[:2]
    arms = six_arms_printed(printed)
    assert [a.split(": ")[0].startswith(f"  {name}") for a, name in zip(arms, ARMS[in_search])] == [True] * 6, arms
    assert arms[0].endswith("% correct") and "(" not in arms[0].split(": ")[1]  # the reference, as it is
    for arm in arms[1:]:  # each paired against it: the tokens' and the points' intervals, the McNemar p
        assert " an answer, 95% CI " in arm and "% correct, " in arm and " points (95% CI " in arm, arm
        assert "McNemar p" in arm and "not measured" not in arm, arm
    with_instruction = {"n": [5], "y": [2, 3, 5]}[in_search]  # paired against the instruction alone too
    assert [i for i, arm in enumerate(arms) if "; against the instruction alone: " in arm] == with_instruction
    last = printed.strip().splitlines()[-1]
    assert last.startswith("simpler tools held out (1 questions)" + (
        ", every prompt of the run with the instruction: " if in_search == "y" else ": "))
    html = (out / "report.html").read_text()
    table = html.split('id="arms-table"', 1)[1].split("</table>", 1)[0]
    assert table.count("<tr") == 7 and all(name.split(" (")[0] in table for name in ARMS[in_search])
    assert ("unsteered baseline, with the instruction" in html) == (in_search == "y")


@pytest.mark.slow
def test_a_resume_that_flips_the_instruction_in_search_is_refused(instructed_run, tmp_path, shared, tiny_model_dir,
                                                                   capsys):
    from compressor_2.cli import main

    out, _, _ = instructed_run
    shutil.copytree(out, tmp_path / "out")
    (tmp_path / "out" / "run.lock").unlink(missing_ok=True)
    config = write_config(tmp_path, shared, tiny_model_dir, **RUN, **SIMPLE)
    capsys.readouterr()
    assert main(["evolve", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert (f"  CONFIG_INSTRUCTION_IN_SEARCH (y: the instruction it adds): {INSTRUCTION} when the run started, "
            "n now") in err.splitlines()


@pytest.mark.parametrize("instruction", ['""', '"   "'])
def test_the_instruction_in_search_needs_an_instruction(tmp_path, shared, tiny_model_dir, instruction):
    config = write_config(tmp_path, shared, tiny_model_dir, COMPARE_SIMPLE="y", COMPARE_INSTRUCTION=instruction,
                          INSTRUCTION_IN_SEARCH="y")
    with pytest.raises(ConfigError, match="INSTRUCTION_IN_SEARCH"):
        load_config(config)


def test_taking_the_instruction_off_gives_the_examples_back():
    from compressor_2.data.example import Example
    from compressor_2.data.prompt import instructed, uninstructed

    plain = (Example("fb-a", "Q?", "1", "Evidence:\nx\n\nQuestion: Q?"),)
    assert uninstructed(instructed(plain, INSTRUCTION), INSTRUCTION) == plain
    with pytest.raises(ValueError):
        uninstructed(plain, INSTRUCTION)


@pytest.mark.slow
def test_the_real_model_bench_reads_both_runs_into_its_six_arm_table(runs, instructed_run, tmp_path):
    """benchmarks/bench_real_model.py --table-only over the two runs above, laid out as its own."""
    from tests.test_real_model import bench

    module = bench()
    args = module.arguments(["--seeds", "0", "--strategies", "ga", "--out-root", str(tmp_path / "root"),
                             "--docs-dir", str(tmp_path / "docs"), "--table-only"])
    specs = module.plan(args)
    for spec, out in zip(specs, (runs[1], instructed_run[0])):  # plain, then instructed
        spec.folder.mkdir(parents=True)
        (spec.folder / "run").symlink_to(out)
        (spec.folder / "run.config").symlink_to(out.parent / "test.config")
    module.write_table(specs, args)
    result = read_json(tmp_path / "docs" / "results.json")
    assert [r["name"] for r in result["runs"]] == ["plain-ga-s0", "instructed-ga-s0"] and result["questions"] == [1]
    for run, variant in zip(result["runs"], ("n", "y")):
        assert all(a["name"].startswith(name) for a, name in zip(run["arms"], ARMS[variant], strict=True))
        assert all(a["vs_unsteered"]["questions"] == 1 for a in run["arms"])
        assert [a["key"] for a in run["arms"] if a["vs_instruction"]] == (
            ["instruction_deltas"] if variant == "n" else ["eos", "cap", "instruction_deltas"])
    # The instructed run's instruction alone is the plain run's, answer for answer.
    [plain_alone], [instructed_alone] = ([a["vs_unsteered"] for a in r["arms"] if a["key"] == "instruction"]
                                         for r in result["runs"])
    assert plain_alone == instructed_alone
    assert (tmp_path / "docs" / "table.md").read_text().count("\n| plain · ga · seed 0 | ") == 6

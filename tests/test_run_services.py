"""What every strategy relies on, end to end on the tiny model: budgets (stop, reason,
resume with a raised budget, the up-front warning), the run-directory lock, old run
directories, and `show` on a finished and on an interrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from compressor_2.cli import main
from compressor_2.commands.evolve import evolve
from compressor_2.common.errors import ConfigError
from tests.conftest import REPO
from tests.fakes.openai_server import FakeOpenAIServer, chat_completion
from tests.test_evolution_support import config_for, interrupted, query, read_json, write_config

pytestmark = pytest.mark.slow




def last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


def test_a_metric_call_budget_stops_the_run_and_a_raised_one_continues_it(tmp_path, shared, tiny_model_dir,
                                                                           uninterrupted, capsys):
    evolve(config_for(tmp_path, shared, tiny_model_dir, MAX_METRIC_CALLS="5"))
    out = capsys.readouterr().out
    # Three examples: the initial population costs 3, so generation 0 starts under budget
    # and finishes; the budget stops the run before generation 1.
    assert "warning: CONFIG_MAX_METRIC_CALLS=5 leaves 5 metric calls, enough for about 0 generation(s)" in out
    spent = query(tmp_path / "out", "SELECT count(*) FROM evaluations")[0][0]
    reason = f"CONFIG_MAX_METRIC_CALLS=5 reached ({spent} metric calls)"
    assert last_line(out).startswith(f"stopped: {reason}; best fitness")
    history = read_json(tmp_path / "out" / "history.json")
    assert [h["generation"] for h in history] == [0, 1] and history[-1]["stop_reason"] == reason
    assert history[0]["metric_calls"] == spent
    assert read_json(tmp_path / "out" / "evolution_state.json")["generation"] == 1

    # The same budget again: nothing to spend, nothing generated, the history as it was.
    evolve(config_for(tmp_path, shared, tiny_model_dir, MAX_METRIC_CALLS="5"))
    assert last_line(capsys.readouterr().out).startswith(f"stopped: {reason}")
    assert query(tmp_path / "out", "SELECT count(*) FROM evaluations")[0][0] == spent
    assert read_json(tmp_path / "out" / "history.json") == history

    # Unlimited: the run continues to the end, exactly as if it had never stopped.
    evolve(config_for(tmp_path, shared, tiny_model_dir))
    assert last_line(capsys.readouterr().out).startswith("done: all 4 generations ran")
    assert read_json(tmp_path / "out" / "evolution_state.json") == read_json(uninterrupted / "evolution_state.json")
    assert query(tmp_path / "out", "SELECT genome, example FROM evaluations ORDER BY 1, 2") == query(
        uninterrupted, "SELECT genome, example FROM evaluations ORDER BY 1, 2")
    stops = [json.loads(d)["reason"] for (d,) in query(tmp_path / "out", "SELECT detail FROM events "
                                                                         "WHERE kind = 'stop' ORDER BY id")]
    assert stops == [reason, reason, "all 4 generations ran"]


def test_a_wall_time_budget_stops_inside_the_step_in_progress(tmp_path, shared, tiny_model_dir, monkeypatch,
                                                             capsys):
    """The budget's clock is the test's: no time passes until the first answer is stored,
    then an hour (the 6 ms of real time the budget once had ran out before the first step
    ended on a loaded machine, issue X, item 10). Generation 0 evaluates its population
    under the budget; its next fresh answers (the mutated children's) are refused: the
    step stops there, unfinished."""
    import functools

    from compressor_2.run.budget import Budget

    def clock() -> float:
        return 3600.0 if (tmp_path / "out" / "run.sqlite").exists() and query(
            tmp_path / "out", "SELECT count(*) FROM evaluations")[0][0] else 0.0

    monkeypatch.setattr("compressor_2.commands.evolve.Budget", functools.partial(Budget, clock=clock))
    evolve(config_for(tmp_path, shared, tiny_model_dir, MAX_WALL_MINUTES='"0.0001"'))
    out = capsys.readouterr().out
    assert "stopped: CONFIG_MAX_WALL_MINUTES=0.0001 reached" in last_line(out)
    assert read_json(tmp_path / "out" / "evolution_state.json")["generation"] == 0
    assert query(tmp_path / "out", "SELECT count(*) FROM evaluations") == [(3,)]  # the initial genome's only
    assert query(tmp_path / "out", "SELECT count(*) FROM candidates WHERE operator = 'mutation'") == [(0,)]
    assert float(query(tmp_path / "out", "SELECT value FROM meta WHERE key = 'wall_seconds'")[0][0]) > 0


def test_a_reflector_token_budget_counts_every_attempt(tmp_path, shared, tiny_model_dir, monkeypatch, capsys):
    monkeypatch.setenv("C2_TEST_REFLECTOR_KEY", "sk-budget")

    def answer(body: dict) -> tuple[int, object]:
        if "delta" in body["response_format"]["json_schema"]["schema"]["properties"]:
            return 200, chat_completion(json.dumps({"delta": 1.5, "scratchpad": "up"}), prompt_tokens=100,
                                        completion_tokens=10)
        return 200, chat_completion('{"scratchpad": "merged"}', prompt_tokens=50, completion_tokens=5)

    with FakeOpenAIServer(answer) as server:
        evolve(config_for(tmp_path, shared, tiny_model_dir, MAX_REFLECTOR_TOKENS="1", REFLECTOR_OPENAI="y",
                          REFLECTOR_BASE_URL=f'"{server.base_url}"', REFLECTOR_API_KEY_ENV='"C2_TEST_REFLECTOR_KEY"',
                          REFLECTOR_MAX_RETRIES="0"))
    out = capsys.readouterr().out
    assert "warning: CONFIG_MAX_REFLECTOR_TOKENS=1 leaves 1 tokens" in out
    calls = query(tmp_path / "out",
                 "SELECT kind, prompt_tokens, completion_tokens, verdict, latency FROM reflector_calls")
    spent = sum(p + c for _, p, c, _, _ in calls)
    assert calls and all(v == "accepted" and lat >= 0 for *_, v, lat in calls)
    assert f"stopped: CONFIG_MAX_REFLECTOR_TOKENS=1 reached ({spent} reflector tokens)" in last_line(out)
    # Generation 0's merges spent the budget (its children, averages of equal parents, are
    # the initial genome, served from the cache): it stops before its mutated children's
    # fresh answers, with only the initial genome answered, and resumes at generation 0.
    assert {kind for kind, *_ in calls} == {"merge", "mutation"}
    assert query(tmp_path / "out", "SELECT count(*) FROM evaluations")[0][0] == 3
    assert read_json(tmp_path / "out" / "evolution_state.json")["generation"] == 0
    assert read_json(tmp_path / "out" / "history.json")[-1]["stop_reason"].startswith("CONFIG_MAX_REFLECTOR_TOKENS")


def test_a_second_evolve_on_a_busy_directory_refuses_at_once(tmp_path, shared, tiny_model_dir):
    config_path = write_config(tmp_path, shared, tiny_model_dir, NGEN="12")
    out = tmp_path / "out"
    log = tmp_path / "first.err"
    with log.open("w") as err:
        # Unbuffered, so its "evolving ..." line (printed once it holds the lock) arrives at once.
        first = subprocess.Popen([sys.executable, "-m", "compressor_2", "evolve", "--config", str(config_path)],
                                 cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert first.stdout is not None
    for line in first.stdout:
        if line.startswith("evolving "):
            break
    else:
        raise AssertionError(f"the first run ended before it started evolving: {log.read_text()}")
    assert (out / "run.lock").read_text().strip() == str(first.pid)
    # Paused while the second one runs, so the first cannot finish first however fast it is.
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = subprocess.run([sys.executable, "-m", "compressor_2", "evolve", "--config", str(config_path)],
                                cwd=REPO, capture_output=True, text=True, timeout=120)
        still_running = first.poll() is None
    finally:
        os.kill(first.pid, signal.SIGCONT)
    first.communicate(timeout=300)
    assert first.returncode == 0, log.read_text()
    assert still_running, "the first run ended before the second started: the test proved nothing"
    assert second.returncode == 1
    assert second.stderr.strip().splitlines() == [
        f"error: '{out}' is in use by another evolve (pid {first.pid}): wait for it to finish or stop it, "
        "or choose another CONFIG_OUTPUT_DIR"]
    assert query(out, "PRAGMA integrity_check") == [("ok",)]
    assert read_json(out / "evolution_state.json")["generation"] == 12
    assert [h["generation"] for h in read_json(out / "history.json")] == list(range(13))


def test_an_output_directory_of_the_previous_version_is_refused_with_what_to_do(tmp_path, shared, tiny_model_dir,
                                                                                capsys):
    config_path = write_config(tmp_path, shared, tiny_model_dir)
    out = tmp_path / "out"
    out.mkdir()
    old_state = {"generation": 2, "population": [], "best_individual": None, "best_fitness": None, "rr_idx": 0,
                 "rng": {}}
    (out / "evolution_state.json").write_text(json.dumps(old_state))
    (out / "history.json").write_text("[]")
    assert main(["evolve", "--config", str(config_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "without the run archive" in err[0] and "move the directory away" in err[0]
    assert sorted(p.name for p in out.iterdir()) == ["evolution_state.json", "history.json", "run.lock"]


def test_a_lost_state_file_is_not_taken_for_a_fresh_start(tmp_path, shared, tiny_model_dir):
    evolve(config_for(tmp_path, shared, tiny_model_dir, NGEN="2"))
    (tmp_path / "out" / "evolution_state.json").unlink()
    with pytest.raises(ConfigError, match="holds steps up to 1 but .*evolution_state.json' is missing"):
        evolve(config_for(tmp_path, shared, tiny_model_dir, NGEN="2"))
    assert query(tmp_path / "out", "SELECT count(*) FROM candidates WHERE generation = 1")[0][0] > 0


def test_show_summarises_a_finished_run_and_its_best_lineage(uninterrupted, capsys):
    before = os.stat(uninterrupted / "run.sqlite").st_mtime_ns
    assert main(["show", "--config", str(uninterrupted.parent / "test.config")]) == 0
    out = capsys.readouterr().out
    state = read_json(uninterrupted / "evolution_state.json")
    best = state["best_individual"]["candidate_id"]
    count = query(uninterrupted, "SELECT count(*) FROM candidates")[0][0]
    assert "strategy      ga" in out and "status        stopped: all 4 generations " in out
    assert f"candidates    {count} ({count} kept, 0 rejected)" in out
    assert f"best          #{best} " in out and f"fitness {state['best_fitness']:.4f}" in out
    lineage = out.split(f"lineage of #{best}, oldest first")[1].strip().splitlines()[1:]
    assert lineage[0].split()[3] == "initial" and lineage[-1].strip().startswith(f"#{best} ")
    assert os.stat(uninterrupted / "run.sqlite").st_mtime_ns == before


def test_show_a_candidate_with_its_answers_next_to_the_unsteered_ones(uninterrupted, capsys):
    config = str(uninterrupted.parent / "test.config")
    best = read_json(uninterrupted / "evolution_state.json")["best_individual"]["candidate_id"]
    assert main(["show", "--config", config, str(best)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"#{best} ") and "parents:" in out and "scratchpad:" in out
    assert f"answers on the training pool: #{best} vs unsteered" in out
    for example in ("fb-a", "fb-b", "fb-c"):
        assert f"\n{example}  gold: " in out
    assert out.count(f"\n  #{best}") == 3 and out.count("\n  unsteered ") == 3

    assert main(["show", "--config", config, "9999"]) == 2
    assert "candidate 9999 is not in" in capsys.readouterr().err


def test_show_an_interrupted_run(tmp_path, shared, tiny_model_dir, monkeypatch, capsys):
    interrupted(tmp_path, shared, tiny_model_dir, {}, 1, monkeypatch)
    capsys.readouterr()
    assert main(["show", "--config", str(tmp_path / "test.config")]) == 0
    out = capsys.readouterr().out
    assert "status        interrupted (rerun evolve to resume)" in out and "lineage of #" in out
    assert main(["show", "--config", str(tmp_path / "test.config"), "1"]) == 0
    assert capsys.readouterr().out.startswith("#1     gen 0   initial")

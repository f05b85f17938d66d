"""How a run ends, end to end on the tiny model with a fake OpenAI-compatible reflector:
every strategy stops once its steps make nothing new (issue S, item 2); a reflector that
accepts and never answers stops the run within its stated bound, saying meanwhile what the
run waits for (S3); the selection call carries its own sampling settings (P5);
and `evolve` leaves no thread of its own behind, whatever the exit (P8)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from compressor_2.cli import main
from tests.fakes.openai_server import HANG, FakeOpenAIServer, chat_completion, error_body
from tests.test_evolution_support import query, read_json, write_config

pytestmark = pytest.mark.slow

KEY = "sk-lifecycle-SECRET-7788"
KEY_ENV = "C2_LIFECYCLE_KEY"


def reflector_symbols(server: FakeOpenAIServer, **extra: str) -> dict[str, str]:
    return {"REFLECTOR_OPENAI": "y", "REFLECTOR_BASE_URL": f'"{server.base_url}"',
            "REFLECTOR_API_KEY_ENV": f'"{KEY_ENV}"', "REFLECTOR_MAX_RETRIES": "0", **extra}


def kind(body: dict[str, Any]) -> str:
    """mutation, vector, merge or selection: the request's response_format name."""
    return body["response_format"]["json_schema"]["name"].removeprefix("reflector_")


def constant_at(value: float) -> Any:
    """A reflector that proposes the same value whatever it is asked."""
    def answer(body: dict[str, Any]) -> tuple[int, Any]:
        if kind(body) == "mutation":
            reply: dict[str, Any] = {"delta": value, "scratchpad": f"always {value}"}
        elif kind(body) == "vector":
            ids = body["response_format"]["json_schema"]["schema"]["properties"]["deltas"]["properties"]
            reply = {"deltas": {cid: value for cid in ids}, "summary": f"all {value}"}
        else:
            reply = {"scratchpad": f"always {value}"}
        return 200, chat_completion(json.dumps(reply))
    return answer


constant = constant_at(2.5)


def far_initial_deltas(shared: Path, model: Path, work: Path) -> Path:
    """The session's initial deltas (and any sidecar of theirs) with every delta at 1e12,
    where a draw of scale 1e-12 or 1e-6 (CMA-ES's smallest sigma) rounds back to the same
    float (half an ulp there is 6e-5): a sampler that can only propose the genome it
    started from."""
    assert main(["build-clusters", "--config", str(write_config(work, shared, model))]) == 0  # cached after the first
    clusters = shared / "clusters"
    copied = work / "far"
    copied.mkdir()
    for path in clusters.glob("initial_deltas*"):
        shutil.copy(path, copied / path.name)
    deltas = read_json(clusters / "initial_deltas.json")
    (copied / "initial_deltas.json").write_text(json.dumps({cid: 1e12 for cid in deltas}))
    return copied / "initial_deltas.json"


# Each strategy with far more steps than it needs, and a guard that stops a run that never
# ends (the code before the fix) with another reason: a budget of reflector tokens (each fake
# reply reports 18), not of wall time, whose outcome would depend on the machine's speed.
IDLE = {"MAX_IDLE_STEPS": "2", "MAX_REFLECTOR_TOKENS": "20000"}
STRATEGIES = {
    "ga": {"NGEN": "100", "POPULATION_SIZE": "2", "CXPB": '"0"', "MUTPB": '"1"'},
    "archive": {"STRATEGY_ARCHIVE": "y", "ARCHIVE_ITERATIONS": "100", "ARCHIVE_GENERATORS": '"cluster,vector"'},
    # 50 is clamped to the bound on every delta, 30, which lies outside this post-check's [-20, 20]:
    # every proposal is refused before evaluation.
    "archive, clamped": {"STRATEGY_ARCHIVE": "y", "ARCHIVE_ITERATIONS": "100", "ARCHIVE_GENERATORS": '"cluster,vector"',
                         "ARCHIVE_DELTA_LIMIT": '"20"'},
    "gepa": {"STRATEGY_GEPA": "y", "MAX_METRIC_CALLS": "100000", "GEPA_VALSET_SIZE": "2", "GEPA_MINIBATCH_SIZE": "1",
             "GEPA_VAL_OVERLAP_FLOOR": "1", "GEPA_MERGE_SUBSAMPLE": "2"},
    "random": {"STRATEGY_RANDOM": "y", "RANDOM_BATCHES": "100", "RANDOM_BATCH_SIZE": "2", "RANDOM_SCALE": '"1e-12"'},
    "cmaes": {"STRATEGY_CMAES": "y", "CMAES_GENERATIONS": "100", "CMAES_POPULATION": "2", "CMAES_SIGMA": '"1e-6"'},
}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_reflector_proposing_only_known_genomes_stops_every_strategy(strategy, tmp_path, shared, tiny_model_dir,
                                                                      monkeypatch, capsys):
    monkeypatch.setenv(KEY_ENV, KEY)
    symbols = {**IDLE, **STRATEGIES[strategy]}
    if strategy in ("random", "cmaes"):
        symbols["INITIAL_DELTAS_PATH"] = f'"{far_initial_deltas(shared, tiny_model_dir, tmp_path)}"'
        # Deltas that far out are beyond the bound on every delta, which would refuse them: this
        # test is about the samplers' idle steps, so it lifts the bound past them.
        monkeypatch.setattr("compressor_2.deltas.DELTA_BOUND", 1e13)
    with FakeOpenAIServer(constant_at(50.0 if "clamped" in strategy else 2.5)) as server:
        config = write_config(tmp_path, shared, tiny_model_dir, **symbols, **reflector_symbols(server))
        code = main(["evolve", "--config", str(config)])
    out = capsys.readouterr().out
    proposer = "the sampler" if strategy in ("random", "cmaes") else "the reflector"
    reason = (f"{proposer} proposed only known genomes for 2 steps in a row: none made a fresh metric call "
              "(CONFIG_MAX_IDLE_STEPS=2)")
    assert code == 0, out
    assert out.strip().splitlines()[-1].startswith(f"stopped: {reason}; best fitness"), out
    assert read_json(tmp_path / "out" / "history.json")[-1]["stop_reason"] == reason
    stops = query(tmp_path / "out", "SELECT detail FROM events WHERE kind = 'stop'")
    assert [json.loads(d)["reason"] for (d,) in stops] == [reason]


def test_a_reflector_that_never_answers_stops_the_run_within_its_bound(tmp_path, shared, tiny_model_dir,
                                                                       monkeypatch, capsys):
    """One call is bounded by CONFIG_REFLECTOR_TIMEOUT, the client's retries included, so
    the run stops after MAX_CONSECUTIVE_FAILURES x TIMEOUT seconds of waiting (6 s here;
    before, each call took (1 + retries) x timeout plus the backoff waits, 27.5 s here).
    What proves the bound does not depend on the machine's speed: one HTTP request was
    made (the timeout covered the 3 retries) and the call gave up on its timeout. The line
    said while waiting is the next test's."""
    monkeypatch.setenv(KEY_ENV, KEY)
    with FakeOpenAIServer(lambda body: HANG) as server:
        config = write_config(tmp_path, shared, tiny_model_dir, NGEN="1", **reflector_symbols(
            server, REFLECTOR_TIMEOUT="6", REFLECTOR_MAX_RETRIES="3", REFLECTOR_MAX_CONSECUTIVE_FAILURES="1",
            REFLECTOR_CONCURRENCY="1"))
        code = main(["evolve", "--config", str(config)])
        requests = len(server.requests)
    captured = capsys.readouterr()
    out = tmp_path / "out"
    assert code == 1 and requests == 1  # one HTTP request: the timeout covers the retries
    assert "stopped: state saved to" in captured.err
    assert captured.err.strip().splitlines()[-1] == (
        f"error: the reflector at {server.base_url} failed 1 calls in a row "
        "(CONFIG_REFLECTOR_MAX_CONSECUTIVE_FAILURES); the last error: no reply within 6 s (CONFIG_REFLECTOR_TIMEOUT)")
    assert len(query(out, "SELECT created FROM events WHERE kind = 'failed'")) == 1
    assert read_json(out / "evolution_state.json")["generation"] == 0
    assert [p for p in out.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()] == []


def test_a_run_waiting_for_the_reflector_says_what_it_waits_for(tmp_path, shared, tiny_model_dir, monkeypatch):
    """Once a call has waited 5 s a line says what the run waits for. The call here never
    ends (a timeout of 600 s), so the line comes on any machine, however loaded: the test
    waits for it (a hang guard of 300 s, not a speed target), then presses Ctrl+C."""
    import queue

    from tests.test_resume import start_evolve

    monkeypatch.setenv(KEY_ENV, KEY)
    with FakeOpenAIServer(lambda body: HANG) as server:
        config = write_config(tmp_path, shared, tiny_model_dir, NGEN="1", **reflector_symbols(
            server, REFLECTOR_TIMEOUT="600", REFLECTOR_CONCURRENCY="1"))
        proc = start_evolve(config)
        lines: queue.Queue[str] = queue.Queue()
        for stream, keep in ((proc.stdout, True), (proc.stderr, False)):
            threading.Thread(target=lambda s=stream, k=keep: [lines.put(line) for line in s if k], daemon=True).start()
        try:
            line = ""
            while not line.startswith("waiting"):
                line = lines.get(timeout=300)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            finally:
                proc.kill()
    assert re.fullmatch(rf"waiting \d+ s for the reflector \({re.escape(server.base_url)}\): 1 call\(s\) in flight, "
                        r"the oldest a (merge|mutation) \(generation 0, child \d\); a call gives up after 600 s "
                        r"\(CONFIG_REFLECTOR_TIMEOUT\)\n", line), line
    assert proc.returncode == 130


def test_the_selection_call_carries_its_own_sampling_settings(tmp_path, shared, tiny_model_dir, monkeypatch,
                                                               capsys):
    """The selection goes out at temperature 0.5 with max_tokens 2048, for a more
    deterministic choice; the other calls leave both to the server."""
    monkeypatch.setenv(KEY_ENV, KEY)

    def answer(body: dict[str, Any]) -> tuple[int, Any]:
        return (200, chat_completion("{}")) if kind(body) == "selection" else constant(body)

    with FakeOpenAIServer(answer) as server:
        config = write_config(tmp_path, shared, tiny_model_dir, NGEN="1", SELECTION='"llm"',
                              SELECTION_FALLBACK='"tournament"', **reflector_symbols(server))
        assert main(["evolve", "--config", str(config)]) == 0, capsys.readouterr().err
    settings = {kind(r.body): (r.body.get("temperature"), r.body.get("max_tokens")) for r in server.requests}
    assert settings == {"selection": (0.5, 2048), "mutation": (None, None), "merge": (None, None)}


def ours(threads: set[threading.Thread]) -> set[str]:
    """The threads that are neither the fake's (it answers the requests) nor tqdm's
    monitor (one per process, started by the first progress bar)."""
    return {t.name for t in threads if "process_request_thread" not in t.name and t.name != "tqdm_monitor"}


def interrupting(body: dict[str, Any]) -> str:
    """Ctrl+C while the reflector call is in flight."""
    os.kill(os.getpid(), signal.SIGINT)
    return HANG


def failing_beside_a_hanging_call(body: dict[str, Any]) -> Any:
    """The archive strategy's cluster generator's call fails at once and stops the run
    (the loop waits for it first); its vector generator's call, beside it, never returns."""
    return (500, error_body("the model is on fire")) if kind(body) == "mutation" else HANG


EXITS = {  # the responder's maker, extra symbols, the exit code
    "done": (lambda: constant, {}, 0),
    "budget": (lambda: constant, {"MAX_METRIC_CALLS": "5"}, 0),
    "ctrl-c": (lambda: interrupting, {}, 130),
    "failure": (lambda: failing_beside_a_hanging_call,
                {"REFLECTOR_MAX_CONSECUTIVE_FAILURES": "1", "STRATEGY_ARCHIVE": "y",
                 "ARCHIVE_PARENTS_PER_ITERATION": "1", "ARCHIVE_GENERATORS": '"cluster,vector"'}, 1),
}


@pytest.mark.parametrize("exit_", list(EXITS))
def test_evolve_leaves_no_thread_behind_whatever_the_exit(exit_, tmp_path, shared, tiny_model_dir, monkeypatch,
                                                         capsys):
    """Reflector calls still running after `evolve` returned once made the fake that
    answered them print a traceback into a later test's output."""
    monkeypatch.setenv(KEY_ENV, KEY)
    make_responder, symbols, expected = EXITS[exit_]
    handler = signal.getsignal(signal.SIGINT)
    # As from a terminal: a test run started in the background (`make test &`) inherits an
    # ignored SIGINT, which the CLI keeps ignored, and the Ctrl+C exit needs it to arrive.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with FakeOpenAIServer(make_responder()) as server:
            config = write_config(tmp_path, shared, tiny_model_dir, NGEN="2", **symbols,
                                  **reflector_symbols(server))
            before = set(threading.enumerate())
            code = main(["evolve", "--config", str(config)])
            after = set(threading.enumerate())
    finally:
        signal.signal(signal.SIGINT, handler)  # the CLI leaves Ctrl+C ignored once one arrived
    assert code == expected, capsys.readouterr().err
    assert ours(after) == ours(before)

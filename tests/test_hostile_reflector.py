"""Issue K, items 1 and 2: no API key in any file or log line, whatever a server echoes;
a dead or broken reflector (or judge) endpoint stops the run with one line, never a run
that silently skips every mutation."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from compressor_2.cli import main
from tests.fakes.openai_server import FakeOpenAIServer, error_body
from tests.test_evolution_support import read_json, write_config

pytestmark = pytest.mark.slow

KEY = "sk-hostile-SECRET-4242"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reflector_symbols(url: str, **extra: str) -> dict[str, str]:
    return {"REFLECTOR_OPENAI": "y", "REFLECTOR_BASE_URL": f'"{url}"',
            "REFLECTOR_API_KEY_ENV": '"C2_HOSTILE_KEY"', "REFLECTOR_MAX_RETRIES": "0", **extra}


def files_with_key(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]


@pytest.mark.parametrize("status", [500, 429, 401])
def test_a_server_echoing_the_key_leaks_it_nowhere(tmp_path, shared, tiny_model_dir, monkeypatch, capsys, status):
    monkeypatch.setenv("C2_HOSTILE_KEY", KEY)

    def echo(body: dict, headers: dict[str, str]) -> tuple[int, object]:
        auth = next(v for k, v in headers.items() if k.lower() == "authorization")
        return status, error_body(f"bad request; you sent Authorization: {auth}")

    with FakeOpenAIServer(echo, with_headers=True) as server:
        config = write_config(tmp_path, shared, tiny_model_dir, NGEN="1",
                              **reflector_symbols(server.base_url, REFLECTOR_MAX_CONSECUTIVE_FAILURES="3"))
        code = main(["evolve", "--config", str(config)])
        assert any(KEY in json.dumps(r.headers) for r in server.requests)  # the key was sent, and echoed
    captured = capsys.readouterr()
    assert code == 1
    assert KEY not in captured.out + captured.err
    assert files_with_key(tmp_path) == []
    assert "***" in "".join(p.read_text() for p in (tmp_path / "out" / "reflector_prompts").glob("*.txt")) \
        or status == 401


def test_a_closed_reflector_port_stops_at_once(tmp_path, shared, tiny_model_dir, monkeypatch, capsys):
    monkeypatch.setenv("C2_HOSTILE_KEY", KEY)
    url = f"http://127.0.0.1:{closed_port()}/v1"
    config = write_config(tmp_path, shared, tiny_model_dir, **reflector_symbols(url))
    assert main(["evolve", "--config", str(config)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: the reflector API at {url} cannot be reached")
    assert not (tmp_path / "out" / "evolution_state.json").exists()


def test_a_closed_judge_port_stops_at_once(tmp_path, shared, tiny_model_dir, monkeypatch, capsys):
    monkeypatch.setenv("C2_HOSTILE_KEY", KEY)
    url = f"http://127.0.0.1:{closed_port()}/v1"
    config = write_config(tmp_path, shared, tiny_model_dir, JUDGE_LLM="y", JUDGE_BASE_URL=f'"{url}"',
                          JUDGE_API_KEY_ENV='"C2_HOSTILE_KEY"')
    assert main(["evolve", "--config", str(config)]) == 1
    assert capsys.readouterr().err.strip().startswith(f"error: the judge API at {url} cannot be reached")


def test_a_reflector_that_always_fails_stops_the_run_with_its_state_saved(tmp_path, shared, tiny_model_dir,
                                                                          monkeypatch, capsys):
    monkeypatch.setenv("C2_HOSTILE_KEY", KEY)
    with FakeOpenAIServer(lambda body: (500, error_body("the model is on fire"))) as server:
        # One call at a time, so exactly five are made (with more in flight, those finish).
        config = write_config(tmp_path, shared, tiny_model_dir, REFLECTOR_CONCURRENCY="1",
                              **reflector_symbols(server.base_url))
        code = main(["evolve", "--config", str(config)])
        calls = len(server.requests)
    err = capsys.readouterr().err
    assert code == 1 and calls == 5
    assert "stopped: state saved to" in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: the reflector at {server.base_url} failed 5 calls in a row")
    assert "the model is on fire" in last
    assert read_json(tmp_path / "out" / "evolution_state.json")["generation"] == 0
    assert main(["show", "--config", str(config)]) == 0
    assert "status        failed: the reflector at" in capsys.readouterr().out


def test_log_lines_and_texts_are_scrubbed_in_one_place(caplog):
    import logging

    from compressor_2.common.api_key import ScrubFilter, remember, scrub

    remember("sk-another-SECRET")
    assert scrub("Bearer sk-another-SECRET, again sk-another-SECRET") == "Bearer ***, again ***"
    logger = logging.getLogger("compressor_2.test_scrub")
    handler = caplog.handler
    handler.addFilter(ScrubFilter())
    try:
        logger.warning("server said %s", "key sk-another-SECRET")
    finally:
        handler.removeFilter(handler.filters[-1])
    assert caplog.records[-1].getMessage() == "server said key ***"

"""Several GPUs through SGLang's own router: the real sglang-router binary (installed from
the package registry into the cache; these tests skip, saying why, when it cannot be) on
127.0.0.1, in front of fake SGLang workers (tests/fakes/sglang_server.py) that log every
request they get.

A whole evolve and an evaluate through the router give what one server gives directly;
every worker gets every request's deltas, and round robin gives each some; a worker that
dies mid-run costs no answer; the /generate path, whose deltas the router drops, is
refused by the steering probe, naming the fix.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from compressor_2.commands.evaluate import run_evaluate
from compressor_2.commands.files import Files
from compressor_2.commands.evolve import evolve
from compressor_2.common.errors import RunError
from compressor_2.engines.sglang.engine import PROBE_TOKENS, SGLangEngine
from compressor_2.steering.guarded import guarded_spec
from compressor_2.steering.processor import processor_spec
from tests.sglang_helpers import ATTACHABLE, fake_server, logged_requests, probe_clusters, sglang_config
from tests.sglang_router import RouterUnavailable, fake_workers, router, router_python
from tests.test_evolution_support import config_for, query

pytestmark = pytest.mark.slow
WORKERS = 3
# Small and sure to end: 2 generations of 4 over the 3 training questions.
# Answers of the fake end near 16 tokens unsteered: room for the deltas to change them.
MAX_NEW_TOKENS = 24
RUN = {"ENGINE_SGLANG": "y", "TRANSFORMERS_DEVICE": None, "NGEN": "2", "EVAL_CONCURRENCY": "4",
       "SGLANG_REQUEST_TIMEOUT": "60", "MAX_NEW_TOKENS": str(MAX_NEW_TOKENS)}


@pytest.fixture(scope="module")
def python() -> Path:
    try:
        return router_python()
    except RouterUnavailable as exc:
        pytest.skip(str(exc))


def run_through(url: str, work: Path, shared: Path, model: Path, **symbols: str) -> Path:
    """A whole evolve attached to `url`, then an evaluate of its best deltas; the output dir."""
    work.mkdir()
    config = config_for(work, shared, model, **RUN, SGLANG_URLS=f'"{url}"', **symbols)
    evolve(config)
    deltas = config.output_dir / "deltas_best.json"
    run_evaluate(config, deltas_path=deltas, indices=None, out=work / "evaluation.json",
                 files=Files.of(config, {"evaluate --deltas": deltas}))
    return config.output_dir


def outcome(out: Path) -> dict[str, Any]:
    """Everything a run decided: every answer, every candidate's fitness, the best deltas,
    and the evaluation of those on the pool."""
    evaluation = json.loads((out.parent / "evaluation.json").read_text())
    return {
        "answers": query(out, "SELECT genome, example, answer, tokens, is_correct FROM evaluations "
                              "ORDER BY genome, example"),
        "candidates": query(out, "SELECT id, deltas, fitness, mean_tokens, correctness, status FROM candidates "
                                 "ORDER BY id"),
        "best": (out / "deltas_best.json").read_bytes(),
        "evaluation": {key: evaluation[key] for key in ("deltas", "summary", "records")},
    }


@pytest.fixture(scope="module")
def direct(tmp_path_factory: pytest.TempPathFactory, shared: Path, tiny_model_dir: Path) -> dict[str, Any]:
    """The reference: the same run against one fake server, directly (the /generate path)."""
    work = tmp_path_factory.mktemp("direct")
    with fake_server(tiny_model_dir, *ATTACHABLE) as url:
        return outcome(run_through(url, work / "run", shared, tiny_model_dir))


@pytest.fixture(scope="module")
def routed(python: Path, tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path):
    """WORKERS fake workers behind one router, shared by the tests that do not break them."""
    folder = tmp_path_factory.mktemp("routed")
    with fake_workers(tiny_model_dir, WORKERS, folder) as workers:
        with router(python, [w.url for w in workers], folder / "router.log") as url:
            yield url, workers


def completions(worker) -> list[dict[str, Any]]:
    return logged_requests(worker.requests, "/v1/completions")


def test_a_run_through_the_router_equals_one_server_and_every_worker_gets_the_deltas(
        routed, direct, shared: Path, tiny_model_dir: Path, tmp_path: Path):
    url, workers = routed
    out = run_through(url, tmp_path / "run", shared, tiny_model_dir)  # CONFIG_SGLANG_API=auto
    assert outcome(out) == direct

    received = [completions(worker) for worker in workers]
    # Round robin: every worker served a share of the run (the router's own probes included).
    answered = len(direct["answers"]) + len(direct["evaluation"]["records"])
    # evolve's engine and evaluate's: each worker's guarded and own probes, then the router's
    probes = 2 * (4 * WORKERS + 2)
    assert sum(map(len, received)) == answered + probes
    assert all(len(bodies) >= answered // WORKERS for bodies in received)
    for worker, bodies in zip(workers, received):
        for body in bodies:  # every request arrived with its deltas and the run's processor
            assert len(body["custom_params"]["deltas"]) == len(json.loads(direct["candidates"][0][1]))
            assert body["max_tokens"] in (MAX_NEW_TOKENS, PROBE_TOKENS) and isinstance(body["prompt"], str)
            assert body["return_token_ids"] is True  # passed on: the answers' prompt ids are checked
        # Every worker was also probed directly, before the router was: first with the string
        # that cannot kill it (once per engine), then with the run's.
        assert [max(b["custom_params"]["deltas"], key=abs) for b in bodies[:4]] == [1000.0, -1000.0] * 2
        guarded = [body for body in bodies if body["custom_logit_processor"] == guarded_spec()]
        assert bodies[:2] == guarded[:2] and len(guarded) == 4
        assert {body["custom_logit_processor"] for body in bodies if body not in guarded} == {processor_spec()}
        assert logged_requests(worker.requests, "/generate") == []


def test_a_worker_killed_mid_run_costs_no_answer(python: Path, direct, shared: Path, tiny_model_dir: Path,
                                                 tmp_path: Path, caplog):
    # The second worker dies abruptly when its 9th request arrives: past the probes (its own
    # 4 and one of the router's), at the run's first generation, with others of its requests
    # in flight. The router executes them again on the survivor.
    crash = ["--fake-crash-after", "8", "--fake-crash-marker", str(tmp_path / "crashed")]
    with fake_workers(tiny_model_dir, 2, tmp_path / "workers", flags_of={1: crash}) as workers:
        with router(python, [w.url for w in workers], tmp_path / "router.log") as url:
            with caplog.at_level(logging.WARNING, logger="compressor_2.engines"):
                out = run_through(url, tmp_path / "run", shared, tiny_model_dir)
        assert (tmp_path / "crashed").exists() and workers[1].process.poll() is not None
    assert outcome(out) == direct  # every answer, every fitness, the best deltas, the evaluation
    executed = [len(completions(worker)) for worker in workers]
    # (Requests arriving with the 9th are logged before it crashes the worker.)
    assert 9 <= executed[1] < 9 + int(RUN["EVAL_CONCURRENCY"])
    # The lost requests ran twice: the workers executed more than the archive holds answers.
    probes = (4 * 2 + 2) + (4 + 2)  # evolve: both workers and the router; evaluate: the survivor and the router
    assert sum(executed) > len(direct["answers"]) + len(direct["evaluation"]["records"]) + probes
    # The evaluate after the run found the dead worker still listed: it went on without it.
    [warning] = [r.getMessage() for r in caplog.records if "cannot be reached" in r.getMessage()]
    assert f"the router at {url} routes to {workers[1].url}, which cannot be reached" in warning


def test_the_generate_path_through_the_router_is_refused_by_the_probe(routed, tiny_model_dir: Path,
                                                                      tmp_path: Path):
    url, workers = routed
    config = sglang_config(tmp_path / "run", tiny_model_dir, sglang_urls=(url,), sglang_api="generate")
    with pytest.raises(RunError) as refused:
        SGLangEngine.from_config(config, probe_clusters(tiny_model_dir, tmp_path))
    assert str(refused.value).startswith(f"{url} ignores the steering deltas ")
    assert ("while the workers it routes to steer: it is an SGLang router, which drops "
            "sampling_params.custom_params from /generate (sglang-router 0.3.2 does); set "
            "CONFIG_SGLANG_API=completions (or auto)") in str(refused.value)
    # The workers passed the same probe, sent to each directly; the router's reached one without deltas.
    probes = [logged_requests(w.requests, "/generate") for w in workers]
    assert all(len(bodies) >= 4 for bodies in probes) and sum(map(len, probes)) == 4 * WORKERS + 2
    assert sum("custom_params" not in body["sampling_params"] for bodies in probes for body in bodies) == 2

"""The logit_bias engine against a fake OpenAI-compatible server (a real subprocess that
records every request and applies the map to a toy model's logits), and the map itself
against the transformers engine's bias."""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from compressor_2.clusters.clusterset import ClusterSet
from compressor_2.common import stop_on_first_signal
from compressor_2.common.errors import ConfigError, RunError
from compressor_2.engines.base import GenerationRequest
from compressor_2.engines.chat import chat_prompt
from compressor_2.engines.logit_bias.engine import LogitBiasEngine
from compressor_2.engines.logit_bias.server import PROBE_PROMPT, PROBE_TOKENS
from compressor_2.steering.bias import bias_matrix
from compressor_2.steering.logit_bias import logit_bias, touched
from tests.logit_bias_helpers import logged, logit_bias_config, logit_bias_server
from tests.sglang_helpers import free_port, probe_clusters

PROMPTS = ["Revenue was", "Total assets", "The answer is 1.9%", "net income was 5,363"]
ZEROS = (0.0, 0.0, 0.0)
EOS_SOONER = (3.0, 0.0, 0.0)  # cluster 0 is EOS
EOS_FIRST = (50.0, 0.0, 0.0)
MIXED = (0.0, 1.5, -2.0)
GATHERED = "[gathered]"  # a prompt holding this waits at the fake until 4 such are in flight


@pytest.fixture(scope="module")
def clusters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> ClusterSet:
    return probe_clusters(tiny_model_dir, tmp_path_factory.mktemp("clusters"))


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("log") / "requests.jsonl"
    with logit_bias_server(tiny_model_dir, "--fake-request-log", str(log), "--fake-gather", f"{GATHERED}:4") as url:
        yield url, log


@pytest.fixture(scope="module")
def engine(served, clusters, tiny_model_dir, tmp_path_factory):
    url, _ = served
    engine = LogitBiasEngine.from_config(logit_bias_config(tmp_path_factory.mktemp("run"), tiny_model_dir, url),
                                         clusters)
    yield engine
    engine.close()


def requests(*vectors: tuple[float, ...]) -> list[GenerationRequest]:
    return [GenerationRequest(prompt, vector) for vector in vectors for prompt in PROMPTS]


def test_the_map_holds_every_steered_token_whose_bias_is_not_zero_and_nothing_else():
    token_clusters = np.array([0, 1, 2, -1, 1, 2, 0, -1])
    assert logit_bias([2.0, 0.0, -1.5], token_clusters) == {"0": 2.0, "2": -1.5, "5": -1.5, "6": 2.0}
    assert logit_bias([0.0, 0.0, 0.0], token_clusters) == {}
    assert touched([2.0, 0.0, -1.5], token_clusters) == 4


def test_the_map_is_the_transformers_engines_bias_row():
    """Token by token, the map adds what `bias_matrix` adds in the transformers engine."""
    rng = np.random.default_rng(0)
    token_clusters = rng.integers(-1, 6, size=500)
    deltas = [0.0, *rng.normal(size=5).tolist()]
    row = bias_matrix(torch.tensor([deltas], dtype=torch.float32), torch.as_tensor(token_clusters), 500)[0]
    bias = logit_bias(deltas, token_clusters)
    # The server adds the map's numbers to float32 logits: the same float32 bias, token by token.
    assert np.array_equal(np.array([bias.get(str(t), 0.0) for t in range(500)], dtype=np.float32), row.numpy())
    assert all(str(t) not in bias for t in np.flatnonzero(token_clusters == -1))


def test_each_request_states_the_prompt_text_greedy_sampling_the_map_and_the_end_ids(engine, served, clusters,
                                                                                      tiny_model_dir):
    _, log = served
    before = len(logged(log))
    engine.generate(requests(MIXED))
    bodies = logged(log)[before:]
    tokenizer = engine.tokenizer
    assert sorted(b["prompt"] for b in bodies) == sorted(chat_prompt(tokenizer, p).text for p in PROMPTS)
    for body in bodies:
        assert body["logit_bias"] == logit_bias(MIXED, clusters.token_clusters)
        assert body["temperature"] == 0.0 and body["max_tokens"] == 24 and body["repeat_penalty"] == 1.0
        assert body["stop_token_ids"] == [tokenizer.eos_token_id] and body["model"] == str(tiny_model_dir)
    engine.generate(requests(ZEROS))
    assert all("logit_bias" in b and b["logit_bias"] == {} for b in logged(log)[before + len(PROMPTS):])


def test_the_probe_runs_once_before_the_first_request(engine, served):
    _, log = served
    probes = logged(log)[:3]
    assert [p["max_tokens"] for p in probes] == [PROBE_TOKENS] * 3
    assert all(p["prompt"] == chat_prompt(engine.tokenizer, PROBE_PROMPT).text for p in probes)
    assert "logit_bias" not in probes[0] and len(probes[1]["logit_bias"]) == len(engine.tokenizer)
    engine.generate(requests(ZEROS))
    assert sum(b["max_tokens"] == PROBE_TOKENS for b in logged(log)) == 3


def test_an_eos_bias_ends_answers_sooner_and_the_end_token_counts_as_elsewhere(engine):
    plain = engine.generate(requests(ZEROS))
    sooner = engine.generate(requests(EOS_SOONER))
    first = engine.generate(requests(EOS_FIRST))
    assert sum(g.completion_tokens for g in sooner) < sum(g.completion_tokens for g in plain)
    # The fake leaves the end token out of its usage, as llama-cpp-python does: the engine adds it.
    assert engine.counts_end is False
    assert all(g.text == "" and g.completion_tokens == 1 for g in first)


def test_a_server_that_counts_the_end_token_gives_the_same_counts(engine, clusters, tiny_model_dir, tmp_path):
    with logit_bias_server(tiny_model_dir, "--fake-counts-end") as url:
        other = LogitBiasEngine.from_config(logit_bias_config(tmp_path, tiny_model_dir, url), clusters)
        assert other.counts_end is True
        batch = requests(ZEROS, EOS_SOONER, EOS_FIRST, MIXED)
        assert other.generate(batch) == engine.generate(batch)


def test_requests_run_concurrently_within_the_bound(engine, served):
    url, _ = served
    answers = engine.generate([GenerationRequest(f"{GATHERED} {p}", ZEROS) for p in PROMPTS * 2])
    assert len(answers) == 8
    assert httpx.get(url + "/fake_stats").json()["most_in_flight"] == 4  # CONFIG_EVAL_CONCURRENCY


def test_a_server_that_ignores_logit_bias_is_refused_naming_it(clusters, tiny_model_dir, tmp_path):
    with logit_bias_server(tiny_model_dir, "--fake-ignore-logit-bias") as url:
        with pytest.raises(RunError, match=rf"^{url} ignores logit_bias: a map of 300 tokens pushing cluster") as err:
            LogitBiasEngine.from_config(logit_bias_config(tmp_path, tiny_model_dir, url), clusters)
    assert "\n" not in str(err.value)


def test_a_server_reading_another_prompt_is_refused_naming_it(clusters, tiny_model_dir, tmp_path):
    with logit_bias_server(tiny_model_dir, "--fake-extra-prompt-token") as url:
        with pytest.raises(RunError, match=rf"^{url} read the probe as \d+ prompt tokens, where CONFIG_MODEL_PATH's "
                                           "tokenizer makes \\d+: .*a second BOS"):
            LogitBiasEngine.from_config(logit_bias_config(tmp_path, tiny_model_dir, url), clusters)


def test_a_failed_request_is_sent_again_and_a_stalled_one_after_the_timeout(clusters, tiny_model_dir, tmp_path,
                                                                           engine, caplog):
    """Requests 4 and 5 (the first after the three probes) answer 503 and stall."""
    with logit_bias_server(tiny_model_dir, "--fake-fail", "4", "--fake-stall", "5") as url:
        other = LogitBiasEngine.from_config(
            logit_bias_config(tmp_path, tiny_model_dir, url, eval_concurrency=1, logit_bias_request_timeout=1.0),
            clusters)
        with caplog.at_level(logging.WARNING):
            answers = other.generate(requests(MIXED))
        assert answers == engine.generate(requests(MIXED))
        assert "(CONFIG_LOGIT_BIAS_REQUEST_TIMEOUT): sending it again (1 of at most 2)" in caplog.text
        assert httpx.get(url + "/fake_stats").json()["requests"] == 3 + len(PROMPTS) + 2


def test_an_unreachable_server_is_one_line(clusters, tiny_model_dir, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RunError, match=rf"^{url}/v1/models cannot be reached \(ConnectError: .*\): start the server"):
        LogitBiasEngine.from_config(logit_bias_config(tmp_path, tiny_model_dir, url), clusters)


def test_a_400_names_the_request_and_the_servers_message(engine):
    width = len(engine.clusters.cluster_ids)
    engine._maps[(9.0,) * width] = json.dumps({"100000": 1.0})  # a token the model does not have
    with pytest.raises(RunError, match=r"/v1/completions refused request 0 \(prompt ending 'Revenue was'\) \(HTTP "
                                       r"400\): index 100000 is out of bounds"):
        engine.generate([GenerationRequest(PROMPTS[0], (9.0,) * width)])


def test_deltas_by_answer_phase_are_refused_in_one_line(engine):
    with pytest.raises(ConfigError, match="a logit_bias map is static: it cannot change with the answer's phase"):
        engine.generate([GenerationRequest(PROMPTS[0], ZEROS * 2)])


def test_a_ctrl_c_inside_a_requests_task_stops_the_call_without_a_traceback(engine, caplog):
    """The first answer's progress callback runs inside that request's task: a SIGINT sent
    there raises KeyboardInterrupt in the task, as a Ctrl+C during a reply's parsing does."""
    def interrupt(count: int) -> None:
        del count
        os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a background suite ignores SIGINT
    try:
        with stop_on_first_signal(), caplog.at_level(logging.ERROR, logger="asyncio"):
            with pytest.raises(KeyboardInterrupt):
                engine.generate(requests(ZEROS), progress=interrupt)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text
    assert len(engine.generate(requests(ZEROS))) == len(PROMPTS)

"""The SGLang engine against the fake server (a real subprocess speaking SGLang's HTTP
protocol, loading the real processor string and applying the real custom_params)."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
from tokenizers import processors
from transformers import AutoTokenizer

from compressor_2.clusters.clusterset import ClusterSet
from compressor_2.common.errors import ConfigError, RunError
from compressor_2.config import Config
from compressor_2.engines.base import Generation, GenerationRequest
from compressor_2.engines.chat import chat_prompt, encode_prompt
from compressor_2.engines.sglang.engine import PROBE_PROMPT, PROBE_TOKENS, SGLangEngine
from compressor_2.engines.sglang.server import SGLangServer
from tests.sglang_helpers import (
    ATTACHABLE,
    chat_model,
    fake_server,
    fake_stats,
    free_port,
    logged_requests,
    probe_clusters,
    process_gone,
    sglang_config,
)

PROMPTS = ["Revenue was", "Total assets", "The answer is 1.9%", "net income was 5,363"]
ZEROS = (0.0, 0.0, 0.0)
EOS_SOONER = (3.0, 0.0, 0.0)  # cluster 0 is EOS
EOS_FIRST = (50.0, 0.0, 0.0)
EOS_NEVER = (-50.0, 0.0, 0.0)
GATHERED = "[gathered]"  # a prompt holding this waits at the fake until 4 such are in flight
MAX_NEW = 24  # sglang_config's max_new_tokens


@pytest.fixture(scope="module")
def clusters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> ClusterSet:
    return probe_clusters(tiny_model_dir, tmp_path_factory.mktemp("clusters"))


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path, clusters: ClusterSet, tmp_path_factory: pytest.TempPathFactory):
    """One launched fake server shared by the tests that do not break it."""
    config = sglang_config(tmp_path_factory.mktemp("run"), tiny_model_dir, "--fake-generate-delay", "0.05",
                           "--fake-gather", f"{GATHERED}:4")
    engine = SGLangEngine.from_config(config, clusters)
    yield engine
    engine.close()


def requests(*vectors: tuple[float, ...]) -> list[GenerationRequest]:
    return [GenerationRequest(p, v) for v in vectors for p in PROMPTS]


@pytest.fixture(scope="module")
def reference(engine: SGLangEngine) -> dict[GenerationRequest, Generation]:
    """Answers of a healthy server, to check crashed and attached runs against."""
    mixed = requests(ZEROS, EOS_SOONER, (0.0, 2.0, -2.0))
    return dict(zip(mixed, engine.generate(mixed)))


def test_eos_delta_changes_the_answers(engine: SGLangEngine):
    baseline = engine.generate(requests(ZEROS))
    sooner = engine.generate(requests(EOS_SOONER))
    first = engine.generate(requests(EOS_FIRST))
    never = engine.generate(requests(EOS_NEVER))

    assert all(1 < g.completion_tokens < MAX_NEW for g in baseline), "room in both directions"
    assert all(s.completion_tokens < b.completion_tokens for s, b in zip(sooner, baseline))
    assert [(g.completion_tokens, g.text) for g in first] == [(1, "")] * len(PROMPTS)
    assert [g.completion_tokens for g in never] == [MAX_NEW] * len(PROMPTS)
    assert all(g.text for g in never)
    assert len({g.text for g in never}) == len(PROMPTS), "answers follow the prompt"


def test_an_answer_ends_at_any_token_of_cluster_0_not_only_at_the_models_eos(engine: SGLangEngine,
                                                                            tiny_model_dir: Path, tmp_path: Path):
    """A server stops at its model's eos ids; cluster 0 may hold more end tokens (a GGUF of
    SmolLM2 ends at <|im_end|>, and <|endoftext|> is in cluster 0 too): requests name them
    all as stop ids, and the answer ends at the first, as the transformers engine's does."""
    clusters = probe_clusters(tiny_model_dir, tmp_path)
    token_clusters = clusters.token_clusters.copy()
    token_clusters[token_clusters == 0] = 1  # the model's eos leaves cluster 0 ...
    token_clusters[np.flatnonzero(token_clusters != 0)[-1]] = 0  # ... and a plain token takes its place
    np.save(clusters.token_clusters_path, token_clusters)
    moved = dataclasses.replace(clusters, token_clusters=token_clusters)
    attached = SGLangEngine(engine.urls, moved, engine.tokenize, temperature=0.0, max_new_tokens=MAX_NEW,
                            concurrency=2, request_timeout=60.0)
    answers = attached.generate(requests((50.0, -50.0, -50.0)))
    assert [(g.completion_tokens, g.text) for g in answers] == [(1, "")] * len(PROMPTS)


def test_requests_run_concurrently_within_the_bound(engine: SGLangEngine):
    # The fake holds these prompts until 4 are in flight: a client that sent them one at a
    # time would leave each waiting out STALL alone, and the count below at 1.
    gathered = [GenerationRequest(f"{GATHERED} {p}", v) for v in (ZEROS, EOS_SOONER, EOS_FIRST) for p in PROMPTS]
    engine.generate(gathered)  # 12 requests, concurrency 4
    assert fake_stats(engine.urls[0])["max_in_flight"] == 4


def test_one_server_and_one_processor_string_for_every_call(engine: SGLangEngine, reference):
    done: list[int] = []
    engine.generate(requests(ZEROS), progress=done.append)
    engine.generate(requests(EOS_NEVER), progress=done.append)
    assert done == [1] * (2 * len(PROMPTS))
    assert engine.server_starts == 1
    # The run's string, and the guarded one the probe sent first.
    assert fake_stats(engine.urls[0])["processor_strings"] == 2


def test_mixed_individuals_in_one_call_match_separate_calls(engine: SGLangEngine, reference):
    vectors = (EOS_SOONER, ZEROS, (0.0, 2.0, -2.0))
    separate = [g for v in vectors for g in engine.generate(requests(v))]
    assert separate == [reference[r] for r in requests(*vectors)]


def test_deltas_must_match_the_clusters(engine: SGLangEngine):
    with pytest.raises(ValueError, match="2 deltas for 3 clusters"):
        engine.generate([GenerationRequest("x", (0.0, 1.0))])


@pytest.mark.slow  # two server starts, each importing torch for the toy model
def test_crash_mid_evaluation_restarts_once_and_resends(tiny_model_dir, clusters, reference,
                                                        tmp_path: Path, caplog):
    caplog.set_level(logging.INFO, logger="compressor_2.engines")
    config = sglang_config(tmp_path / "run", tiny_model_dir, "--fake-generate-delay", "0.05",
                           "--fake-crash-after", "8", "--fake-crash-marker", str(tmp_path / "crashed"))
    batch = requests(ZEROS, EOS_SOONER, (0.0, 2.0, -2.0))
    done: list[int] = []
    with SGLangEngine.from_config(config, clusters) as engine:
        results = engine.generate(batch, progress=done.append)
        pid = engine.server.pid
        assert engine.restarts == 1 and engine.server_starts == 2
    assert (tmp_path / "crashed").exists(), "the fake did crash"
    assert results == [reference[r] for r in batch]
    assert sum(done) == len(batch)
    assert "SGLang server start #1" in caplog.text and "SGLang server start #2" in caplog.text
    assert "restart 1 of at most 2" in caplog.text
    assert process_gone(pid)


def test_a_server_that_keeps_dying_exhausts_the_restarts(tiny_model_dir, clusters, tmp_path: Path):
    # Every server dies on its fifth request: the four steering probes pass, work never does.
    config = sglang_config(tmp_path / "run", tiny_model_dir, "--fake-crash-after", "4",
                           sglang_max_restarts=1)
    engine = SGLangEngine.from_config(config, clusters)
    try:
        with pytest.raises(RunError, match=r"CONFIG_SGLANG_MAX_RESTARTS=1.*fake crash on request 5"):
            engine.generate(requests(ZEROS, EOS_SOONER))
        assert engine.server_starts == 2
    finally:
        engine.close()
        engine.close()  # idempotent


def test_attach_mode_spreads_requests_over_every_url(engine, clusters, reference, tiny_model_dir,
                                                     tmp_path: Path):
    launched = engine.urls[0]  # the shared engine's server, plus one more
    with SGLangServer(sglang_config(tmp_path / "server", tiny_model_dir)) as second:
        urls = (launched, second.url)
        attach = sglang_config(tmp_path / "run", tiny_model_dir, sglang_urls=urls)
        with SGLangEngine.from_config(attach, clusters) as attached:
            before = [fake_stats(url)["generate_requests"] for url in urls]
            batch = requests(ZEROS, EOS_SOONER)
            results = attached.generate(batch)
            assert attached.server_starts == 0
        after = [fake_stats(url)["generate_requests"] for url in urls]
        served = [a - b for a, b in zip(after, before)]
        assert all(n > 0 for n in served) and sum(served) == len(batch)
        assert results == [reference[r] for r in batch]
        assert second.alive() and engine.server.alive(), "closing an attached engine leaves servers up"


def test_attach_mode_retries_on_the_next_url_when_one_is_down(engine, clusters, reference):
    dead = f"http://127.0.0.1:{free_port()}"
    attached = SGLangEngine([dead, engine.urls[0]], clusters, engine.tokenize, temperature=0.0,
                            max_new_tokens=MAX_NEW, concurrency=2, request_timeout=60.0)
    batch = requests(ZEROS)
    assert attached.generate(batch) == [reference[r] for r in batch]
    attached.close()


def test_attach_to_an_unreachable_url_is_a_clear_error(tiny_model_dir, clusters, tmp_path: Path):
    dead = f"http://127.0.0.1:{free_port()}"
    config = sglang_config(tmp_path / "run", tiny_model_dir, sglang_urls=(dead,))
    with pytest.raises(RunError, match=f"CONFIG_SGLANG_URLS: cannot reach {dead}"):
        SGLangEngine.from_config(config, clusters)


def test_attach_to_another_machine_is_refused_before_any_request(tiny_model_dir, clusters, tmp_path: Path):
    # The address is never contacted: the refusal comes first.
    config = sglang_config(tmp_path / "run", tiny_model_dir, sglang_urls=("http://192.0.2.1:30000",))
    with pytest.raises(ConfigError, match="not a loopback address .*CONFIG_SGLANG_ALLOW_REMOTE=y"):
        SGLangEngine.from_config(config, clusters)


def attach(tmp_path: Path, model_dir: Path, url: str, **overrides) -> Config:
    return sglang_config(tmp_path / "run", model_dir, sglang_urls=(url,), **overrides)


def test_a_server_without_the_processor_flag_is_reported(tiny_model_dir, clusters, tmp_path: Path):
    # Attached, so nothing adds --enable-custom-logit-processor for us.
    with fake_server(tiny_model_dir, "--enable-deterministic-inference") as url:
        with pytest.raises(ConfigError, match="runs without --enable-custom-logit-processor"):
            SGLangEngine.from_config(attach(tmp_path, tiny_model_dir, url), clusters)


def test_a_cluster_map_for_another_tokenizer_is_refused(tiny_model_dir, clusters, tmp_path: Path):
    short = dataclasses.replace(clusters, token_clusters=clusters.token_clusters[:-1])
    with pytest.raises(ConfigError, match="rerun build-clusters"):
        SGLangEngine.from_config(sglang_config(tmp_path / "run", tiny_model_dir), short)


def test_prompts_go_through_the_chat_template_when_the_model_has_one(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert encode_prompt(tokenizer, "How much?") == tokenizer("How much?")["input_ids"]
    tokenizer.chat_template = ("{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}"
                               "</{{ m.role }}>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    tokenizer.bos_token = tokenizer.eos_token
    tokenizer.add_bos_token = True
    ids = encode_prompt(tokenizer, "How much?")
    assert tokenizer.decode(ids) == "<|endoftext|><user>How much?</user><assistant>"
    # The template's BOS is the only one: ids, not text, go to the server.
    assert ids.count(tokenizer.bos_token_id) == 1


def test_a_server_that_ignores_the_deltas_is_refused_before_any_work(engine, clusters, tiny_model_dir,
                                                                    tmp_path: Path):
    # The processor cannot read this map on the server, so it leaves every row unchanged.
    elsewhere = tmp_path / "elsewhere" / "token_clusters.npy"
    unreadable = dataclasses.replace(clusters, token_clusters_path=elsewhere)
    config = sglang_config(tmp_path / "run", tiny_model_dir, sglang_urls=engine.urls)
    with pytest.raises(RunError, match="ignores the steering deltas.*elsewhere/token_clusters.npy") as refused:
        SGLangEngine.from_config(config, unreadable)
    # It imports the processor (the guarded probe, with the map inside the request, passed):
    # the map's file is what it lacks, and the fix is named.
    assert "although it steers with the map sent inside the request" in str(refused.value)
    assert "CONFIG_CLUSTER_DIR copied to the same absolute path" in str(refused.value)


def test_the_launched_server_runs_deterministic_inference(engine: SGLangEngine):
    info = httpx.get(engine.urls[0] + "/server_info", timeout=10).json()
    assert info["enable_deterministic_inference"] is True


def test_an_attached_server_running_speculative_decoding_is_refused_before_any_request(
        tiny_model_dir, clusters, tmp_path: Path):
    log = tmp_path / "requests.jsonl"
    with fake_server(tiny_model_dir, *ATTACHABLE, "--speculative-algorithm", "EAGLE",
                     "--fake-request-log", str(log)) as url:
        with pytest.raises(ConfigError, match=rf"^{url} runs speculative decoding \(EAGLE\): .*unsteered"):
            SGLangEngine.from_config(attach(tmp_path, tiny_model_dir, url), clusters)
    assert logged_requests(log) == []


def test_a_server_that_steers_only_the_first_token_fails_the_probe(tiny_model_dir, clusters, tmp_path: Path):
    # It says nothing of speculative decoding; only the probe's later tokens can tell.
    with fake_server(tiny_model_dir, *ATTACHABLE, "--fake-steer-first-token-only") as url:
        with pytest.raises(RunError, match=rf"^{url} steers only the first token of an answer "
                                           rf"\(\d of {PROBE_TOKENS} probe tokens"):
            SGLangEngine.from_config(attach(tmp_path, tiny_model_dir, url), clusters)


def test_a_server_without_deterministic_inference_is_refused_unless_the_config_accepts_it(
        tiny_model_dir, clusters, tmp_path: Path, caplog):
    with fake_server(tiny_model_dir, "--enable-custom-logit-processor") as url:
        with pytest.raises(ConfigError, match=rf"^{url} runs without --enable-deterministic-inference but "
                                              r"CONFIG_SGLANG_DETERMINISTIC=y: .*answer cache"):
            SGLangEngine.from_config(attach(tmp_path, tiny_model_dir, url), clusters)
        with caplog.at_level(logging.WARNING, logger="compressor_2.engines"):
            SGLangEngine.from_config(attach(tmp_path, tiny_model_dir, url, sglang_deterministic=False),
                                     clusters).close()
    assert not [r for r in caplog.records if "deterministic" in r.getMessage()]


def test_a_servers_preferred_sampling_params_change_no_answer(tiny_model_dir, clusters, reference,
                                                             tmp_path: Path):
    # Every field a request leaves out is filled from these: longer, sampled answers.
    preferred = {"temperature": 1.5, "top_k": 5, "min_new_tokens": 20, "ignore_eos": True, "max_new_tokens": 3}
    with fake_server(tiny_model_dir, *ATTACHABLE, "--preferred-sampling-params", json.dumps(preferred)) as url:
        with SGLangEngine.from_config(attach(tmp_path, tiny_model_dir, url), clusters) as attached:
            batch = requests(ZEROS, EOS_SOONER)
            assert attached.generate(batch) == [reference[r] for r in batch]


def test_a_server_preferring_a_sampling_field_requests_leave_out_is_refused(tiny_model_dir, clusters,
                                                                           tmp_path: Path):
    preferred = json.dumps({"regex": "[0-9]+", "n": 1})  # n=1 is SGLang's own default: harmless
    with fake_server(tiny_model_dir, *ATTACHABLE, "--preferred-sampling-params", preferred) as url:
        with pytest.raises(ConfigError, match=r"--preferred-sampling-params setting regex, which"):
            SGLangEngine.from_config(attach(tmp_path, tiny_model_dir, url), clusters)


def test_a_server_of_another_model_is_refused_unless_allowed(tiny_model_dir, clusters, tmp_path: Path):
    other = shutil.copytree(tiny_model_dir, tmp_path / "other_model")
    with fake_server(other, *ATTACHABLE, "--fake-info-endpoints", "old") as url:
        config = attach(tmp_path, tiny_model_dir, url)
        with pytest.raises(ConfigError, match=re.escape(f"{url} serves '{other}' but CONFIG_MODEL_PATH="
                                                        f"'{tiny_model_dir}'")):
            SGLangEngine.from_config(config, clusters)
        with SGLangEngine.from_config(dataclasses.replace(config, sglang_allow_other_model=True), clusters) as e:
            assert len(e.generate(requests(ZEROS))) == len(PROMPTS)


def test_a_server_without_info_endpoints_is_refused(tiny_model_dir, clusters, tmp_path: Path):
    with fake_server(tiny_model_dir, *ATTACHABLE, "--fake-info-endpoints", "none") as url:
        with pytest.raises(ConfigError, match="answers neither /server_info nor /get_server_info"):
            SGLangEngine.from_config(attach(tmp_path, tiny_model_dir, url), clusters)


def test_an_example_too_long_for_the_served_context_is_refused_before_any_request(
        tiny_model_dir, clusters, tmp_path: Path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = {"fb_1": PROMPTS[0], "fb_2": "Total assets were 36,500 and liabilities 26,652. Net income?"}
    longest = len(encode_prompt(tokenizer, prompts["fb_2"]))
    # SGLang answers 400 past the context, and silently cuts max_new_tokens to
    # context - 2 - prompt: one token less of room than this is already refused.
    fits = longest + MAX_NEW + 2
    log = tmp_path / "requests.jsonl"
    with fake_server(tiny_model_dir, *ATTACHABLE, "--context-length", str(fits - 1),
                     "--fake-request-log", str(log)) as url:
        with pytest.raises(ConfigError) as raised:
            SGLangEngine.from_config(attach(tmp_path, tiny_model_dir, url), clusters, prompts=prompts)
    assert str(raised.value).startswith(f"example fb_2 (prompt ending {prompts['fb_2']!r}): a prompt of "
                                        f"{longest} tokens plus CONFIG_MAX_NEW_TOKENS={MAX_NEW} exceeds")
    assert "lower CONFIG_EVIDENCE_MAX_CHARS or CONFIG_MAX_NEW_TOKENS" in str(raised.value)
    assert logged_requests(log) == []
    with fake_server(tiny_model_dir, *ATTACHABLE, "--context-length", str(fits)) as url:
        config = attach(tmp_path, tiny_model_dir, url)
        with SGLangEngine.from_config(config, clusters, prompts=prompts) as attached:
            [answer] = attached.generate([GenerationRequest(prompts["fb_2"], EOS_NEVER)])
            assert answer.completion_tokens == MAX_NEW  # not cut short


def test_a_400_mid_run_names_the_request(engine: SGLangEngine, clusters):
    # Built directly, this engine knows no context, so the server's 400 is what it meets.
    direct = SGLangEngine(engine.urls, clusters, engine.tokenize, temperature=0.0, max_new_tokens=MAX_NEW,
                          concurrency=2, request_timeout=60.0)
    too_long = "Revenue was up. " * 200
    with pytest.raises(RunError, match=r"refused request 1 \(prompt ending '.*Revenue was up\. '\) \(HTTP 400\): "
                                       r"The input \(\d+ tokens\) is longer than the model's context length"):
        direct.generate([GenerationRequest(PROMPTS[0], ZEROS), GenerationRequest(too_long, ZEROS)])


def test_the_completions_path_gives_the_answers_of_the_generate_path(clusters, reference, tiny_model_dir,
                                                                     tmp_path: Path):
    log = tmp_path / "requests.jsonl"
    batch = requests(ZEROS, EOS_SOONER, (0.0, 2.0, -2.0))
    with fake_server(tiny_model_dir, *ATTACHABLE, "--fake-request-log", str(log)) as url:
        config = attach(tmp_path, tiny_model_dir, url, sglang_api="completions")
        with SGLangEngine.from_config(config, clusters) as completions:
            assert completions.generate(batch) == [reference[r] for r in batch]
        with SGLangEngine.from_config(dataclasses.replace(config, sglang_api="auto"), clusters) as auto:
            assert auto.api.name == "generate"  # a server, not a router
    sent = logged_requests(log, "/v1/completions")
    assert len(sent) == 4 + len(batch)  # the guarded probe, the run's probe, then every answer
    for body in sent:
        assert isinstance(body["prompt"], str) and "input_ids" not in body and "sampling_params" not in body
        assert body["custom_params"]["deltas"] and body["max_tokens"] in (MAX_NEW, PROBE_TOKENS)
        assert body["return_token_ids"] is True
    assert [body["custom_logit_processor"] == completions.processor for body in sent] == [False] * 2 + [True] * (
        2 + len(batch))
    assert len(logged_requests(log, "/generate")) == 4  # auto: the probes only


def test_a_bos_the_tokenizer_adds_is_left_out_of_the_text_and_answers_stay_equal(
        clusters, tiny_model_dir, tmp_path: Path):
    # Its chat template starts with BOS and its tokenizer adds one: the text must not hold it.
    model = chat_model(tiny_model_dir, tmp_path / "llama_like", adds_bos=True)
    batch = requests(ZEROS, EOS_SOONER)
    with fake_server(model, *ATTACHABLE) as url:
        answers = {}
        for api in ("generate", "completions"):
            config = attach(tmp_path, model, url, sglang_api=api)
            with SGLangEngine.from_config(config, clusters) as engine:
                answers[api] = engine.generate(batch)
                prompt = engine.tokenize(PROMPTS[0])
        tokenizer = AutoTokenizer.from_pretrained(model)
        assert tokenizer("x")["input_ids"][0] == tokenizer.bos_token_id  # it does add one
        assert prompt.ids.count(tokenizer.bos_token_id) == 1 and prompt.text.startswith("<user>")
        assert answers["completions"] == answers["generate"]


def test_a_server_that_tokenizes_the_text_into_other_ids_is_refused_naming_the_fix(
        clusters, tiny_model_dir, tmp_path: Path):
    # The client's tokenizer adds no BOS, the server's does: "<|endoftext|><user>..." gets two.
    ours = chat_model(tiny_model_dir, tmp_path / "ours", adds_bos=False)
    theirs = chat_model(tiny_model_dir, tmp_path / "theirs", adds_bos=True)
    log = tmp_path / "requests.jsonl"
    with fake_server(theirs, *ATTACHABLE, "--fake-request-log", str(log)) as url:
        config = attach(tmp_path, ours, url, sglang_api="completions", sglang_allow_other_model=True)
        with pytest.raises(RunError) as refused:
            SGLangEngine.from_config(config, clusters)
    message = str(refused.value)
    assert message.startswith(f"{url}/v1/completions tokenized the steering probe into ")
    assert "(first difference at position 1: server [0, " in message
    assert "a second BOS" in message and "CONFIG_SGLANG_API=generate with the workers' URLs" in message
    assert len(logged_requests(log, "/v1/completions")) == 1  # refused at the first answer


def test_a_probe_prompt_without_a_text_form_is_refused_on_completions_before_any_request(
        clusters, tiny_model_dir, tmp_path: Path):
    # A tokenizer that appends EOS to every text it tokenizes with special tokens: no text
    # turns into the templated prompt's ids, so /v1/completions cannot carry it.
    tokenizer = AutoTokenizer.from_pretrained(chat_model(tiny_model_dir, tmp_path / "eos_after", adds_bos=False))
    eos = tokenizer.eos_token
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", special_tokens=[(eos, tokenizer.eos_token_id)])
    assert chat_prompt(tokenizer, PROBE_PROMPT).text is None
    # Nothing listens there: a request would fail with a RunError, not the ConfigError.
    dead = f"http://127.0.0.1:{free_port()}"
    engine = SGLangEngine([dead], clusters, functools.partial(chat_prompt, tokenizer), temperature=0.0,
                          max_new_tokens=MAX_NEW, concurrency=1, request_timeout=5.0, api="completions")
    with pytest.raises(ConfigError, match=r"^the steering probe: no text tokenizes into this prompt's ids .*"
                                          r"CONFIG_SGLANG_API=generate"):
        engine.check_steering()


def test_a_server_preferring_a_field_completions_cannot_state_is_refused_on_that_path_only(
        clusters, tiny_model_dir, tmp_path: Path):
    preferred = json.dumps({"spaces_between_special_tokens": False})
    with fake_server(tiny_model_dir, *ATTACHABLE, "--preferred-sampling-params", preferred) as url:
        config = attach(tmp_path, tiny_model_dir, url, sglang_api="completions")
        with pytest.raises(ConfigError, match="--preferred-sampling-params setting spaces_between_special_tokens"):
            SGLangEngine.from_config(config, clusters)
        SGLangEngine.from_config(dataclasses.replace(config, sglang_api="generate"), clusters).close()

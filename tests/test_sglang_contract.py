"""The SGLang path against SGLang's own code (the release requirements-gpu.txt pins, loaded
by tests/sglang_wheel.py; these tests skip, saying why, when it cannot be fetched).

What SGLangEngine sends must pass SGLang's /generate contract gate, become the request
object and the SamplingParams the server makes of it whatever the server's preferred
sampling params, and survive the scheduler's message decoding. The processors, by
reference (SteeringProcessor) and by value (the processor_best.py generate-processor
writes), must then turn SGLang's batched logits, grouped by processor string and
filtered and merged as its scheduler does, into exactly logits + bias, "__req__" and
all, at a model vocabulary wider than the tokenizer's. The fake server's gate and context
messages are held to SGLang's here too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from compressor_2.clusters.clusterset import BUILD_RECORD_FILE, ClusterSet
from compressor_2.clusters.vocab import load_vocabulary
from compressor_2.engines.base import GenerationRequest
from compressor_2.engines.chat import chat_prompt
from compressor_2.engines.sglang.engine import SGLangEngine
from compressor_2.engines.sglang.facts import STATED_SAMPLING, UNSTATED_SAMPLING, unstated_sampling
from compressor_2.clusters.layout import UNSTEERED
from compressor_2.config import sglang as sglang_config
from compressor_2.engines.sglang import facts as sglang_facts
from compressor_2.engines.sglang.server import KNOWN_FAILURES
from compressor_2.steering.generate import render_processor
from compressor_2.steering.guarded import guarded_spec
from compressor_2.steering.phases import phase_sequence, vocabulary_classes
from compressor_2.steering.processor import SteeringProcessor, encode_cluster_map, processor_spec
from tests.fakes import sglang_server as fake
from tests.sglang_wheel import REPO, SGLang, Batch, Req, load_sglang, sglang_source

CLUSTERS = 4
MAX_NEW = 32
PROMPTS = ["Revenue was", "Total assets", "The answer is 1.9%", "net income was 5,363"]
DELTAS = [(1.0, -2.0, 0.5, 3.25), (-0.5, 0.0, 4.0, -1.0), (0.0, 0.0, 0.0, 0.0), (0.25, 0.125, -3.0, 2.0)]
BAKED = (0.5, -1.0, 2.0, -0.25)  # processor_best.py's defaults
# Set on the server, these would change every answer of a request that leaves them out.
PREFERRED = {"temperature": 0.7, "top_p": 0.5, "top_k": 7, "min_p": 0.2, "frequency_penalty": 0.5,
             "presence_penalty": 0.5, "repetition_penalty": 1.3, "min_new_tokens": 5, "ignore_eos": True,
             "stop": ["\n"], "stop_token_ids": [3], "no_stop_trim": True, "skip_special_tokens": False,
             "spaces_between_special_tokens": False, "max_new_tokens": 3, "custom_params": {"x": 1}}
# Sampling fields a request may leave to the server: they change no answer this project reads.
LEFT_TO_THE_SERVER = {
    "stream_interval": "only how often a stream reports",
    "sampling_seed": "only which draws a temperature above 0 makes; such answers are never cached",
    "choice": "not a field of the server's SamplingParams: a preferred one fails every request loudly",
}


@pytest.fixture(scope="module")
def sglang() -> Iterator[SGLang]:
    root = sglang_source()
    ours = [name for name in sys.modules if name == "sglang" or name.startswith("sglang.")]
    saved = {name: sys.modules.pop(name) for name in ours}  # an installed sglang (GPU setup) steps aside
    try:
        yield load_sglang(root)
    finally:
        for name in [n for n in sys.modules if n == "sglang" or n.startswith(("sglang.", "sglang_contract_"))]:
            del sys.modules[name]
        sys.modules.update(saved)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def clusters(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> ClusterSet:
    token_clusters = np.random.default_rng(0).integers(0, CLUSTERS, len(tokenizer)).astype(np.int64)
    token_clusters[1::9] = UNSTEERED  # special tokens: in no cluster
    folder = tmp_path_factory.mktemp("clusters")
    np.save(folder / "token_clusters.npy", token_clusters)
    (folder / BUILD_RECORD_FILE).write_text(json.dumps({"fingerprint": "contract"}))
    return ClusterSet(cluster_ids=tuple(map(str, range(CLUSTERS))), token_clusters=token_clusters,
                      token_clusters_path=(folder / "token_clusters.npy").resolve(), descriptions={},
                      build_digest="contract")


@pytest.fixture(scope="module")
def engine(tokenizer: Any, clusters: ClusterSet) -> SGLangEngine:
    """Only builds request bodies: it never connects."""
    return SGLangEngine(("http://127.0.0.1:9",), clusters, lambda prompt: chat_prompt(tokenizer, prompt),
                        temperature=0.0, max_new_tokens=MAX_NEW, concurrency=1, request_timeout=1.0)


def sent_bodies(engine: SGLangEngine) -> list[dict[str, Any]]:
    """Every kind of body the engine sends: answers, and the steering probes (the guarded one
    with its map inside), as HTTP carries them."""
    sent = [engine.request_body(GenerationRequest(p, d)) for p, d in zip(PROMPTS, DELTAS)]
    guarded = engine.probe_bodies(0, guarded_spec(), {"cluster_map": encode_cluster_map(
        engine.clusters.token_clusters)})
    return [json.loads(json.dumps(body)) for body in sent + engine.probe_bodies(0) + guarded]


@pytest.fixture(scope="module")
def bodies(engine: SGLangEngine) -> list[dict[str, Any]]:
    return sent_bodies(engine)


@pytest.fixture(scope="module")
def completion_bodies(engine: SGLangEngine) -> list[dict[str, Any]]:
    """The same requests on /v1/completions (CONFIG_SGLANG_API=completions, a router's path)."""
    completions = SGLangEngine(engine.urls, engine.clusters, engine.tokenize, temperature=0.0,
                               max_new_tokens=MAX_NEW, concurrency=1, request_timeout=1.0, api="completions")
    return sent_bodies(completions)


@pytest.fixture(scope="module")
def by_value(clusters: ClusterSet, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The request string of a processor_best.py, as `python processor_best.py` prints it."""
    folder = tmp_path_factory.mktemp("deploy")
    module = folder / "processor_best.py"
    module.write_text(render_processor(list(BAKED), clusters, folder / "deltas_best.json", "processor_best"))
    made = subprocess.run([sys.executable, module.name], capture_output=True, text=True, cwd=folder,
                          env={**os.environ, "PYTHONPATH": ""}, timeout=120)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def sampling_params(sglang: SGLang, body: dict[str, Any], preferred: dict[str, Any], width: int) -> Any:
    """What SGLang's tokenizer manager makes of `body` on a server with these preferred params."""
    request = sglang.GenerateReqInput(**body)
    request.normalize_batch_and_arguments()
    manager = SimpleNamespace(preferred_sampling_params=preferred, tokenizer=None,
                              sampling_params_class=sglang.sampling_params.SamplingParams,
                              model_config=SimpleNamespace(vocab_size=width))
    return sglang.sampling_kwargs(manager, request)["sampling_params"]


def test_every_body_passes_sglangs_generate_contract(sglang: SGLang, bodies: list[dict[str, Any]]):
    gate = sglang.api_contract.generate_contract_error
    for body in bodies:
        assert gate(body) is None, body["sampling_params"]
    # The gate is SGLang's own: a field it does not know is refused.
    wrong = {**bodies[0], "sampling_params": {**bodies[0]["sampling_params"], "max_tokens": 8}}
    assert gate(wrong).startswith("unknown field `max_tokens`")


def test_no_preferred_sampling_param_changes_what_a_body_asks(sglang: SGLang, bodies: list[dict[str, Any]],
                                                              clusters: ClusterSet):
    width = len(clusters.token_clusters) + 64
    fields = (*STATED_SAMPLING, "temperature", "max_new_tokens", "custom_params")
    decoder = msgspec.msgpack.Decoder(sglang.sampling_params.SamplingParams)
    for body in bodies:
        plain = sampling_params(sglang, body, {}, width)
        preferred = sampling_params(sglang, body, PREFERRED, width)
        assert {f: getattr(preferred, f) for f in fields} == {f: getattr(plain, f) for f in fields}
        assert plain.max_new_tokens == body["sampling_params"]["max_new_tokens"]
        assert (plain.temperature, plain.top_k) == (1.0, 1)  # SGLang's greedy
        # The tokenizer process sends it to the scheduler as msgpack, decoded by type.
        decoded = decoder.decode(msgspec.msgpack.Encoder().encode(plain))
        assert decoded.custom_params == body["sampling_params"]["custom_params"]


def test_every_sampling_field_that_changes_an_answer_is_stated_or_guarded(sglang: SGLang):
    accepted = [f.name for f in msgspec.structs.fields(sglang.api_types.SamplingParams)]
    stated = {*STATED_SAMPLING, "temperature", "max_new_tokens", "custom_params"}
    guarded = set(UNSTATED_SAMPLING)  # a server preferring one of these is refused
    assert not stated & guarded and not (stated | guarded) & set(LEFT_TO_THE_SERVER)
    assert sorted(accepted) == sorted(stated | guarded | set(LEFT_TO_THE_SERVER))


def test_the_fake_server_gates_sampling_params_as_sglang_does(sglang: SGLang):
    accepted = [f.name for f in msgspec.structs.fields(sglang.api_types.SamplingParams)]
    assert list(fake.SAMPLING_FIELDS) == accepted
    gate = sglang.api_contract.generate_contract_error
    for sampling in ({"max_tokens": 4}, {"temperature": "0.5"}, {"top_k": 1.5}, {"ignore_eos": 1},
                     {"max_new_tokens": True}, {"min_p": [1]}, {"top_p": {}}, {"temperature": None}, "x",
                     {"custom_params": {"deltas": [1.0]}, "stop": None}):
        assert fake.sampling_error(sampling) == gate({"input_ids": [1], "sampling_params": sampling}), sampling


def test_the_fake_server_refuses_past_the_context_as_sglang_does(sglang: SGLang):
    def sglang_error(prompt: int, max_new: int | None, context: int) -> str | None:
        manager = SimpleNamespace(context_len=context, num_reserved_tokens=0, allow_auto_truncate=False,
                                  validate_total_tokens=True, _validate_joint_schema_request=lambda *a: None)
        try:
            sglang.validate_one_request(manager, SimpleNamespace(sampling_params={"max_new_tokens": max_new}),
                                        list(range(prompt)))
        except ValueError as exc:
            return str(exc)
        return None

    cases = [(10, 20, 64), (10, 54, 64), (10, 55, 64), (63, 1, 64), (64, 1, 64), (80, None, 64), (5, None, 64)]
    for case in cases:
        assert fake.context_error(*case) == sglang_error(*case), case
    assert [fake.context_error(*case) is None for case in cases] == [True, True, False, True, False, False, True]


def completion_sampling(sglang: SGLang, body: dict[str, Any], preferred: dict[str, Any], width: int) -> Any:
    """What SGLang makes of a /v1/completions body: its CompletionRequest, the sampling params
    its completions handler builds, then the tokenizer manager's merge and SamplingParams."""
    request = sglang.CompletionRequest(**body)
    generate = {"text": request.prompt, "sampling_params": sglang.completion_sampling(None, request),
                "custom_logit_processor": request.custom_logit_processor}
    return sampling_params(sglang, generate, preferred, width)


def test_a_completions_body_asks_sglang_for_exactly_what_the_generate_body_asks(
        sglang: SGLang, bodies: list[dict[str, Any]], completion_bodies: list[dict[str, Any]],
        clusters: ClusterSet, tokenizer: Any):
    width = len(clusters.token_clusters) + 64
    fields = [f.name for f in msgspec.structs.fields(sglang.sampling_params.SamplingParams)]
    # Every preferred field but the ones the completions path cannot state (those are refused).
    preferred = {name: value for name, value in PREFERRED.items() if name not in unstated_sampling("completions")}
    for generate, completions in zip(bodies, completion_bodies, strict=True):
        request = sglang.CompletionRequest(**completions)
        assert request.custom_logit_processor == generate["custom_logit_processor"]
        assert request.return_token_ids is True and ":" not in request.model  # no LoRA adapter by name
        # The text prompt is tokenized (special tokens added, as the tokenizer manager does) into the ids.
        assert tokenizer(request.prompt)["input_ids"] == generate["input_ids"]
        for server in ({}, preferred):
            ours = completion_sampling(sglang, completions, server, width)
            native = sampling_params(sglang, generate, server, width)
            assert {f: getattr(ours, f) for f in fields} == {f: getattr(native, f) for f in fields}
    # A server preferring a field /v1/completions cannot state would change the answers there.
    changed = completion_sampling(sglang, completion_bodies[0], {"spaces_between_special_tokens": False}, width)
    assert changed.spaces_between_special_tokens is False
    assert "spaces_between_special_tokens" in unstated_sampling("completions")


def test_every_sampling_field_is_stated_or_guarded_on_the_completions_path(
        sglang: SGLang, completion_bodies: list[dict[str, Any]]):
    accepted = {f.name for f in msgspec.structs.fields(sglang.api_types.SamplingParams)}
    stated = set(sglang.completion_sampling(None, sglang.CompletionRequest(**completion_bodies[0])))
    guarded = set(unstated_sampling("completions"))
    assert accepted <= stated | guarded | set(LEFT_TO_THE_SERVER)
    assert "spaces_between_special_tokens" not in stated


def test_the_fake_server_builds_completions_sampling_params_as_sglang_does(
        sglang: SGLang, completion_bodies: list[dict[str, Any]]):
    others = [{"model": "m", "prompt": "x"}, {"prompt": [1, 2], "max_tokens": 3, "seed": 7, "min_tokens": 2,
                                               "top_k": 5, "stop": ["\n"], "logit_bias": {"5": 1.0}}]
    for body in [*completion_bodies, *others]:
        built = {name: body.get(field, default) for field, (name, default) in fake.COMPLETION_SAMPLING.items()}
        assert built == sglang.completion_sampling(None, sglang.CompletionRequest(**body)), body


def expected_logits(logits: torch.Tensor, steering: list[tuple[float, ...] | None],
                    token_clusters: np.ndarray) -> torch.Tensor:
    """Each row plus its deltas' bias on the tokenizer's ids (none on an unsteered one),
    computed here, not by bias.py."""
    expected = logits.clone()
    for row, deltas in enumerate(steering):
        if deltas is not None:
            for token, cluster in enumerate(token_clusters.tolist()):
                if cluster != UNSTEERED:
                    expected[row, token] += deltas[cluster]
    return expected


def test_sglangs_batching_of_both_processors_gives_logits_plus_bias(
        sglang: SGLang, engine: SGLangEngine, clusters: ClusterSet, by_value: str, tokenizer: Any):
    width = len(tokenizer) + 64  # the model's vocabulary, wider than the tokenizer's
    assert len(clusters.token_clusters) == len(tokenizer)

    def value_body(custom: dict[str, Any] | None) -> dict[str, Any]:
        """What a user sends to serve processor_best.py by value (see the README's Deploy)."""
        sampling: dict[str, Any] = {**STATED_SAMPLING, "temperature": 0.0, "max_new_tokens": MAX_NEW}
        if custom is not None:
            sampling["custom_params"] = custom
        return {"input_ids": [5, 6, 7], "custom_logit_processor": by_value, "sampling_params": sampling}

    def reqs(rows: list[tuple[dict[str, Any], Any]], first: int) -> list[Req]:
        made = []
        for i, (body, _) in enumerate(rows):
            body = json.loads(json.dumps(body))
            assert sglang.api_contract.generate_contract_error(body) is None
            params = sampling_params(sglang, body, {}, width)
            made.append(Req(sglang, f"r{first + i}", params, body.get("custom_logit_processor"), body["input_ids"]))
        return made

    def ours(deltas: tuple[float, ...]) -> tuple[dict[str, Any], tuple[float, ...] | None]:
        return engine.request_body(GenerationRequest(PROMPTS[0], deltas)), deltas if any(deltas) else None

    unsteered = {"input_ids": [1, 2], "sampling_params": {"temperature": 0.0, "max_new_tokens": 4}}
    custom = (2.0, -0.5, 0.0, 1.5)
    rows = [ours(DELTAS[0]), (unsteered, None), (value_body(None), BAKED), ours(DELTAS[1]),
            (value_body({"deltas": list(custom)}), custom), ours(DELTAS[2]), ours(DELTAS[0])]
    requests = reqs(rows, 0)
    steering = [deltas for _, deltas in rows]
    info = sglang.sampling_batch_info.SamplingBatchInfo.from_schedule_batch(Batch(requests), vocab_size=width)

    groups = {tuple(entry.rows): type(entry.processor) for entry in info.custom_logit_processor.values()}
    assert sorted(groups) == [(0, 3, 5, 6), (2, 4)]  # one entry per processor string
    assert groups[0, 3, 5, 6] is SteeringProcessor  # by reference: this very class
    assert groups[2, 4].__module__ == "__main__" and groups[2, 4].__name__ == "SteeringProcessor"  # by value
    assert info.custom_params[1] is None and info.custom_params[2] is None
    assert info.custom_params[0]["__req__"].rid == "r0"  # SGLang's Req, by weak reference

    generator = torch.Generator().manual_seed(0)

    def step_is_exact() -> None:
        logits = torch.randn(len(steering), width, generator=generator)
        expected = expected_logits(logits, steering, clusters.token_clusters)
        sglang.apply_custom_logit_processor(logits, info)
        assert torch.equal(logits, expected)
        assert torch.equal(logits[:, len(tokenizer):], expected[:, len(tokenizer):])

    for _ in range(3):  # a new processor instance per batch; the caches live on the classes
        step_is_exact()

    keep = [0, 2, 4, 6]  # rows 1, 3 and 5 finished
    info.filter_batch(keep, torch.tensor(keep))
    steering = [steering[i] for i in keep]
    step_is_exact()

    joining = [(value_body({"deltas": [0.0, 0.0, 0.0, -7.0]}), (0.0, 0.0, 0.0, -7.0)), ours(DELTAS[3]),
               (unsteered, None)]
    info.merge_batch(sglang.sampling_batch_info.SamplingBatchInfo.from_schedule_batch(
        Batch(reqs(joining, 10)), vocab_size=width))
    steering += [deltas for _, deltas in joining]
    assert sorted(entry.rows for entry in info.custom_logit_processor.values()) == [[0, 3, 5], [1, 2, 4]]
    step_is_exact()


# -- deltas by answer phase: the answer so far, read from SGLang's Req -------------------------------

PHASES = 3


def test_both_processors_read_the_answer_where_sglang_puts_it_and_steer_by_its_phase(
        sglang: SGLang, engine: SGLangEngine, clusters: ClusterSet, tokenizer: Any, tiny_model_dir: Path,
        tmp_path_factory: pytest.TempPathFactory):
    """Phased rows of the run's processor and of a phased processor_best.py, beside one-phase and
    unsteered rows, batched, filtered and merged by SGLang's own code: each processor finds the
    request's `Req` under "__req__" (SGLang's weak proxy), reads its output_ids as they grow, and
    every step is logits + the bias of the phase `phase_sequence` gives."""
    width = len(tokenizer) + 64
    classes = vocabulary_classes(load_vocabulary(str(tiny_model_dir)))
    phased = SGLangEngine(engine.urls, clusters, engine.tokenize, temperature=0.0, max_new_tokens=MAX_NEW,
                          concurrency=1, request_timeout=1.0, phases=PHASES, token_classes=encode_cluster_map(classes))
    baked = tuple(np.random.default_rng(3).normal(0, 2, PHASES * CLUSTERS).round(3).tolist())
    folder = tmp_path_factory.mktemp("phased_deploy")
    (folder / "processor_best.py").write_text(
        render_processor(list(baked), clusters, folder / "deltas_best.json", "processor_best", classes))
    made = subprocess.run([sys.executable, "processor_best.py"], capture_output=True, text=True, cwd=folder,
                          env={**os.environ, "PYTHONPATH": ""}, timeout=120)
    assert made.returncode == 0, made.stderr

    def value_body(custom: dict[str, Any] | None) -> dict[str, Any]:
        sampling: dict[str, Any] = {**STATED_SAMPLING, "temperature": 0.0, "max_new_tokens": MAX_NEW}
        if custom is not None:
            sampling["custom_params"] = custom
        return {"input_ids": [5, 6, 7], "custom_logit_processor": made.stdout.strip(), "sampling_params": sampling}

    for probe in phased.probe_bodies(2):  # the steering probe moves its cluster in every phase
        assert sglang.api_contract.generate_contract_error(json.loads(json.dumps(probe))) is None
        sent = probe["sampling_params"]["custom_params"]
        assert sent["phases"] == PHASES and [i for i, d in enumerate(sent["deltas"]) if d] == [2, 6, 10]
    rng = np.random.default_rng(4)
    mine = [tuple(rng.normal(0, 2, PHASES * CLUSTERS).round(3).tolist()) for _ in range(3)]
    # (body, deltas, phases): phases 0 is a row left unsteered (no custom_params: SGLang gives it no Req).
    rows = [(phased.request_body(GenerationRequest(PROMPTS[0], mine[0])), mine[0], PHASES),
            (value_body({}), baked, PHASES), (engine.request_body(GenerationRequest(PROMPTS[1], DELTAS[0])),
                                               DELTAS[0], 1),
            (phased.request_body(GenerationRequest(PROMPTS[2], mine[1])), mine[1], PHASES),
            (value_body(None), None, 0)]

    def reqs(rows: list, first: int) -> list[Req]:
        made = []
        for i, (body, _, _) in enumerate(rows):
            body = json.loads(json.dumps(body))
            assert sglang.api_contract.generate_contract_error(body) is None
            params = sampling_params(sglang, body, {}, width)
            made.append(Req(sglang, f"r{first + i}", params, body["custom_logit_processor"], body["input_ids"]))
        return made

    requests = reqs(rows, 0)
    info = sglang.sampling_batch_info.SamplingBatchInfo.from_schedule_batch(Batch(requests), vocab_size=width)
    for row, req in enumerate(requests[:4]):
        assert info.custom_params[row]["__req__"].output_ids is req.output_ids  # the Req itself, by weak proxy
    seen: set[int] = set()

    def step_is_exact() -> None:
        steering = []
        for req, (_, deltas, phases) in zip(requests, rows):
            phase = phase_sequence([*req.output_ids, 0], classes.tolist(), max(phases, 1))[-1]
            seen.update([phase] if phases == PHASES else [])
            steering.append(None if deltas is None or not any(deltas)
                            else deltas[phase * CLUSTERS:(phase + 1) * CLUSTERS])
        logits = torch.randn(len(requests), width, generator=generator)
        expected = expected_logits(logits, steering, clusters.token_clusters)
        sglang.apply_custom_logit_processor(logits, info)
        assert torch.equal(logits, expected)
        for req in requests:  # the token each row's step chose, appended before the next step
            req.output_ids.append(int(rng.choice(by_class[rng.choice(4, p=[.4, .3, .15, .15])])))

    generator = torch.Generator().manual_seed(5)
    by_class = [np.flatnonzero(classes == c) for c in range(4)]
    by_class[0] = np.append(by_class[0], width - 1)  # a model's padding column, past the tokenizer's ids
    for _ in range(12):
        step_is_exact()
    keep = [0, 1, 3]  # rows 2 and 4 finished
    info.filter_batch(keep, torch.tensor(keep))
    requests, rows = [requests[i] for i in keep], [rows[i] for i in keep]
    for _ in range(6):
        step_is_exact()
    joining = [(phased.request_body(GenerationRequest(PROMPTS[3], mine[2])), mine[2], PHASES), (value_body({}), baked,
                                                                                                 PHASES)]
    joined = reqs(joining, 10)
    info.merge_batch(sglang.sampling_batch_info.SamplingBatchInfo.from_schedule_batch(Batch(joined), vocab_size=width))
    requests, rows = requests + joined, rows + joining
    for _ in range(6):
        step_is_exact()
    assert seen == {0, 1, 2}, "every phase must steer some step"


def test_sglang_appends_a_step_s_token_before_the_next_step_samples_only_without_overlap_or_with_delay():
    """Why a server for phased rows runs with SGLANG_ENABLE_DELAY_SAMPLE=1 (or
    --disable-overlap-schedule): with the overlap scheduler, a batch is sampled (and the
    processor called) before the last batch's result is appended to output_ids, unless the
    sample is delayed, which SGLang does for grammars and under that variable."""
    scheduler = _sglang_file("managers", "scheduler.py")
    loop = scheduler[scheduler.index("def event_loop_overlap"):scheduler.index("def is_disable_overlap_for_batch")]
    assert loop.index("batch_result = self.run_batch(batch)") < loop.index("pop_and_process()\n            elif")
    assert loop.index("pop_and_process()\n            elif") < loop.index("self.launch_batch_sample_if_needed(")
    worker = _sglang_file("managers", "tp_worker.py")
    assert "envs.SGLANG_ENABLE_DELAY_SAMPLE.get()" in worker and "batch_result.delay_sample_func = " in worker
    assert "SGLANG_ENABLE_DELAY_SAMPLE = EnvBool(False)" in _sglang_file("environ.py")


# -- a server that cannot import compressor_2, and deterministic inference ------------------------

LOAD_AND_CALL = """
import json, sys, importlib.util, torch
sys.path.insert(0, {repo!r})
from tests.fakes.sglang_server import hide_package
if {hidden!r}:
    hide_package("compressor_2")
spec = importlib.util.spec_from_file_location("sglang_custom_logit_processor", {module!r})
sglang = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sglang)
results = {{}}
for name, string in {strings!r}.items():
    try:
        processor = sglang.CustomLogitProcessor.from_str(string)
        results[name] = processor(torch.zeros(1, {width}), [{params!r}]).tolist()
    except Exception as exc:
        results[name] = type(exc).__name__
print(json.dumps(results))
"""


def _load_in_sglang(strings: dict[str, str], params: dict[str, Any], width: int, hidden: bool,
                    cwd: Path) -> dict[str, Any]:
    """SGLang's own CustomLogitProcessor.from_str on `strings`, in a fresh Python where
    compressor_2 is `hidden` or not, each processor called on a row of zeros."""
    module = sglang_source() / "sglang" / "srt" / "sampling" / "custom_logit_processor.py"
    script = LOAD_AND_CALL.format(repo=str(REPO), hidden=hidden, module=str(module), strings=strings,
                                  width=width, params=params)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_guarded_string_loads_in_sglang_to_the_processor_or_to_nothing_and_never_fails(
        clusters: ClusterSet, tmp_path: Path):
    deltas = [1.0, -2.0, 0.5, 3.25]
    params = {"deltas": deltas, "cluster_map": encode_cluster_map(clusters.token_clusters)}
    width = len(clusters.token_clusters) + 64
    strings = {"guarded": guarded_spec(), "run": processor_spec()}
    steered = expected_logits(torch.zeros(1, width), [tuple(deltas)], clusters.token_clusters).tolist()
    # Where compressor_2 imports, both load to its processor and steer.
    assert _load_in_sglang(strings, params, width, hidden=False, cwd=tmp_path) == {"guarded": steered,
                                                                                  "run": steered}
    # Where it does not, the run's string raises inside SGLang's scheduler (which then kills the
    # server: the fake dies so too); the guarded one loads to a processor that changes nothing.
    assert _load_in_sglang(strings, params, width, hidden=True, cwd=tmp_path) == {
        "guarded": [[0.0] * width], "run": "ModuleNotFoundError"}


def _sglang_file(*parts: str) -> str:
    return (sglang_source() / "sglang" / "srt").joinpath(*parts).read_text()


def test_the_deterministic_attention_rules_are_sglangs():
    import importlib.util

    spec = importlib.util.spec_from_file_location("sglang_choices", sglang_source() / "sglang" / "srt" /
                                                  "arg_groups" / "choices.py")
    choices = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(choices)  # plain lists, no imports
    backends = tuple(choices.DETERMINISTIC_ATTENTION_BACKEND_CHOICES)
    radix = tuple(choices.RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND)
    assert sglang_config.DETERMINISTIC_BACKENDS == fake.DETERMINISTIC_BACKENDS == backends
    assert sglang_facts.RADIX_DETERMINISTIC_BACKENDS == fake.RADIX_DETERMINISTIC_BACKENDS == radix
    assert sglang_config.PORTABLE_BACKEND in radix  # triton keeps the radix cache
    # The fallback when no backend is given: flashinfer on SM100 and SM120, fa3 elsewhere.
    overrides = _sglang_file("arg_groups", "overrides.py")
    assert "if get_platform().is_sm100 or get_platform().is_sm120:" in overrides
    assert 'backend = "flashinfer"' in overrides and 'backend = "fa3"' in overrides
    common = _sglang_file("utils", "common.py")
    assert "device_capability_majors=[10], cuda_version=(12, 8)" in common  # is_sm100
    assert "device_capability_majors=[12], cuda_version=(12, 8)" in common  # is_sm120
    assert sglang_config.FLASHINFER_FALLBACK_MAJORS == fake.FLASHINFER_FALLBACK_MAJORS == (10, 12)
    # fa3 asserts outside SM80-SM90, in these words, which the launcher's hint looks for.
    registry = _sglang_file("layers", "attention", "attention_registry.py")
    assert "(major == 8 and not runner.use_mla_backend) or major == 9" in registry
    assert sglang_config.FA3_MAJORS == (8, 9)
    assert fake.FA3_ASSERTION.split(". ")[0] in registry
    assert any(pattern in fake.FA3_ASSERTION for pattern, _ in KNOWN_FAILURES)
    # Deterministic inference on a backend outside the radix list turns the radix cache off.
    hook = _sglang_file("arg_groups", "attention_hook.py")
    assert "if attention_backend not in RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND:" in hook
    assert "disable_radix_cache=True" in hook

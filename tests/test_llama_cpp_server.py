"""The logit_bias engine against a real llama.cpp server (llama-cpp-python's, as `make
llama-server` builds it; every test here skips, saying so in one line, without the build).

- SmolLM2-135M-Instruct's Q4_1 GGUF served by llama.cpp (its quantised arithmetic) and the
  same file through the transformers engine (dequantised to float32) answer the same demo
  questions, unsteered and with one delta vector: how often the greedy answers are the
  same, where they part, and how far tokens and correctness are apart, within the bounds
  below (docs/engines.md gives the measured figures).
- The map `export --format logit-bias` writes is the one the server applies: sent in a
  plain request, it gives the engine's answer.
- `evaluate`, and an `evolve` stopped by Ctrl+C and resumed, run against the server (a tiny
  GGUF, so the run takes seconds) and end as the uninterrupted run does.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from compressor_2.archive import ARCHIVE_FILE, RunArchive
from compressor_2.cli import main
from compressor_2.clusters.clusterset import ClusterSet
from compressor_2.clusters.special import eos_token_ids, number_token_ids, unsteered_token_ids
from compressor_2.common.errors import RunError
from compressor_2.data import load_examples
from compressor_2.engines.base import Generation, GenerationRequest
from compressor_2.engines.logit_bias.engine import LogitBiasEngine
from compressor_2.engines.transformers.engine import TransformersEngine
from compressor_2.judges.base import JudgeItem
from compressor_2.judges.numeric import NumericJudge
from compressor_2.model import load_tokenizer
from compressor_2.steering.logit_bias import bias_json, logit_bias
from tests.conftest import REPO
from tests.gguf_helpers import write_tiny_gguf
from tests.llama_cpp_helpers import llama_python, llama_server, smollm2_gguf
from tests.logit_bias_helpers import interrupted_evolve, logit_bias_config
from tests.test_evolution_support import write_config

pytestmark = pytest.mark.slow

QUESTIONS = "0-15"  # of the demo's training questions
MAX_NEW = 64  # the SmolLM2 preset's CONFIG_MAX_NEW_TOKENS
ZEROS = (0.0, 0.0, 0.0)
# End tokens up, figures up, every other token a little down: a map of every steered token.
STEERED = (3.0, 1.0, -0.25)
# Bounds on how far the two arithmetics' answers may be apart (of 16 questions a vector).
MIN_SAME = 8  # answers identical token for token
MAX_TOKENS_APART = 0.15  # mean completion tokens, relative
MAX_CORRECT_APART = 2  # questions judged correct


@pytest.fixture(scope="module")
def smollm2() -> Path:
    llama_python()
    return smollm2_gguf()


@pytest.fixture(scope="module")
def clusters(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> ClusterSet:
    """Three clusters over SmolLM2's tokenizer by the build's own rules, without k-means: 0
    the end tokens, 1 the figures, 2 every other token; special tokens unsteered."""
    tokenizer = load_tokenizer(str(smollm2))
    ends = eos_token_ids(tokenizer, None, tokenizer.get_vocab())
    unsteered = unsteered_token_ids(tokenizer, ends)
    numbers = number_token_ids([tokenizer.decode([i]) for i in range(len(tokenizer))], ends | unsteered)
    token_clusters = np.full(len(tokenizer), 2, dtype=np.int64)
    token_clusters[sorted(numbers)] = 1
    token_clusters[sorted(ends)] = 0
    token_clusters[sorted(unsteered)] = -1
    path = tmp_path_factory.mktemp("smollm2_clusters") / "token_clusters.npy"
    np.save(path, token_clusters)
    return ClusterSet(("0", "1", "2"), token_clusters, path, {c: {"description": c} for c in "012"}, "three")


@pytest.fixture(scope="module")
def server_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("llama") / "server.log"


@pytest.fixture(scope="module")
def served(smollm2: Path, server_log: Path):
    with llama_server(smollm2, server_log) as url:
        yield url


def answered(log: Path) -> int:
    """Completion requests the server has answered: the lines of its access log."""
    return log.read_text().count('"POST /v1/completions HTTP/1.1" 200')


@pytest.fixture(scope="module")
def questions():
    return load_examples(REPO / "compressor_2" / "demo" / "data" / "train.jsonl", QUESTIONS)


@pytest.fixture(scope="module")
def answers(smollm2, clusters, served, questions, tmp_path_factory) -> dict[str, list[list[Generation]]]:
    """Each engine's answers to every question, unsteered and steered."""
    requests = [[GenerationRequest(q.prompt, vector) for q in questions] for vector in (ZEROS, STEERED)]
    config = logit_bias_config(tmp_path_factory.mktemp("run"), smollm2, served, max_new_tokens=MAX_NEW,
                               eval_concurrency=2)
    served_engine = LogitBiasEngine.from_config(config, clusters)
    local = TransformersEngine(str(smollm2), clusters.token_clusters, 3, batch_size=32, max_new_tokens=MAX_NEW,
                               device="cpu", threads=1)
    try:
        return {"llama.cpp": [served_engine.generate(r) for r in requests],
                "transformers": [local.generate(r) for r in requests]}
    finally:
        local.close()


def parting(tokenizer, a: str, b: str) -> int | None:
    """The token position where two answers part; None when they are the same."""
    if a == b:
        return None
    x, y = tokenizer(a, add_special_tokens=False)["input_ids"], tokenizer(b, add_special_tokens=False)["input_ids"]
    return next((i for i, (s, t) in enumerate(zip(x, y)) if s != t), min(len(x), len(y)))


def test_llama_cpp_and_the_transformers_engine_agree_within_the_bounds(answers, questions, smollm2):
    tokenizer = load_tokenizer(str(smollm2))
    judge = NumericJudge()
    for k, name in enumerate(("unsteered", "steered")):
        served, local = answers["llama.cpp"][k], answers["transformers"][k]
        same = sum(a.text == b.text for a, b in zip(served, local))
        parts = [p for a, b in zip(served, local) if (p := parting(tokenizer, a.text, b.text)) is not None]
        tokens = [float(np.mean([g.completion_tokens for g in side])) for side in (served, local)]
        correct = [sum(v.is_correct for v in judge.judge([JudgeItem(q.question, g.text, q.gold)
                                                          for q, g in zip(questions, side)])) for side in (served, local)]
        print(f"{name}: {same}/{len(questions)} identical; parted at tokens {sorted(parts)}; mean tokens "
              f"llama.cpp {tokens[0]:.1f}, transformers {tokens[1]:.1f}; correct {correct[0]} and {correct[1]}")
        # Where answers are the same text, they are the same tokens: both count the end token.
        assert all(a.completion_tokens == b.completion_tokens for a, b in zip(served, local) if a.text == b.text)
        assert same >= MIN_SAME
        assert abs(tokens[0] - tokens[1]) <= MAX_TOKENS_APART * tokens[1]
        assert abs(correct[0] - correct[1]) <= MAX_CORRECT_APART
    # The vector steers on both: its answers are shorter than the unsteered ones on each side.
    for side in answers.values():
        assert sum(g.completion_tokens for g in side[1]) < sum(g.completion_tokens for g in side[0])


def test_the_exported_map_in_a_plain_request_gives_the_engines_answer(answers, clusters, served, questions, smollm2):
    tokenizer = load_tokenizer(str(smollm2))
    text = tokenizer.apply_chat_template([{"role": "user", "content": questions[0].prompt}],
                                         add_generation_prompt=True, tokenize=False)
    body = {"prompt": text, "max_tokens": MAX_NEW, "temperature": 0, "repeat_penalty": 1.0,
            "logit_bias": json.loads(bias_json(logit_bias(STEERED, clusters.token_clusters)))}
    reply = httpx.post(served + "/v1/completions", json=body, timeout=600).json()
    assert reply["choices"][0]["text"] == answers["llama.cpp"][1][0].text


def test_evaluate_and_an_evolve_stopped_by_ctrl_c_then_resumed(smollm2, served, server_log, tmp_path, capsys):
    """The three test questions, 16 new tokens, two genomes a generation: the run's own clusters built
    for SmolLM2 (about two minutes of CPU, most of it embedding its vocabulary)."""
    settings = dict(ENGINE_LOGIT_BIAS="y", LOGIT_BIAS_URL=f'"{served}"', TRANSFORMERS_DEVICE=None,
                    MAX_NEW_TOKENS="16", FINANCEBENCH_POOL_INDICES='"all"', POPULATION_SIZE="2", NGEN="1",
                    EVAL_CONCURRENCY="2", NUM_CLUSTERS="4")
    configs = {}
    for leg in ("whole", "resumed"):
        (tmp_path / leg).mkdir()
        configs[leg] = write_config(tmp_path / leg, tmp_path, smollm2, **settings)
    assert main(["build-clusters", "--config", str(configs["whole"])]) == 0, capsys.readouterr().err
    assert main(["evaluate", "--config", str(configs["whole"])]) == 0, capsys.readouterr().err
    assert main(["evolve", "--config", str(configs["whole"])]) == 0, capsys.readouterr().err
    before = answered(server_log)
    # Past the probe's three requests, into the first generation's answers.
    err = interrupted_evolve(configs["resumed"], lambda: answered(server_log) >= before + 5)
    assert "Traceback" not in err
    assert main(["evolve", "--config", str(configs["resumed"])]) == 0, capsys.readouterr().err
    outputs = [tmp_path / leg / "out" for leg in ("whole", "resumed")]
    assert (outputs[1] / "deltas_best.json").read_text() == (outputs[0] / "deltas_best.json").read_text()
    archives = [RunArchive.open_read_only(out / ARCHIVE_FILE) for out in outputs]
    try:
        whole, resumed = ([(dict(c.deltas), c.mean_tokens, c.correctness) for c in a.candidates()] for a in archives)
        assert resumed == whole and len(whole) >= 3
    finally:
        for archive in archives:
            archive.close()


def test_a_gguf_whose_tokenizer_llama_cpp_reads_otherwise_is_refused_naming_the_server(tmp_path):
    """The tiny test GGUF's BPE, trained on a few sentences, splits figures otherwise in
    llama.cpp than in transformers' conversion: every prompt is another prompt there."""
    gguf = write_tiny_gguf(tmp_path / "tiny-llama.Q8_0.gguf")
    tokenizer = load_tokenizer(str(gguf))
    token_clusters = np.where(np.arange(len(tokenizer)) == tokenizer.eos_token_id, 0, 1 + np.arange(len(tokenizer)) % 2)
    clusters = ClusterSet(("0", "1", "2"), token_clusters, tmp_path / "unused.npy", {}, "tiny")
    with llama_server(gguf, tmp_path / "server.log") as url:
        engine = LogitBiasEngine.from_config(logit_bias_config(tmp_path, gguf, url, max_new_tokens=8), clusters)
        with pytest.raises(RunError, match=rf"^{url} read request 0 \(prompt ending .*\) as \d+ prompt tokens, where "
                                           r"CONFIG_MODEL_PATH's tokenizer makes \d+: it serves another model or "
                                           "tokenizer"):
            engine.generate([GenerationRequest("Revenue was $1,577 million in FY2018. What was revenue?", (0.0,) * 3)])

"""The in-process engine on a tiny random GPT-2 loaded through `from_pretrained`."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, MistralConfig, MistralForCausalLM

from compressor_2.clusters.vocab import load_vocabulary
from compressor_2.common.errors import ConfigError
from compressor_2.engines.base import GenerationRequest
from compressor_2.engines.transformers.decode import MIN_ROWS
from compressor_2.engines.transformers.prompt_cache import CACHE_ARG, PromptCache, kv_bytes
from compressor_2.engines.transformers.engine import TransformersEngine
from compressor_2.steering.hf_processor import DeltaBiasProcessor
from compressor_2.steering.phases import OTHER, phase_sequence, vocabulary_classes

PROMPTS = [
    "Revenue was",
    "Yes. The company operating margin exceeded 20% in 2019 and",
    "No",
    "Total assets",
    "The answer is 1.9%",
    "net income was 5,363",
]
MAX_NEW = 40


@pytest.fixture(scope="module")
def eos_prone_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its (tied) EOS embedding scaled up, so that unsteered greedy
    decoding stops early on some prompts and runs to the limit on others: both
    directions of the EOS delta then have room to show."""
    directory = tmp_path_factory.mktemp("eos_prone")
    shutil.copytree(tiny_model_dir, directory, dirs_exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    eos = AutoTokenizer.from_pretrained(tiny_model_dir).eos_token_id
    with torch.no_grad():
        model.transformer.wte.weight[eos] *= 8
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def token_clusters(tiny_model_dir: Path) -> np.ndarray:
    """Cluster 0: EOS only; clusters 1 and 2: the even and odd ids of everything else."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    clusters = np.arange(len(tokenizer), dtype=np.int64) % 2 + 1
    clusters[tokenizer.eos_token_id] = 0
    return clusters


def make_engine(model_dir: Path, token_clusters: np.ndarray, batch_size: int = 8) -> TransformersEngine:
    return TransformersEngine(str(model_dir), token_clusters, 3, batch_size=batch_size,
                              max_new_tokens=MAX_NEW, device="cpu")


def requests(deltas: tuple[float, ...], prompts: list[str] = PROMPTS) -> list[GenerationRequest]:
    return [GenerationRequest(p, deltas) for p in prompts]


def test_eos_delta_shortens_when_positive_and_lengthens_when_negative(eos_prone_model_dir, token_clusters):
    engine = make_engine(eos_prone_model_dir, token_clusters)
    baseline = [g.completion_tokens for g in engine.generate(requests((0.0, 0.0, 0.0)))]
    boosted = engine.generate(requests((30.0, 0.0, 0.0)))
    suppressed = [g.completion_tokens for g in engine.generate(requests((-30.0, 0.0, 0.0)))]

    assert 1 < np.mean(baseline) < MAX_NEW, "the fixture must leave room in both directions"
    # EOS first: one token, counted like SGLang's completion_tokens, and no text.
    assert [(g.completion_tokens, g.text) for g in boosted] == [(1, "")] * len(PROMPTS)
    assert suppressed == [MAX_NEW] * len(PROMPTS)
    assert all(b <= s for b, s in zip(baseline, suppressed))


def test_per_row_deltas_in_one_batch_match_one_call_per_vector(eos_prone_model_dir, token_clusters):
    vectors = [(0.0, 0.0, 0.0), (2.0, 0.0, 0.0), (0.0, 3.0, -3.0), (-30.0, 0.0, 1.5)]
    engine = make_engine(eos_prone_model_dir, token_clusters, batch_size=len(vectors) * len(PROMPTS))
    mixed = [GenerationRequest(p, v) for v in vectors for p in PROMPTS]
    together = engine.generate(mixed)
    separate = [g for v in vectors for g in engine.generate(requests(v))]

    assert together == separate
    per_vector = [tuple(together[i * len(PROMPTS):(i + 1) * len(PROMPTS)]) for i in range(len(vectors))]
    assert len(set(per_vector)) == len(vectors), "each vector must steer its own rows differently"


def test_left_padded_batch_matches_each_prompt_alone(tiny_model_dir, token_clusters):
    batched = make_engine(tiny_model_dir, token_clusters, batch_size=len(PROMPTS))
    alone = make_engine(tiny_model_dir, token_clusters, batch_size=1)
    deltas = (0.0, 1.0, -1.0)
    assert len({len(batched.encode(p)) for p in PROMPTS}) > 2, "prompts must need padding"

    assert batched.generate(requests(deltas)) == alone.generate(requests(deltas))
    # And an unpadded direct greedy call agrees on the longest and shortest prompt.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    for prompt in (PROMPTS[1], PROMPTS[2]):
        ids = torch.tensor([batched.encode(prompt)])
        direct = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=MAX_NEW, pad_token_id=1,
                                logits_processor=[DeltaBiasProcessor(torch.tensor([deltas]),
                                                                     torch.as_tensor(token_clusters))])
        expected = batched.tokenizer.decode(direct[0, ids.shape[1]:], skip_special_tokens=True)
        assert batched.generate([GenerationRequest(prompt, deltas)])[0].text == expected


def test_answers_return_in_request_order_with_progress(tiny_model_dir, token_clusters):
    engine = make_engine(tiny_model_dir, token_clusters, batch_size=4)
    reordered = list(reversed(PROMPTS))
    seen: list[int] = []
    out = engine.generate(requests((0.0, 0.0, 0.0), reordered), progress=seen.append)
    by_prompt = dict(zip(PROMPTS, engine.generate(requests((0.0, 0.0, 0.0)))))

    assert out == [by_prompt[p] for p in reordered]
    assert seen == [4, 2]


def test_processor_adds_exactly_the_bias_of_each_row():
    generator = torch.Generator().manual_seed(0)
    vocab, width = 50, 57  # logits wider than the vocabulary, as in many models
    clusters = torch.randint(0, 4, (vocab,), generator=generator)
    deltas = torch.randn(3, 4, generator=generator)
    processor = DeltaBiasProcessor(deltas, clusters)
    for _ in range(2):  # the second step reuses the bias built at the first
        scores = torch.randn(3, width, generator=generator)
        out = processor(torch.zeros(3, 1, dtype=torch.long), scores.clone())
        expected = scores.clone()
        for row in range(3):
            for token in range(vocab):
                expected[row, token] += deltas[row, clusters[token]]
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="2 score rows for 3 delta rows"):
        processor(torch.zeros(2, 1, dtype=torch.long), torch.zeros(2, width))


def test_chat_template_wraps_the_prompt(tiny_model_dir, token_clusters, tmp_path):
    shutil.copytree(tiny_model_dir, tmp_path, dirs_exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    tokenizer.chat_template = ("{% for m in messages %}[user]{{ m['content'] }}{% endfor %}"
                               "{% if add_generation_prompt %}[assistant]{% endif %}")
    tokenizer.save_pretrained(tmp_path)
    engine = make_engine(tmp_path, token_clusters)
    plain = make_engine(tiny_model_dir, token_clusters)

    assert engine.tokenizer.decode(engine.encode("Revenue was")) == "[user]Revenue was[assistant]"
    assert plain.tokenizer.decode(plain.encode("Revenue was")) == "Revenue was"


def test_bad_inputs_fail_clearly(tiny_model_dir, token_clusters, tmp_path):
    with pytest.raises(ConfigError, match="CONFIG_TRANSFORMERS_DEVICE='gpu0' is not a torch device"):
        TransformersEngine(str(tiny_model_dir), token_clusters, 3, device="gpu0")
    with pytest.raises(ConfigError, match="CONFIG_MODEL_PATH=.*cannot load"):
        make_engine(tmp_path / "missing", token_clusters)
    with pytest.raises(ConfigError, match="cluster map covers 10 tokens.*has 300"):
        make_engine(tiny_model_dir, token_clusters[:10])
    engine = make_engine(tiny_model_dir, token_clusters)
    with pytest.raises(ValueError, match="request 1: 2 deltas for 3 clusters"):
        engine.generate([GenerationRequest("a", (0.0, 0.0, 0.0)), GenerationRequest("b", (0.0, 0.0))])
    with pytest.raises(ConfigError, match=r"request 0 \(prompt ending 'Revenue was .*'\): a prompt of .* exceeds the model's context of 256"):
        engine.generate([GenerationRequest("Revenue was " * 200, (0.0, 0.0, 0.0))])
    assert engine.prompts.prefills == 0  # refused before any prefill, as before the prompt cache
    engine.close()
    engine.close()


# Rows ending at their first token (EOS raised), at the cap (EOS lowered) and between.
VECTORS = [(0.0, 0.0, 0.0), (30.0, 0.0, 0.0), (1.5, 0.0, 0.0), (0.0, 3.0, -3.0), (-30.0, 0.0, 1.5)]


def test_cached_prompts_give_the_tokens_of_a_from_scratch_call(eos_prone_model_dir, token_clusters):
    """A mixed batch (prompts of different lengths, one of a single token, each asked by
    several delta vectors, rows ending from the first token to the cap) decoded from the
    prompt cache, cold and then warm, dropping rows as they end, gives the tokens of
    `generate` run from scratch on the same padded batches."""
    prompts = [*PROMPTS, "0"]
    mixed = [GenerationRequest(p, v) for v in VECTORS for p in prompts]
    for batch_size in (len(mixed), 10):  # rows dropped down to MIN_ROWS; fewer rows than it
        cached = make_engine(eos_prone_model_dir, token_clusters, batch_size=batch_size)
        scratch = make_engine(eos_prone_model_dir, token_clusters, batch_size=batch_size)
        scratch.prompts = None  # the path of a model whose cache cannot be padded: `generate`
        expected = scratch.generate(mixed)
        assert cached.generate(mixed) == expected
        assert cached.prompts.prefills == len(PROMPTS)  # the one-token prompt has nothing to prefill
        assert cached.generate(list(reversed(mixed))) == list(reversed(expected))
        assert cached.prompts.prefills == len(PROMPTS)
    lengths = {g.completion_tokens for g in expected}
    assert {1, MAX_NEW} <= lengths and len(lengths) > 4, "rows must end at different steps"
    assert len(set(expected)) > len(prompts), "the vectors must steer the answers apart"


def test_a_step_runs_only_the_rows_still_answering(eos_prone_model_dir, token_clusters):
    """Each step's forward holds the rows whose answers go on, and never fewer than
    MIN_ROWS (the rows of a smaller batch stay to its end), so a row that ended costs
    nothing after it unless it keeps the step at MIN_ROWS."""
    mixed = [GenerationRequest(p, v) for v in VECTORS for p in [*PROMPTS, "0"]]
    engine = make_engine(eos_prone_model_dir, token_clusters, batch_size=len(mixed))
    small = mixed[-8:]
    engine.generate(mixed)  # every prompt cached: the forwards below are decoding steps only
    rows: list[int] = []
    hook = engine.model.register_forward_pre_hook(
        lambda _, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    for batch in (mixed, small):
        rows.clear()
        lengths = [g.completion_tokens for g in engine.generate(batch)]
        floor = min(MIN_ROWS, len(batch))
        assert rows == [max(floor, sum(n > step for n in lengths)) for step in range(max(lengths))]
    hook.remove()
    assert len(mixed) > MIN_ROWS and rows == [len(small)] * max(lengths)


def test_the_prompt_cache_stays_within_its_bound_and_evicts_the_least_recently_used(
        tiny_model_dir, token_clusters, caplog):
    engine = make_engine(tiny_model_dir, token_clusters)
    a, b, c = (tuple(range(start, start + 6)) for start in (10, 20, 30))  # prefixes: token ids
    one = kv_bytes(engine.prompts.lookup(a))
    cache = PromptCache(engine.model, max_bytes=2 * one)
    with caplog.at_level(logging.WARNING, logger="compressor_2.engines"):
        for prefix, kept in ((a, [a]), (b, [a, b]), (a, [b, a]), (c, [a, c]), (b, [c, b]), (b, [c, b])):
            cache.lookup(prefix)
            assert list(cache.entries) == kept  # least recently used first
            assert cache.bytes == sum(kv_bytes(kv) for kv in cache.entries.values()) <= 2 * one
    assert (cache.prefills, cache.evicted) == (4, 2)  # b prefilled again after c evicted it
    assert len([r for r in caplog.records if "prompt cache is full" in r.getMessage()]) == 1

    too_small = PromptCache(engine.model, max_bytes=one - 1)
    kv = too_small.lookup(a)
    assert kv_bytes(kv) == one and not too_small.entries and too_small.bytes == 0
    assert too_small.evicted == 1
    none_kept = PromptCache(engine.model, max_bytes=0)  # CONFIG_TRANSFORMERS_PROMPT_CACHE_MB=0: silently
    none_kept.lookup(a)
    assert (none_kept.bytes, none_kept.evicted) == (0, 0)


def test_a_row_past_its_room_grows_the_cache_as_dynamic_layers_do(tiny_model_dir, token_clusters):
    engine = make_engine(tiny_model_dir, token_clusters)
    encoded = [engine.encode(p) for p in PROMPTS[:3]]
    padded = engine.tokenizer.pad({"input_ids": encoded}, padding=True, return_tensors="pt")
    answers = []
    for room in (0, MAX_NEW):
        with torch.inference_mode():
            output = engine.model.generate(**padded, **{CACHE_ARG: engine.prompts.batch(encoded, room)},
                                           max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=1)
        answers.append(output.tolist())
    scratch = engine.model.generate(**padded, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=1)
    assert answers == [scratch.tolist()] * 2


def test_sampling_draws_each_row_of_a_shared_prompt_independently(tiny_model_dir, token_clusters):
    engine = TransformersEngine(str(tiny_model_dir), token_clusters, 3, batch_size=24,
                                max_new_tokens=MAX_NEW, temperature=1.0, device="cpu")
    torch.manual_seed(0)
    boosted = (1.5, 0.0, 0.0)  # some rows end early, so the others are drawn in a shrinking batch
    answers = engine.generate(requests((0.0, 0.0, 0.0), ["Revenue was"] * 12) + requests(boosted, ["Revenue was"] * 12))
    assert engine.prompts.prefills == 1
    assert len({a.text for a in answers}) == 24
    assert len({a.completion_tokens for a in answers}) > 2


def test_a_model_whose_cache_cannot_be_padded_prefills_every_row(tiny_model_dir, token_clusters, tmp_path):
    """A sliding-window model keeps only the window: its cache is not padded and stacked,
    and its answers are those of a from-scratch call."""
    shutil.copytree(tiny_model_dir, tmp_path, dirs_exist_ok=True)
    torch.manual_seed(0)
    config = MistralConfig(vocab_size=len(token_clusters), hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                           sliding_window=8, max_position_embeddings=256, eos_token_id=0, pad_token_id=1)
    MistralForCausalLM(config).save_pretrained(tmp_path)
    engine = make_engine(tmp_path, token_clusters)
    answers = engine.generate(requests((0.0, 1.0, -1.0)))

    assert engine.prompts is None
    scratch = make_engine(tmp_path, token_clusters)
    scratch.prompts = None
    assert scratch.generate(requests((0.0, 1.0, -1.0))) == answers


# Deltas by answer phase: a cluster per token class, so a phase's deltas move what the DFA reads.
PHASE_CLUSTERS = 5  # 0 EOS, 1 DIGIT, 2 JOIN, 3 NEWLINE, 4 OTHER


@pytest.fixture(scope="module")
def positional_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random GPT-2 on the tiny tokenizer whose token embeddings are zero (its own lm_head):
    its logits depend on the position alone, so a random model that would repeat one token
    leaves each step to the deltas and a different draw of the positions' logits, and its
    answers cross figures, line breaks and ends under deltas that tie the classes."""
    from transformers import GPT2Config, GPT2LMHeadModel

    directory = tmp_path_factory.mktemp("positional")
    shutil.copytree(tiny_model_dir, directory, dirs_exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(
        vocab_size=len(tokenizer), n_positions=256, n_embd=32, n_layer=2, n_head=2, tie_word_embeddings=False,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id))
    with torch.no_grad():
        model.transformer.wte.weight.zero_()
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def phase_setup(tiny_model_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(token classes, a cluster map by class) of the tiny model's vocabulary."""
    vocabulary = load_vocabulary(str(tiny_model_dir))
    classes = vocabulary_classes(vocabulary)
    clusters = np.where(classes == OTHER, 4, classes).astype(np.int64)
    clusters[sorted(vocabulary.eos_ids)] = 0
    return classes, clusters


class ReferencePhases(LogitsProcessor):
    """One row's deltas by phase, the phase re-read from the whole answer at every step by
    `phase_sequence`, the reference."""

    def __init__(self, deltas: tuple[float, ...], token_clusters: np.ndarray, classes: np.ndarray,
                 phases: int, prompt_length: int) -> None:
        self.vectors = torch.tensor(deltas, dtype=torch.float32).reshape(phases, -1)
        self.token_clusters = torch.as_tensor(token_clusters)
        self.classes, self.phases, self.prompt_length = classes.tolist(), phases, prompt_length
        self.seen: list[int] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        answer = input_ids[0, self.prompt_length:].tolist()
        phase = phase_sequence([*answer, 0], self.classes, self.phases)[-1]
        self.seen.append(phase)
        scores[0, :len(self.token_clusters)] += self.vectors[phase][self.token_clusters]
        return scores


def _phase_vectors(phases: int, count: int, seed: int) -> list[tuple[float, ...]]:
    """Deltas near a tie: figures and joins against words before the first figure (no end),
    words, line breaks and the end after it."""
    rng = np.random.default_rng(seed)
    vectors = []
    for _ in range(count):
        per_phase = np.array([[-20, 3 + rng.uniform(-.5, .5), 3 + rng.uniform(-.5, .5), 0, 3],
                              [3 + rng.uniform(-1, .5), 0, 0, 3 + rng.uniform(-.5, .5), 3],
                              [3 + rng.uniform(-.5, 1), 0, 0, 0, 3]])
        vectors.append(tuple(per_phase[:phases].flatten().tolist()))
    return vectors


@pytest.mark.parametrize("phases, seed", [(2, 0), (3, 2)])
def test_phases_in_the_decode_loop_and_generate_are_exactly_the_reference(positional_model_dir, phase_setup,
                                                                         phases, seed):
    """Each answer, from a batch whose rows leave as they end and move into the places of
    rows that ended (the decode loop), and from `generate` with the incremental processor,
    is the answer of greedy decoding with the deltas of the phase the reference reads."""
    classes, clusters = phase_setup
    mixed = [GenerationRequest(p, v) for v in _phase_vectors(phases, 4, seed) for p in PROMPTS]
    engine = TransformersEngine(str(positional_model_dir), clusters, PHASE_CLUSTERS, batch_size=len(mixed),
                                max_new_tokens=MAX_NEW, device="cpu", phases=phases)
    scratch = TransformersEngine(str(positional_model_dir), clusters, PHASE_CLUSTERS, batch_size=7,
                                 max_new_tokens=MAX_NEW, device="cpu", phases=phases)
    scratch.prompts = None  # `generate` and DeltaBiasProcessor
    answers, seen = engine.generate(mixed), set()
    for request, answer in zip(mixed, answers):
        ids = torch.tensor([engine.encode(request.prompt)])
        reference = ReferencePhases(request.deltas, clusters, classes, phases, ids.shape[1])
        direct = engine.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                       max_new_tokens=MAX_NEW, eos_token_id=engine.eos_ids, pad_token_id=1,
                                       logits_processor=[reference])
        assert answer == engine._finish(direct[0, ids.shape[1]:].tolist()), request
        seen.update(reference.seen)
    assert scratch.generate(mixed) == answers
    assert seen == set(range(phases)), "every phase must steer some step"
    assert len({a.completion_tokens for a in answers}) > 3, "rows must leave at different steps"


def test_one_vector_in_every_phase_is_the_one_phase_answer(positional_model_dir, phase_setup):
    """Phases whose deltas are all the same steer as today's one vector, and a one-phase engine
    builds no DFA at all."""
    _, clusters = phase_setup
    vectors = [v[:PHASE_CLUSTERS] for v in _phase_vectors(2, 3, 0)]
    one, three = (TransformersEngine(str(positional_model_dir), clusters, PHASE_CLUSTERS, batch_size=8,
                                     max_new_tokens=MAX_NEW, device="cpu", phases=phases) for phases in (1, 3))
    assert one.decoding.phases is None and one.phases == 1
    assert three.generate([GenerationRequest(p, v * 3) for v in vectors for p in PROMPTS]) == \
        one.generate([GenerationRequest(p, v) for v in vectors for p in PROMPTS])
    with pytest.raises(ValueError, match=r"request 0: 5 deltas for 5 clusters in 3 phases"):
        three.generate([GenerationRequest(PROMPTS[0], vectors[0])])

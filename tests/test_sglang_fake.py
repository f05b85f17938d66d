"""The fake SGLang server behaves like the real one where the engine depends on it:
batching rows by processor string, SGLang's contract gate, the context, temperature.
(tests/test_sglang_contract.py checks the same parts against SGLang's own code.)"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.sglang_helpers import ATTACHABLE, fake_server, fake_stats


def generate(url: str, sampling: dict, ids: list[int] | None = None, **body) -> httpx.Response:
    return httpx.post(url + "/generate", timeout=60,
                      json={"input_ids": ids or [5, 6, 7], "sampling_params": sampling, **body})


@pytest.fixture(scope="module")
def url(tiny_model_dir: Path):
    with fake_server(tiny_model_dir, *ATTACHABLE, "--context-length", "40") as address:
        yield address


def test_unknown_and_mistyped_sampling_fields_are_a_400(url: str):
    unknown = generate(url, {"max_tokens": 4})
    assert unknown.status_code == 400
    assert unknown.json()["error"].startswith("unknown field `max_tokens`, expected one of `max_new_tokens`")
    mistyped = generate(url, {"temperature": "0.5"})
    assert (mistyped.status_code, mistyped.json()) == (400, {"error": 'invalid type: string "0.5", expected f64'})


def test_past_the_context_is_a_400_and_just_short_of_it_is_cut(url: str):
    too_long = generate(url, {"max_new_tokens": 4}, ids=list(range(3, 43)))
    assert too_long.status_code == 400
    assert too_long.json()["error"]["message"] == ("The input (40 tokens) is longer than the model's context "
                                                   "length (40 tokens).")
    total = generate(url, {"max_new_tokens": 31}, ids=list(range(3, 13)))
    assert total.status_code == 400
    assert "You requested a total of 41 tokens: 10 tokens from the input messages and 31 tokens" \
        in total.json()["error"]["message"]
    # 10 + 30 fits the check, but the scheduler keeps only context - 2 - prompt = 28.
    cut = generate(url, {"max_new_tokens": 30, "ignore_eos": True, "temperature": 0}, ids=list(range(3, 13)))
    assert cut.status_code == 200 and cut.json()["meta_info"]["completion_tokens"] == 28


def test_temperature_is_honoured(url: str):
    def answer(**sampling) -> list[int]:
        response = generate(url, {"max_new_tokens": 12, "ignore_eos": True, **sampling})
        assert response.status_code == 200, response.text
        return response.json()["output_ids"]

    greedy = answer(temperature=0)
    assert answer(temperature=0) == greedy
    assert answer(temperature=2.0, sampling_seed=1) == answer(temperature=2.0, sampling_seed=1)
    sampled = {tuple(answer(temperature=2.0, sampling_seed=seed)) for seed in range(4)}
    assert len(sampled) > 1 and tuple(greedy) not in sampled


def test_rows_are_grouped_by_processor_string_and_steered_together(tiny_model_dir: Path):
    # A step delay lets concurrent requests join one batch, as they do in SGLang.
    from concurrent.futures import ThreadPoolExecutor

    from compressor_2.steering.processor import processor_spec

    spec = processor_spec()
    with fake_server(tiny_model_dir, *ATTACHABLE, "--fake-step-delay", "0.05") as address:
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda i: generate(
                address, {"max_new_tokens": 6, "ignore_eos": True, "temperature": 0,
                          "custom_params": {"deltas": []}}, ids=[5, 6, 7 + i], custom_logit_processor=spec),
                range(6)))
        stats = fake_stats(address)
    assert all(a.status_code == 200 for a in answers)
    assert stats["processor_strings"] == 1
    assert stats["max_rows_per_call"] > 1  # one call per step for the whole group
    assert stats["processor_calls"] < 6 * 6


def test_a_worker_modelling_prefill_prefills_what_its_prefix_cache_lacks(tiny_model_dir: Path):
    a, b, c = [1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9, 9], [7, 8, 9, 10, 11, 12]
    flags = ("--fake-prefill-per-token", "0.001", "--fake-prefix-cache", "12")
    with fake_server(tiny_model_dir, *ATTACHABLE, *flags) as address:
        prefilled = []
        for ids in (a, a, b, c, a):
            assert generate(address, {"max_new_tokens": 1}, ids).status_code == 200
            prefilled.append(fake_stats(address)["prefilled_tokens"])
    # a in full; a again: nothing; b: past the prefix it shares with a; c: in full, and a (the
    # least recently used) is dropped to keep 12 tokens; a again: past the prefix b still holds.
    assert [n - m for n, m in zip(prefilled, [0, *prefilled])] == [6, 0, 3, 6, 3]


def test_without_the_prefill_flags_nothing_is_counted(url: str):
    assert generate(url, {"max_new_tokens": 1}).status_code == 200
    assert fake_stats(url)["prefilled_tokens"] == 0

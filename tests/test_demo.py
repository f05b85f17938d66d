"""The embedded demo: the synthetic task's generator, its padded answers, the training
script, and the shipped model."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from compressor_2.data.financebench import load_examples
from compressor_2.demo import task
from compressor_2.demo.answers import direct_answer, padded_answer
from compressor_2.demo.task import KINDS, SINGLE, TWO, YES_NO, generate, write_splits
from compressor_2.judges.base import JudgeItem
from compressor_2.judges.numeric import NumericJudge, extract_figures

FIELDS = {"financebench_id", "company", "doc_name", "question_type", "question", "answer", "evidence"}
EVIDENCE_FIELDS = {"evidence_text", "doc_name", "evidence_page_num", "evidence_text_full_page"}


def test_generator_is_deterministic_under_a_seed() -> None:
    assert generate(30, seed=5) == generate(30, seed=5)
    assert [q.question for q in generate(30, seed=5)] != [q.question for q in generate(30, seed=6)]


def test_splits_are_financebench_shaped_and_readable_by_the_loader(tmp_path: Path) -> None:
    train_path, heldout_path = write_splits(tmp_path, train_size=12, heldout_size=30)
    records = [json.loads(line) for line in heldout_path.read_text().splitlines()]
    assert len(records) == 30
    for record in records:
        assert FIELDS <= record.keys()
        assert record["question_type"] in KINDS
        assert [EVIDENCE_FIELDS <= e.keys() for e in record["evidence"]] == [True]
    assert {r["question_type"] for r in records} == set(KINDS)
    examples = load_examples(heldout_path)
    assert [e.gold for e in examples] == [r["answer"] for r in records]
    assert examples[0].question in examples[0].prompt
    assert records[0]["evidence"][0]["evidence_text_full_page"] in examples[0].prompt
    train_ids = {json.loads(line)["financebench_id"] for line in train_path.read_text().splitlines()}
    assert not train_ids & {r["financebench_id"] for r in records}


def test_committed_splits_are_what_the_generator_writes(tmp_path: Path) -> None:
    write_splits(tmp_path)
    for name in ("train.jsonl", "heldout.jsonl"):
        assert (tmp_path / name).read_text() == (task.DATA_DIR / name).read_text(), name


def _value(page: str, item: str) -> float:
    line = next(line for line in page.splitlines() if line.strip().startswith(item + ":"))
    return extract_figures(line.partition(":")[2])[0].value


@pytest.mark.parametrize("seed", [0, 1])
def test_gold_answers_come_from_the_evidence(seed: int) -> None:
    for q in generate(90, seed):
        page = q.to_record()["evidence"][0]["evidence_text_full_page"]
        if q.kind == SINGLE:
            assert f": {q.answer}\n" in page + "\n"
        elif q.kind == TWO:
            first, second = q.answer.split(" and ")
            assert f": {first}\n" in page + "\n" and f": {second}\n" in page + "\n"
        else:
            assert q.kind == YES_NO and q.threshold is not None
            value = _value(page, q.asked[0].item)
            threshold = extract_figures(q.threshold)[0].value
            assert q.answer == ("Yes" if value > threshold else "No"), (q.question, value)


def test_padded_answers_are_mostly_padded_and_always_correct() -> None:
    rng = random.Random(0)
    questions = generate(600, seed=3)
    answers = [padded_answer(q, rng) for q in questions]
    padded = sum(a != direct_answer(q) for q, a in zip(questions, answers)) / len(answers)
    assert 0.75 <= padded <= 0.95
    ratio = statistics.mean(map(len, answers)) / statistics.mean(len(q.answer) for q in questions)
    assert ratio >= 3
    verdicts = NumericJudge().judge([JudgeItem(q.question, a, q.answer) for q, a in zip(questions, answers)])
    assert all(v.is_correct for v in verdicts), [v.reasoning for v in verdicts if not v.is_correct][:3]
    # Padding never carries a yes/no of its own: only yes/no questions' answers say one.
    for q, a in zip(questions, answers):
        if q.kind != YES_NO:
            assert not {"yes", "no"} & set(a.lower().replace(".", " ").replace(",", " ").split())


def test_the_direct_answer_quotes_the_figures_and_gives_a_verdict_last() -> None:
    from compressor_2.demo.train import train_tokenizer

    questions = generate(90, seed=6)
    directs = [direct_answer(q) for q in questions]
    verdicts = NumericJudge().judge([JudgeItem(q.question, d, q.answer) for q, d in zip(questions, directs)])
    assert all(v.is_correct for v in verdicts), [v.reasoning for v in verdicts if not v.is_correct][:3]
    tokenizer = train_tokenizer([q.page for q in questions] + directs + [q.answer for q in questions], 1200)

    def tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    for q, direct in zip(questions, directs):
        if q.kind == SINGLE:
            assert direct.startswith(q.asked[0].item + ": ") and direct.endswith(q.answer)
            # "Revenue: $" is one token, as "$" is; "Gross Margin: " is one token more.
            assert tokens(direct) == tokens(q.answer) + (0 if q.answer.startswith("$") else 1), direct
        elif q.kind == YES_NO:
            # The figure first, the verdict last: the comparison rests on a figure written out.
            assert direct == f"{q.asked[0].item}: {q.asked[0].value}, so {q.answer.lower()}"


def test_training_rows_are_the_chat_prompt_then_the_answer_and_eos() -> None:
    from compressor_2.demo.train import answer_rows, encode_rows, render_prompt, train_tokenizer

    pairs = [("Evidence:\nRevenue: $12 million\n\nQuestion: What was revenue?", "$12 million"),
             ("Evidence:\nGross margin: 1.9%\n\nQuestion: What was the gross margin?", "It was 1.9%.")]
    tokenizer = train_tokenizer([text for pair in pairs for text in pair] * 5, 300)
    ids, labels = encode_rows(tokenizer, answer_rows(tokenizer, pairs))
    for row, (prompt, answer) in enumerate(pairs):
        # Exactly what the engine sends: the chat template's rendering, tokenized alone.
        prompt_ids = tokenizer(render_prompt(tokenizer, prompt), add_special_tokens=False)["input_ids"]
        assert ids[row][: len(prompt_ids)].tolist() == prompt_ids
        assert (labels[row][: len(prompt_ids)] == -100).all()
        target = labels[row][labels[row] != -100].tolist()
        assert target[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(target[:-1]) == answer


def test_look_up_rows_train_only_the_figures_after_their_line_labels() -> None:
    from compressor_2.demo.train import TrainingStream, encode_rows, train_tokenizer

    stream = TrainingStream(seed=0)
    rows = stream.recalls(2)
    tokenizer = train_tokenizer([text for row in rows for text, _ in row] * 3, 600)
    ids, labels = encode_rows(tokenizer, rows)
    for row, segments in enumerate(rows):
        page, *lines = segments
        assert not page[1] and page[0].count(":") == len(lines) // 2
        trained = [text for text, is_trained in lines if is_trained]
        assert all(text[0].isdigit() for text in trained)
        assert all(text.strip() in page[0] for text in trained)
        target = labels[row][labels[row] != -100].tolist()
        assert tokenizer.decode(target) == "".join(trained)


def test_comparison_rows_answer_yes_no_from_the_page_with_the_loss_on_the_answers() -> None:
    from compressor_2.demo.train import TrainingStream, encode_rows, train_tokenizer

    rows = TrainingStream(seed=0).comparisons(30)
    verdicts = []
    for page, *pairs in rows:
        assert not page[1] and len(pairs) == 8
        for (question, asked), (answer, trained) in zip(pairs[::2], pairs[1::2]):
            assert not asked and trained
            label = question.removeprefix("\nDid ").split(" exceed ")[0]
            threshold = extract_figures(question.split(" exceed ")[1])[0].value
            assert answer.startswith(label + ": ") and answer.partition(", so ")[0] in page[0]
            value = _value(page[0], label)
            verdicts.append(answer.endswith("so yes."))
            assert verdicts[-1] == (value > threshold), (question, answer)
    assert 0.35 < sum(verdicts) / len(verdicts) < 0.65
    tokenizer = train_tokenizer([text for row in rows for text, _ in row], 600)
    ids, labels = encode_rows(tokenizer, rows[:1])
    trained = "".join(text for text, is_trained in rows[0] if is_trained)
    assert tokenizer.decode(labels[0][labels[0] != -100].tolist()) == trained


def test_answer_loss_is_the_models_own_loss_and_digit_runs_start_ordered() -> None:
    import torch

    from compressor_2.demo.train import (TrainSettings, TrainingStream, answer_loss, answer_rows,
                                         build_model, encode_rows, train_tokenizer)

    stream = TrainingStream(seed=0)
    pairs = stream.answers(40)
    tokenizer = train_tokenizer([text for pair in pairs for text in pair] + ["7 8 15 300 577"] * 50, 700)
    torch.manual_seed(0)
    model = build_model(TrainSettings(hidden_size=32, layers=1, heads=2, intermediate_size=64), tokenizer)
    ids, labels = encode_rows(tokenizer, stream.recalls(2) + answer_rows(tokenizer, pairs[:3]))
    torch.testing.assert_close(answer_loss(model, ids, labels), model(input_ids=ids, labels=labels).loss)
    # Magnitude features put "577" above "300" and "15" above "8" before any training.
    embedding = model.get_input_embeddings().weight

    def magnitude(token: str) -> float:
        return embedding[tokenizer.convert_tokens_to_ids(token), 0].item()

    assert magnitude("577") > magnitude("300") > magnitude("15") > magnitude("8") > magnitude("7")


def test_a_line_label_and_the_opening_of_its_value_are_one_token() -> None:
    from compressor_2.demo.train import train_tokenizer

    texts = ["  Net Income: $1,577 million", "  Gross Margin: 41.3%", "What was Net Income?"] * 5
    tokenizer = train_tokenizer(texts, 400)
    pieces = [tokenizer.decode([i]) for i in tokenizer("  Net Income: $1,577 million")["input_ids"]]
    assert " Net Income: $" in pieces and "577" in pieces
    assert " Net Income" in [tokenizer.decode([i]) for i in tokenizer("What was Net Income?")["input_ids"]]


@pytest.mark.slow
def test_training_script_writes_a_model_that_loads_and_generates(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from compressor_2.demo.train import main

    main(["--out", str(tmp_path), "--steps", "2", "--batch-size", "2", "--tokenizer-corpus", "100"])
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert tokenizer.pad_token_id not in (None, tokenizer.eos_token_id)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What was revenue?"}],
                                         add_generation_prompt=True, tokenize=False)
    assert text == "<|user|>\nWhat was revenue?\n<|assistant|>\n"
    inputs = tokenizer(text, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=5, do_sample=False, min_new_tokens=5)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 5


@pytest.fixture(scope="module")
def shipped() -> tuple[object, list]:
    from compressor_2.demo.quality import eos_engine

    model_dir = Path(task.__file__).resolve().parent / "model"
    examples = load_examples(task.DATA_DIR / "heldout.jsonl", "0-11")
    return eos_engine(model_dir, batch_size=12, max_new_tokens=96), examples


@pytest.mark.slow
def test_shipped_model_pads_and_an_eos_bias_shortens_it(shipped) -> None:
    from compressor_2.demo.quality import score

    engine, examples = shipped
    scores, _ = score(engine, examples, 0.0, NumericJudge())
    overall = scores[-1]
    assert overall.kind == "all" and overall.n == 12
    assert overall.ratio >= 3  # answers are padded: room for the evolution
    # A strong EOS bias shortens the answers (the room the evolution searches).
    shorter, _ = score(engine, examples, 8.0, NumericJudge())
    assert shorter[-1].mean_tokens < overall.mean_tokens * 0.75


@pytest.mark.slow
def test_shipped_model_meets_the_quality_bar(shipped) -> None:
    from compressor_2.demo.quality import score

    engine, _ = shipped
    scores, _ = score(engine, load_examples(task.DATA_DIR / "heldout.jsonl"), 0.0, NumericJudge())
    assert scores[-1].n == 150 and scores[-1].ratio >= 3
    assert scores[-1].correctness >= 0.80

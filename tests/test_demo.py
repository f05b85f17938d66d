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
from compressor_2.demo.task import DISCLOSURES, KINDS, LABELS, YES_NO, generate, write_splits
from compressor_2.judges.base import JudgeItem
from compressor_2.judges.numeric import NumericJudge

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


@pytest.mark.parametrize("seed", [0, 1])
def test_gold_answers_come_from_the_evidence(seed: int) -> None:
    for q in generate(96, seed):
        page = q.to_record()["evidence"][0]["evidence_text_full_page"] + "\n"
        for fact in q.asked:
            assert f"  {fact.item}: {fact.value}\n" in page
        if q.kind == YES_NO:
            assert q.asked[0].item in DISCLOSURES and q.answer == q.asked[0].value in ("Yes", "No")
            assert q.asked[0].item in q.question
        else:
            assert q.answer.replace(" and ", ", ").split(", ") == [fact.value for fact in q.asked]
            assert all(fact.item in q.question for fact in q.asked)


@pytest.mark.parametrize("split", ["train.jsonl", "heldout.jsonl"])
def test_a_constant_verdict_earns_exactly_half_of_the_yes_no_questions(split: str) -> None:
    examples = [e for e in load_examples(task.DATA_DIR / split) if e.question_type == YES_NO]
    assert len(examples) >= 16
    judge = NumericJudge()
    for verdict in ("yes", "no"):
        verdicts = judge.judge([JudgeItem(e.question, verdict, e.gold) for e in examples])
        assert sum(v.is_correct for v in verdicts) * 2 == len(examples), verdict


def test_every_kind_is_equally_represented_in_the_splits() -> None:
    for split, size in (("train.jsonl", task.TRAIN_SIZE), ("heldout.jsonl", task.HELDOUT_SIZE)):
        kinds = [e.question_type for e in load_examples(task.DATA_DIR / split)]
        assert {kind: kinds.count(kind) for kind in KINDS} == {kind: size // len(KINDS) for kind in KINDS}


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


def test_the_direct_answer_quotes_the_lines_asked_about() -> None:
    from compressor_2.demo.train import train_tokenizer

    questions = generate(96, seed=6)
    directs = [direct_answer(q) for q in questions]
    verdicts = NumericJudge().judge([JudgeItem(q.question, d, q.answer) for q, d in zip(questions, directs)])
    assert all(v.is_correct for v in verdicts), [v.reasoning for v in verdicts if not v.is_correct][:3]
    # Every label line at least ten times: BPE merges what it sees often enough.
    labels = [f"{label}: Yes;  {label}: No" for label in LABELS] * 10
    tokenizer = train_tokenizer([q.page for q in questions] + directs + [q.answer for q in questions] + labels,
                                1200)

    def tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    for q, direct in zip(questions, directs):
        assert direct == "; ".join(f"{fact.item}: {fact.value}" for fact in q.asked)
        if len(q.asked) == 1:
            # "Revenue: $" is one token, as "$" is; "Gross Margin: " or "Stock Split: " is one token more.
            assert tokens(direct) == tokens(q.answer) + (0 if q.answer.startswith("$") else 1), direct


def test_training_rows_are_the_chat_prompt_then_the_answer_and_eos() -> None:
    from compressor_2.demo.train import answer_segments, encode_rows, render_prompt, train_tokenizer

    pairs = [("Evidence:\nRevenue: $12 million\n\nQuestion: What was revenue?", "$12 million"),
             ("Evidence:\nGross margin: 1.9%\n\nQuestion: What was the gross margin?", "It was 1.9%.")]
    tokenizer = train_tokenizer([text for pair in pairs for text in pair] * 5, 300)
    ids, labels = encode_rows(tokenizer, answer_segments(tokenizer, pairs))
    for row, (prompt, answer) in enumerate(pairs):
        # Exactly what the engine sends: the chat template's rendering, tokenized alone.
        prompt_ids = tokenizer(render_prompt(tokenizer, prompt), add_special_tokens=False)["input_ids"]
        assert ids[row][: len(prompt_ids)].tolist() == prompt_ids
        assert (labels[row][: len(prompt_ids)] == -100).all()
        target = labels[row][labels[row] != -100].tolist()
        assert target[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(target[:-1]) == answer


def test_look_up_rows_train_only_the_values_after_their_line_labels() -> None:
    from compressor_2.demo.train import TrainingStream, encode_rows, train_tokenizer

    stream = TrainingStream(seed=0)
    rows = stream.recalls(2)
    tokenizer = train_tokenizer([text for row in rows for text, _ in row] * 3, 600)
    ids, labels = encode_rows(tokenizer, rows)
    for row, segments in enumerate(rows):
        page, *lines = segments
        assert not page[1] and page[0].count(":") == len(lines) // 2
        trained = [text for text, is_trained in lines if is_trained]
        assert all(text[0].isdigit() or text in ("Yes", "No") for text in trained)
        assert all(text.strip() in page[0] for text in trained)
        target = labels[row][labels[row] != -100].tolist()
        assert tokenizer.decode(target) == "".join(trained)


def test_answer_loss_is_the_models_own_loss() -> None:
    import torch

    from compressor_2.demo.train import (TrainSettings, TrainingStream, answer_loss, answer_segments,
                                         build_model, encode_rows, train_tokenizer)

    stream = TrainingStream(seed=0)
    pairs = stream.answers(40)
    tokenizer = train_tokenizer([text for pair in pairs for text in pair], 700)
    torch.manual_seed(0)
    model = build_model(TrainSettings(hidden_size=32, layers=1, heads=2, intermediate_size=64), tokenizer)
    ids, labels = encode_rows(tokenizer, stream.recalls(2) + answer_segments(tokenizer, pairs[:3]))
    torch.testing.assert_close(answer_loss(model, ids, labels), model(input_ids=ids, labels=labels).loss)


def test_a_line_label_and_the_opening_of_its_value_are_one_token() -> None:
    from compressor_2.demo.train import train_tokenizer

    texts = ["  Net Income: $1,577 million", "  Gross Margin: 41.3%", "What was Net Income?",
             "  Stock Split: No"] * 5
    tokenizer = train_tokenizer(texts, 400)
    pieces = [tokenizer.decode([i]) for i in tokenizer("  Net Income: $1,577 million")["input_ids"]]
    assert " Net Income: $" in pieces and "577" in pieces
    assert [tokenizer.decode([i]) for i in tokenizer("  Stock Split: No")["input_ids"]][-2:] == [" Stock Split: ", "No"]
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
    assert [s.kind for s in scores] == sorted(KINDS) + ["all"]
    assert scores[-1].n == task.HELDOUT_SIZE and scores[-1].ratio >= 3
    assert all(s.correctness >= 0.80 for s in scores), scores

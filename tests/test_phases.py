"""Deltas by answer phase: the token classes, the DFA's reference (`phase_sequence`) on
hand-written answers, and the device tables and the `generate` processor held to it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compressor_2.steering.hf_processor import DeltaBiasProcessor
from compressor_2.steering.phases import (
    DIGIT,
    JOIN,
    NEWLINE,
    OTHER,
    PhaseTables,
    check_phases,
    phase_rows,
    phase_sequence,
    token_class,
    token_classes,
)


@pytest.mark.parametrize("text, expected", [
    ("1", DIGIT), ("48", DIGIT), ("Ġ2018", DIGIT), (" 2018", DIGIT), ("3.5%", DIGIT), ("1,000", DIGIT),
    ("▁7", DIGIT), ("٣", DIGIT), ("12\n", DIGIT),  # a digit wins over the line break it holds
    (",", JOIN), (".", JOIN), ("%", JOIN), (" ,", JOIN), ("Ġ.", JOIN),
    ("\n", NEWLINE), ("\n\n", NEWLINE), (".\n", NEWLINE), (":\n", NEWLINE), (" \n", NEWLINE),
    ("$", OTHER), ("$5", OTHER), ("FY2018", OTHER), ("..", OTHER), (",,", OTHER), ("", OTHER),
    (" ", OTHER), ("**", OTHER), ("-", OTHER), ("<|endoftext|>", OTHER), (" million", OTHER),
])
def test_token_class(text: str, expected: int) -> None:
    assert token_class(text) == expected


def test_end_and_special_tokens_are_other_whatever_their_text() -> None:
    classes = token_classes(["1", "\n", ",", "x"], other_ids=[0, 1, 9])
    assert classes.tolist() == [OTHER, OTHER, JOIN, OTHER] and classes.dtype == np.int8


def _phases_of(tokens: list[str], phases: int) -> list[int]:
    """The reference over an answer written as token texts (each its own id)."""
    return phase_sequence(list(range(len(tokens))), token_classes(tokens), phases)


# Each answer: its tokens, and the phase that steers each token's choice with 2 and 3 phases.
ANSWERS = {
    "a figure in pieces": (
        ["The", " total", " is", " 1", ",", "234", ".", "5", " million", ".", "\n", "Done"],
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1],
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2]),
    "money": (
        ["$", "5", ",", "210", "\n", "-", " 3"],
        [0, 0, 0, 0, 0, 1, 1],
        [0, 0, 0, 0, 0, 2, 2]),  # the line break completes the figure
    "a join then a word": (
        ["It", " rose", " 3", ".", " It", " fell"],
        [0, 0, 0, 0, 0, 1],
        [0, 0, 0, 0, 0, 1]),
    "a join then a line break": (
        ["Up", " 3", "%", "\n", "x"],
        [0, 0, 0, 0, 1],
        [0, 0, 0, 0, 2]),
    "a list": (
        ["\n", "1", ".", " Revenue", ":", " 12", "\n", "2", ".", " Costs"],
        [0, 0, 0, 0, 1, 1, 1, 1, 1, 1],
        [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]),
    "line breaks before any figure": (
        ["\n", "\n\n", "Answer", ":", ",", ".", "\n"],
        [0] * 7,
        [0] * 7),
    "a figure and its full stop on one line": (
        ["42", ".\n", "Next"],
        [0, 0, 1],
        [0, 0, 2]),
    "a number that ends the answer": (
        [" 5", "363"],
        [0, 0],
        [0, 0]),
    "empty": ([], [], []),
}


@pytest.mark.parametrize("name", ANSWERS)
def test_the_reference_on_written_answers(name: str) -> None:
    tokens, two, three = ANSWERS[name]
    assert _phases_of(tokens, 1) == [0] * len(tokens)
    assert _phases_of(tokens, 2) == two
    assert _phases_of(tokens, 3) == three


def test_ids_past_the_classes_are_other() -> None:
    classes = token_classes(["1", "x"])
    assert phase_sequence([0, 7, 1], classes, 2) == [0, 0, 1]  # 7: a model's padding column


def test_phases_out_of_range_are_refused() -> None:
    for bad in (0, 4, True, 2.0):
        with pytest.raises(ValueError, match="phases must be an int from 1 to 3"):
            check_phases(bad)  # type: ignore[arg-type]


def _random_answers(rng: np.random.Generator, rows: int, length: int, vocab: int) -> torch.Tensor:
    return torch.as_tensor(rng.integers(0, vocab + 3, (rows, length)))  # some past the vocabulary


@pytest.mark.parametrize("phases", [1, 2, 3])
def test_the_device_tables_step_as_the_reference(phases: int) -> None:
    rng = np.random.default_rng(phases)
    classes = rng.integers(0, 4, 20).astype(np.int8)
    classes[rng.integers(0, 20, 12)] = DIGIT  # figures often
    tables = PhaseTables.make(classes, phases, "cpu")
    answers = _random_answers(rng, 64, 30, len(classes))
    states = tables.start(64)
    table = phase_rows(torch.arange(64 * phases * 2, dtype=torch.float32).reshape(64, phases * 2), phases)
    seen = []
    for column in range(answers.shape[1]):
        chosen = PhaseTables.select(table, states)  # each row's bias row: its phase's deltas
        seen.append(((chosen[:, 0] % (phases * 2)) // 2).long())
        states = tables.advance(states, answers[:, column])
    got = torch.stack(seen, 1).tolist()
    assert got == [phase_sequence(row, classes.tolist(), phases) for row in answers.tolist()]
    assert phases == 1 or {p for row in got for p in row} == set(range(phases))


def test_phase_rows_keeps_each_phases_deltas_and_a_zero_column() -> None:
    deltas = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])  # 3 phases of 2 clusters
    table = phase_rows(deltas, 3)
    assert table.shape == (1, 5, 3)
    assert table[0].tolist() == [[1, 2, 0], [1, 2, 0], [1, 2, 0], [3, 4, 0], [5, 6, 0]]


@pytest.mark.parametrize("phases", [2, 3])
def test_the_generate_processor_steers_each_row_by_its_phase(phases: int) -> None:
    """Called as `generate` calls it: the prompts, then one more column a step."""
    rng = np.random.default_rng(10 + phases)
    vocab, clusters, rows, width = 30, 3, 5, 34
    classes = rng.integers(0, 4, vocab).astype(np.int8)
    token_clusters = torch.as_tensor(rng.integers(-1, clusters, vocab))
    deltas = torch.as_tensor(rng.normal(0, 2, (rows, phases * clusters)), dtype=torch.float32)
    processor = DeltaBiasProcessor(deltas, token_clusters, PhaseTables.make(classes, phases, "cpu"))
    ids = torch.as_tensor(rng.integers(0, vocab, (rows, 4)))  # the prompts: never read as answers
    answers = _random_answers(rng, rows, 25, vocab)
    reference = [phase_sequence(row, classes.tolist(), phases) for row in answers.tolist()]
    for step in range(answers.shape[1]):
        scores = torch.randn(rows, width)
        out = processor(ids, scores.clone())
        for row in range(rows):
            phase = reference[row][step]
            vector = torch.cat([deltas[row, phase * clusters:(phase + 1) * clusters], torch.zeros(1)])
            expected = scores[row].clone()
            expected[:vocab] += vector[token_clusters.where(token_clusters >= 0, clusters)]
            assert torch.equal(out[row], expected), (row, step)
        ids = torch.cat([ids, answers[:, step:step + 1]], 1)
    assert {p for row in reference for p in row} == set(range(phases))
"""Paired confidence (compressor_2/findings/confidence.py) and the claims read from a run archive
(compressor_2/findings/claims.py): a hand-built archive whose paired verdicts are known gives the
intervals and p-values scipy gives computed directly, the same on every run."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from compressor_2.archive import Answer, CheckStore, RunArchive, genome_key
from compressor_2.data.example import Example
from compressor_2.data.prompt import instructed
from compressor_2.fitness import example_key
from compressor_2.findings.claims import HELDOUT, TRAINING, Arm, Claims, cap_context
from compressor_2.findings.confidence import (
    RESAMPLES, SEED, compare, correctness_claim, does_as_well, mcnemar_exact, mean_change_interval, newcombe_paired,
    tokens_claim, difference_in_words, wilson,
)


def test_newcombes_interval_is_the_published_one():
    # Fagerland, Lydersen and Laake, "Statistical analysis of contingency tables" (2017), chapter 8:
    # complete response before and after consolidation therapy (Cavo et al. 2012), 161 pairs.
    low, high = newcombe_paired(59, 6, 16, 80)
    assert (round(low, 4), round(high, 4)) == (-0.1186, -0.0046)


def test_the_interval_is_built_on_scipys_wilson_limits():
    # With the pairs uncorrelated (psi = 0: here a*d - b*c = 0), the limits are the square-and-add of
    # the two Wilson intervals scipy gives.
    both, first_only, second_only, neither = 4, 2, 6, 3
    n = 15
    l1, u1 = (lambda ci: (ci.low, ci.high))(stats.binomtest(6, n).proportion_ci(0.95, method="wilson"))
    l2, u2 = (lambda ci: (ci.low, ci.high))(stats.binomtest(10, n).proportion_ci(0.95, method="wilson"))
    assert wilson(6, n) == pytest.approx((l1, u1))
    d = 6 / n - 10 / n
    low, high = newcombe_paired(both, first_only, second_only, neither)
    assert low == pytest.approx(d - np.hypot(6 / n - l1, u2 - 10 / n))
    assert high == pytest.approx(d + np.hypot(10 / n - l2, u1 - 6 / n))


def test_no_disagreeing_pair_does_not_rule_out_a_loss():
    """20 questions, both right on all: no difference seen, and still a 16-point loss possible."""
    low, high = newcombe_paired(20, 0, 0, 0)
    assert low < -0.15 and high > 0.15 and low == pytest.approx(-high)
    p = compare([(30, True)] * 20, [(10, True)] * 20)
    assert p.difference == 0 and p.p_value == 1 and difference_in_words(p) == "no significant difference"
    assert p.drop_bound > 0.15


def test_mcnemar_is_scipys_exact_binomial_test_on_the_discordant_pairs():
    assert mcnemar_exact(1, 7) == stats.binomtest(1, 8, 0.5).pvalue
    assert mcnemar_exact(0, 0) == 1.0


def test_the_bootstrap_is_scipys_paired_bootstrap_with_the_fixed_seed_and_reproduces():
    rng = np.random.default_rng(3)
    reference, other = rng.integers(20, 40, 50), rng.integers(5, 15, 50)
    direct = stats.bootstrap((reference.astype(float), other.astype(float)),
                             lambda a, b, axis=-1: np.mean(b - a, axis=axis), paired=True, vectorized=True, n_resamples=RESAMPLES, rng=np.random.default_rng(SEED))
    mine = mean_change_interval(reference.tolist(), other.tolist())
    assert mine == (direct.confidence_interval.low, direct.confidence_interval.high)
    assert mean_change_interval(reference.tolist(), other.tolist()) == mine  # the same figures on every run
    assert mean_change_interval([10], [4]) == (-6.0, -6.0)  # nothing to resample


def test_the_words_say_what_the_interval_and_the_test_say():
    reference = [(30, True)] * 200
    loss = compare(reference, [(9, True)] * 180 + [(9, False)] * 20)
    assert difference_in_words(loss) == "a significant loss" and loss.high < 0 and loss.p_value < 0.05
    small = compare(reference[:198] + [(30, False)] * 2, [(9, True)] * 196 + [(10, False)] * 4)
    assert correctness_claim(small).startswith("98.0% correct, -1.0 points (95% CI ")
    assert "no significant loss, McNemar p=" in correctness_claim(small)
    assert tokens_claim(small).startswith("9.0 tokens (-70%; -21.0 an answer, 95% CI ")
    # Five questions lost and none won: the interval excludes 0, the exact test (p = 1/16) does not.
    borderline = compare([(30, True)] * 64, [(9, True)] * 59 + [(9, False)] * 5)
    assert borderline.high < 0 and borderline.p_value > 0.05 and difference_in_words(borderline) == "a borderline loss"


def test_does_as_well_means_neither_surely_longer_nor_surely_less_correct():
    best = [(10, True)] * 50
    assert does_as_well(compare(best, [(10, True)] * 49 + [(11, False)]))
    assert not does_as_well(compare(best, [(18, True)] * 50))  # surely longer
    assert not does_as_well(compare(best, [(10, True)] * 30 + [(10, False)] * 20))  # surely less correct


# -- claims read from a hand-built archive ---------------------------------------------------------

CONTEXT = "ctx"
POOL = [Example(f"q{i}", f"question {i}?", "$1", f"prompt {i}") for i in range(12)]
HELD = [Example(f"h{i}", f"held {i}?", "$2", f"held prompt {i}") for i in range(30)]
ZEROS, BEST = genome_key([0.0, 0.0]), genome_key([0.5, -1.0])
# (tokens, correct) per question: the best loses h0..h2, both miss h29, the rest agree.
BASELINE_HELD = [(30 + i % 5, i != 29) for i in range(30)]
BEST_HELD = [(9 + i % 3, i not in (0, 1, 2, 29)) for i in range(30)]


def store(archive: RunArchive, genome: str, examples: list[Example], outcomes: list[tuple[int, bool]],
          table: str = "check_answers") -> None:
    answers = {(genome, example_key(ex)): Answer(f"answer {t}", t, c, "") for ex, (t, c) in zip(examples, outcomes)}
    getattr(archive, table).store(answers, CONTEXT, 0)


@pytest.fixture
def hand_built(tmp_path) -> RunArchive:
    archive = RunArchive.open(tmp_path / "run.sqlite")
    archive.set_meta({"context": CONTEXT})
    store(archive, ZEROS, POOL, [(20, True)] * 12, table="evaluations")
    store(archive, BEST, POOL, [(8, True)] * 11 + [(8, False)], table="evaluations")
    store(archive, ZEROS, HELD, BASELINE_HELD)
    store(archive, BEST, HELD, BEST_HELD)
    yield archive
    archive.close()


def test_claims_pair_the_archives_answers_per_question_as_scipy_does(hand_built):
    claims = Claims(hand_built, POOL, HELD)
    held = claims.paired(Arm(ZEROS), Arm(BEST), HELDOUT)
    assert held is not None and held.questions == 30
    # Known verdicts: the baseline alone right on h0, h1, h2; the best alone on none; both wrong on h29.
    assert (held.only_reference, held.only_other) == (3, 0)
    assert held.p_value == stats.binomtest(0, 3, 0.5).pvalue
    assert (held.low, held.high) == newcombe_paired(26, 0, 3, 1)
    tokens = (np.array([t for t, _ in BASELINE_HELD], float), np.array([t for t, _ in BEST_HELD], float))
    direct = stats.bootstrap(tokens, lambda a, b, axis=-1: np.mean(b - a, axis=axis), paired=True, vectorized=True,
                             n_resamples=RESAMPLES, rng=np.random.default_rng(SEED))
    assert (held.tokens_low, held.tokens_high) == (direct.confidence_interval.low, direct.confidence_interval.high)
    assert Claims(hand_built, POOL, HELD).paired(Arm(ZEROS), Arm(BEST), HELDOUT) == held  # the same on every run
    training = claims.paired(Arm(ZEROS), Arm(BEST), TRAINING)
    assert training is not None and (training.questions, training.only_reference) == (12, 1)
    assert claims.paired(Arm(ZEROS), Arm(genome_key([9.0, 9.0])), HELDOUT) is None  # never answered


def test_an_arm_against_itself_claims_no_difference_and_no_doubt(hand_built):
    same = Claims(hand_built, POOL, HELD).paired(Arm(ZEROS), Arm(ZEROS), HELDOUT)
    assert same is not None and (same.difference, same.low, same.high, same.drop_bound) == (0, 0, 0, 0)


def test_a_cap_arm_is_the_answers_within_it_and_the_cut_ones_beyond(hand_built):
    hand_built.check_answers.store({(ZEROS, example_key(ex)): Answer("cut", 32, False, "") for ex in HELD},
                                   cap_context(CONTEXT, 32), 0)
    outcomes = Claims(hand_built, POOL, HELD).outcomes(Arm(ZEROS, cap=32), HELDOUT)
    # Baseline answers of 30..34 tokens: those of 33 and 34 were cut, the others stand.
    assert [a.answer for a in outcomes] == ["cut" if t > 32 else f"answer {t}" for t, _ in BASELINE_HELD]


def test_an_instruction_arm_reads_the_instructed_prompts_answers(hand_built):
    asked = instructed(HELD, "Answer with the figure only.")
    assert asked[0].id == "h0+instruction" and asked[0].prompt.endswith("\n\nAnswer with the figure only.")
    CheckStore(hand_built).store({(ZEROS, example_key(ex)): Answer("1", 2, True, "") for ex in asked}, CONTEXT, 0)
    p = Claims(hand_built, POOL, HELD).paired(Arm(ZEROS), Arm(ZEROS, instruction="Answer with the figure only."),
                                              HELDOUT)
    assert p is not None and p.questions == 30 and p.tokens == 2 and p.only_other == 1  # h29 fixed

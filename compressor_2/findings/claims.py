"""The run's claims with their confidence: two ways of answering (an arm: a genome, that
genome's answers cut at a token cap, or the genome with an instruction added to every
prompt, or taken off the prompts of a run that carries it) on the same questions of a
split, their answers read from the archive (the search's and the checks') and paired per
question (compressor_2/findings/confidence.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from compressor_2.archive import Answer, CheckStore, RunArchive
from compressor_2.config import Config
from compressor_2.data import Example, instructed, uninstructed
from compressor_2.fitness import example_key
from compressor_2.findings.confidence import LEVEL, Paired, compare, identical

TRAINING, HELDOUT = "training", "heldout"


@dataclass(frozen=True)
class Arm:
    genome: str  # genome_key of the deltas
    cap: int | None = None  # the answers cut at this many tokens (and judged again)
    instruction: str = ""  # added to every prompt
    without: str = ""  # taken off every prompt (CONFIG_INSTRUCTION_IN_SEARCH: the run's prompts carry it)


def cap_context(context: str, cap: int) -> str:
    """Where the answers cut at `cap` tokens are kept: beside the run's own answer context."""
    return f"{context}:cap{cap}"


class Claims:
    """Arms paired on the training pool or the held-out questions, at one confidence level.
    Each genome's answers are read once, and each pairing is computed once: one output asks
    for the same pairing several times, and its bootstrap is the costly part."""

    def __init__(self, archive: RunArchive, pool: Sequence[Example], heldout: Sequence[Example],
                 level: float = LEVEL) -> None:
        self.archive = archive
        self._store = CheckStore(archive)
        self.context = archive.meta("context", "") or ""
        self.examples = {TRAINING: tuple(pool), HELDOUT: tuple(heldout)}
        self.level = level
        self._read: dict[tuple[str, str], dict[str, Answer]] = {}
        self._paired: dict[tuple[Arm, Arm, str], Paired | None] = {}

    @classmethod
    def of_config(cls, config: Config, archive: RunArchive, level: float = LEVEL) -> Claims:
        """The run's claims, on its training pool and held-out questions as the config names them."""
        from compressor_2.data import examples_from_config, holdout_examples

        pool = examples_from_config(config)
        return cls(archive, pool, holdout_examples(config, pool), level)

    def answers(self, genome: str, context: str | None = None) -> dict[str, Answer]:
        """Every answer of `genome` the checks see under `context` (the run's own by default),
        by example key."""
        context = self.context if context is None else context
        if (genome, context) not in self._read:
            self._read[genome, context] = self._store.answers_for(genome, context)
        return self._read[genome, context]

    def outcomes(self, arm: Arm, split: str) -> list[Answer | None]:
        """The arm's answer to each question of `split`, in order (None: not answered)."""
        examples = self.examples[split]
        if arm.instruction:
            examples = instructed(examples, arm.instruction)
        if arm.without:
            examples = uninstructed(examples, arm.without)
        answers = self.answers(arm.genome)
        found = [answers.get(example_key(ex)) for ex in examples]
        if arm.cap is None:
            return found
        # An answer within the cap is the capped answer too; only longer ones were cut.
        cut = self.answers(arm.genome, cap_context(self.context, arm.cap))
        return [a if a is None or a.tokens <= arm.cap else cut.get(example_key(ex)) for ex, a in zip(examples, found)]

    def lost(self, arm: Arm, split: str) -> bool:
        """Whether answers the run made for `arm` on `split` are gone from the archive (rows
        of its answer tables deleted): a genome's or an instruction's, when none at all is
        left; a cap's, when an answer longer than the cap has no cut. Asked only of arms the
        archive records as measured on `split`: then each had all of these."""
        if not self.examples[split]:
            return False
        outcomes = self.outcomes(arm, split)
        if arm.cap is None:
            return all(o is None for o in outcomes)
        plain = self.outcomes(dataclasses.replace(arm, cap=None), split)
        return any(p is not None and p.tokens > arm.cap and o is None for p, o in zip(plain, outcomes))

    def paired(self, reference: Arm, other: Arm, split: str) -> Paired | None:
        """`other` against `reference` on the questions of `split` both answered; None if none."""
        key = (reference, other, split)
        if key not in self._paired:
            self._paired[key] = self._pair(reference, other, split)
        return self._paired[key]

    def _pair(self, reference: Arm, other: Arm, split: str) -> Paired | None:
        pairs = [(r, o) for r, o in zip(self.outcomes(reference, split), self.outcomes(other, split))
                 if r is not None and o is not None]
        if not pairs:
            return None
        if reference == other:
            return identical([(r.tokens, r.is_correct) for r, _ in pairs], self.level)
        return compare([(r.tokens, r.is_correct) for r, _ in pairs], [(o.tokens, o.is_correct) for _, o in pairs],
                       self.level)

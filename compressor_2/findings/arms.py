"""The six arms a run with an instruction (CONFIG_COMPARE_INSTRUCTION) ends with: the model as
it is, the evolved deltas, an EOS bias alone, the token cap, the instruction alone, and the
instruction with deltas. Each is paired against the model as it is (no deltas, no
instruction) on the same questions, and each other arm whose prompts carry the instruction
against the instruction alone as well: what the deltas add on top of it.

Which answers make an arm depends on the run's prompts. A plain run's baseline is the model
as it is; its instruction arms are the instruction added to its prompts, unsteered and with
its best deltas. A run whose prompts carry the instruction (CONFIG_INSTRUCTION_IN_SEARCH)
has the instruction alone as its baseline, the instruction plus deltas evolved on the
instructed prompt as its best, an EOS bias and a cap on the instructed prompt; its model as
it is, and its deltas alone, are its prompts with the instruction taken off.
"""

from __future__ import annotations

from dataclasses import dataclass

from compressor_2.findings.claims import HELDOUT, Arm, Claims
from compressor_2.findings.confidence import Paired, ci, correctness_claim, points_claim, tokens_change, tokens_claim
from compressor_2.findings.simpler import ToolsRecord, shown_split

UNSTEERED, INSTRUCTION = "unsteered", "instruction"  # the two references' keys


@dataclass(frozen=True)
class ArmSpec:
    key: str  # unsteered, deltas, eos, cap, instruction, instruction_deltas
    name: str  # as a line names it
    arm: Arm
    instructed: bool  # its prompts carry the instruction


@dataclass(frozen=True)
class ArmResult:
    spec: ArmSpec
    against_unsteered: Paired | None  # None: not measured on the split
    against_instruction: Paired | None  # an instructed arm's, the instruction alone's excepted


def six_arms(record: ToolsRecord, zeros: str, best: str) -> tuple[ArmSpec, ...]:
    """The six arms, in the comparison's order, for the run `record` describes (its
    baseline's genome `zeros`, its best's `best`)."""
    i, eos = record.instruction, f"EOS bias alone ({record.eos_best[0]:+g})"
    cap = f"a cap at {record.cap} token{'s' * (record.cap != 1)}"
    if record.in_search:
        return (ArmSpec(UNSTEERED, "the model as it is (no instruction)", Arm(zeros, without=i), False),
                ArmSpec("deltas", "the deltas evolved with the instruction, without it", Arm(best, without=i), False),
                ArmSpec("eos", f"{eos} with the instruction", Arm(record.eos_genome), True),
                ArmSpec("cap", f"{cap} with the instruction", Arm(zeros, cap=record.cap), True),
                ArmSpec(INSTRUCTION, "the instruction alone", Arm(zeros), True),
                ArmSpec("instruction_deltas", "the instruction + the deltas evolved with it", Arm(best), True))
    return (ArmSpec(UNSTEERED, "the model as it is", Arm(zeros), False),
            ArmSpec("deltas", "the evolved deltas", Arm(best), False),
            ArmSpec("eos", eos, Arm(record.eos_genome), False),
            ArmSpec("cap", cap, Arm(zeros, cap=record.cap), False),
            ArmSpec(INSTRUCTION, "the instruction alone", Arm(zeros, instruction=i), True),
            ArmSpec("instruction_deltas", "the instruction + the deltas evolved without it",
                    Arm(best, instruction=i), True))


def arm_results(claims: Claims, record: ToolsRecord, zeros: str, best: str) -> tuple[str, list[ArmResult]]:
    """The split the comparison speaks of (held out once the best was checked there), and
    each arm paired there against the references; no arm without an instruction."""
    split = shown_split(claims, zeros, best)
    if not record.instruction:
        return split, []
    specs = six_arms(record, zeros, best)
    [unsteered] = [s.arm for s in specs if s.key == UNSTEERED]
    [instruction] = [s.arm for s in specs if s.key == INSTRUCTION]
    return split, [ArmResult(s, claims.paired(unsteered, s.arm, split),
                             claims.paired(instruction, s.arm, split) if s.instructed and s.key != INSTRUCTION
                             else None)
                   for s in specs]


def arms_lines(claims: Claims, record: ToolsRecord, zeros: str, best: str) -> list[str]:
    """The run's lines of the six arms (none without an instruction): a heading, then one
    line an arm, its change against the model as it is, and against the instruction alone
    where its prompts carry it."""
    split, results = arm_results(claims, record, zeros, best)
    reference = results[0].against_unsteered if results else None
    if reference is None:
        return []
    where = "held out" if split == HELDOUT else "on the training pool"
    lines = [f"six arms {where} ({reference.questions} questions), each paired against the model as it is "
             f"({ci(claims.level)}s, exact McNemar p):"]
    for result in results:
        lines.append(f"  {result.spec.name}: {_claim(result)}")
    return lines


def _claim(result: ArmResult) -> str:
    p, q = result.against_unsteered, result.against_instruction
    if p is None:
        return "not measured"
    if result.spec.key == UNSTEERED:
        return f"{p.tokens:.1f} tokens, {100 * p.correctness:.1f}% correct"
    text = f"{tokens_claim(p)}, {correctness_claim(p)}"
    return text if q is None else f"{text}; against the instruction alone: {tokens_change(q)}, {points_claim(q)}"


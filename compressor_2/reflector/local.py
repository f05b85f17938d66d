"""The offline proposer: reads the individual's own answers, moves the target cluster's
delta by a step that adapts along the lineage, and says why in the scratchpad.

What it looks at, per answer: the share of the target cluster among the answer's
tokens (retokenised with the model's tokenizer and mapped through the cluster map),
whether the judge found it correct, and how long it is relative to its gold answer.

- Cluster "0" (EOS/EOT) is the length knob. Raising it ends answers sooner, which is
  right until answers start losing information: when an incorrect answer is shorter
  than its gold answer ("cut short"), it goes down, otherwise up.
- Any other cluster: when its last move in this lineage paid off it keeps going the
  same way, when it did not it turns round; without that memory it goes up when its
  tokens are denser in correct and compact answers than in incorrect and padded ones,
  down otherwise.
- The step (starting at CONFIG_LOCAL_REFLECTOR_STEP) grows by half after a move that
  paid off and halves after one that did not, read back from the scratchpad notes, so
  each lineage settles near the value that works for it.

With answer phases (CONFIG_DELTA_PHASES > 1) the target is a (phase, cluster) pair, its id
"phase:cluster": the rules above read the cluster (EOS in every phase is a length knob),
the lineage's memory is kept per pair, so two phases of one cluster learn apart.

With the stop oracle's evidence (CONFIG_REFLECTOR_PADDING_EVIDENCE, reflector/evidence.py: where
each answer could have stopped, the padding after it by phase and cluster, the gold figures an
incorrect answer lacks), it is read first:

- EOS in phase p goes down when an incorrect answer ended in phase p with fewer figures than
  the gold, else up when answers could have stopped in phase p (their first padding token was
  chosen there); when neither happened there, the rule above decides.
- Any other (phase, cluster) pair, without a note of its lineage on it, goes down when it
  carries a larger share of all the padding than of the tokens the answers keep; otherwise the
  rules above decide. In full-vector mode a pair that carries padding outranks any share
  difference.
- A cluster whose tokens write a gold figure an incorrect answer lacks (numbers, mostly) is
  never lowered, in any phase: the move turns up.

Full-vector mode (CONFIG_MUTATION_SCOPE="vector") applies the same rule to EOS (in every
phase) and the two other clusters with the strongest evidence at once, and returns its
notes as the summary the driver appends to the scratchpad. As the selector (CONFIG_SELECTION="llm")
it picks the fittest member (performance), the one farthest from it in delta space
among the better half (diversity), and the largest gain over its parent or else the
most correct among the longer answers (potential).

Every proposal is a pure function of the request and CONFIG_SEED (the jitter comes from
an RNG seeded per call), so concurrent calls and resumed runs propose the same values.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compressor_2.clusters.tokens import AnswerTokens
from compressor_2.deltas import clamp, phase_count, split_gene
from compressor_2.reflector.base import (
    MergeRequest, Message, MutationRequest, Reply, SelectionRequest, Usage, VectorRequest,
)
from compressor_2.reflector.evidence import Evidence, Reading

EOS_CLUSTER = "0"
MAX_NOTES = 40  # a lineage's scratchpad keeps its most recent notes
GROW, SHRINK = 1.5, 0.5
STEP_RANGE = (1 / 16, 8.0)  # the step stays within these multiples of the initial step
JITTER = (0.8, 1.25)
VECTOR_MOVES = 3  # clusters a full-vector proposal moves: EOS and the two with the strongest evidence
MEMORY_STRENGTH = 3.0  # a lineage's note on a move outweighs any share difference (those sum to at most 2)
# A pair that carries more of the padding than of the kept tokens outweighs any share difference, not a
# lineage's note.
PADDING_STRENGTH = 2.0
SHOWN_TOKENS = 4  # the stop tokens a note names

_GENE = r"(\d+(?::\d+)?)"  # a cluster id, or with answer phases "phase:cluster"
_MOVE = re.compile(rf"^g(\d+): moved cluster {_GENE} (up|down) from \S+ to \S+ \(step ([0-9.]+)\)"
                   r".*before: fitness (-?[0-9.]+)")
_OUTCOME = re.compile(rf"^g(\d+): moving cluster {_GENE} (up|down) (paid off|did not pay off|made no difference)")


@dataclass(frozen=True)
class Move:
    generation: int
    cluster: str
    direction: int  # +1 up, -1 down
    step: float
    fitness_before: float


@dataclass(frozen=True)
class MoveOutcome:
    generation: int
    cluster: str
    direction: int
    effect: str  # what the move did to the fitness, as the note says it


def is_eos(gene: str) -> bool:
    """Whether a genome id is the EOS cluster's (in whichever answer phase)."""
    return split_gene(gene)[1] == EOS_CLUSTER


def note_generation(line: str) -> int:
    match = re.match(r"^g(\d+):", line)
    return int(match.group(1)) if match else -1


def _latest(items: Sequence[Any]) -> Any:
    """The note of the highest generation; on a tie the first, i.e. the fitter parent's."""
    return max(items, key=lambda item: item.generation, default=None)


def parse_moves(lines: Sequence[str]) -> list[Move]:
    moves = []
    for line in lines:
        if m := _MOVE.match(line):
            moves.append(Move(int(m.group(1)), m.group(2), 1 if m.group(3) == "up" else -1,
                              float(m.group(4)), float(m.group(5))))
    return moves


def parse_outcomes(lines: Sequence[str]) -> list[MoveOutcome]:
    outcomes = []
    for line in lines:
        if m := _OUTCOME.match(line):
            outcomes.append(MoveOutcome(int(m.group(1)), m.group(2), 1 if m.group(3) == "up" else -1,
                                    m.group(4)))
    return outcomes


def scratchpad_lines(scratchpad: str) -> list[str]:
    return [line.strip() for line in scratchpad.splitlines() if line.strip()]


def keep_recent(lines: list[str], limit: int = MAX_NOTES) -> list[str]:
    """Drops the oldest notes (lowest generation) beyond `limit`, keeping the order."""
    if len(lines) <= limit:
        return lines
    ranked = sorted(range(len(lines)), key=lambda i: (-note_generation(lines[i]), i))
    kept = set(ranked[:limit])
    return [line for i, line in enumerate(lines) if i in kept]


def merge_scratchpads(first: str, second: str) -> str:
    """`first` (the fitter parent's) notes, then the other's not already there."""
    lines = list(dict.fromkeys(scratchpad_lines(first) + scratchpad_lines(second)))
    return "\n".join(keep_recent(lines))


def _percent(x: float) -> str:
    return f"{100 * x:.1f}%"


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else 0.0


class LocalProposer:
    name = "local"

    def __init__(self, tokens: AnswerTokens, initial_step: float, seed: int) -> None:
        self.tokens = tokens
        self.initial_step = initial_step
        self.seed = seed

    def close(self) -> None:
        """Holds nothing that needs releasing."""

    # -- merge -------------------------------------------------------------------------

    def merge(self, request: MergeRequest, messages: list[Message], attempt: int) -> Reply:
        del messages, attempt
        a_first = request.fitness_a >= request.fitness_b
        first, second = ((request.scratchpad_a, request.scratchpad_b) if a_first
                         else (request.scratchpad_b, request.scratchpad_a))
        return Reply(json.dumps({"scratchpad": merge_scratchpads(first, second)}), Usage(calls=1))

    # -- mutation ----------------------------------------------------------------------

    def mutation(self, request: MutationRequest, messages: list[Message], attempt: int) -> Reply:
        del messages
        lines = scratchpad_lines(request.scratchpad)
        notes: list[str] = []
        step = self.initial_step
        last_move = _latest(parse_moves(lines))
        if last_move is not None:
            step, note = self._judge_last_move(last_move, request)
            notes.append(note)
        memory = _latest([o for o in parse_outcomes(lines + notes) if o.cluster == request.target])

        direction, reason, _ = self._direction(request, memory, reading_of(request.evidence))
        rng = random.Random(f"{self.seed}/{request.generation}/{request.child}/{request.target}/{attempt}")
        current = request.deltas[request.target]
        new = self._next_value(current, direction, step * rng.uniform(*JITTER))
        if new == current:  # pinned at the limit: the only way to change is back
            direction, reason = -direction, "it is at the limit of the delta range"
            new = self._next_value(current, direction, step)
        mean_tokens = sum(r.tokens for r in request.records) / len(request.records)
        correct = sum(r.is_correct for r in request.records) / len(request.records)
        notes.append(
            f"g{request.generation}: moved cluster {request.target} {'up' if direction > 0 else 'down'} "
            f"from {current:.4f} to {new:.4f} (step {step:.4f}) because {reason}; "
            f"before: fitness {request.fitness:.4f}, {mean_tokens:.1f} tokens, {_percent(correct)} correct."
        )
        scratchpad = "\n".join(keep_recent(lines + notes))
        return Reply(json.dumps({"delta": new, "scratchpad": scratchpad}), Usage(calls=1))

    # -- full-vector mutation ------------------------------------------------------------

    def vector_mutation(self, request: VectorRequest, messages: list[Message], attempt: int) -> Reply:
        """Moves EOS (in every phase) and the VECTOR_MOVES - 1 clusters with the strongest evidence at once,
        each the way the single-cluster rule would, and returns the notes as the summary the
        driver appends to the scratchpad."""
        del messages
        lines = scratchpad_lines(request.scratchpad)
        notes: list[str] = []
        step = self.initial_step
        moves = parse_moves(lines)
        if moves:
            latest = max(m.generation for m in moves)
            judged = [self._judge_last_move(m, request) for m in moves if m.generation == latest]
            step = judged[0][0]
            notes += [note for _, note in judged]
        outcomes = parse_outcomes(lines + notes)
        reading = reading_of(request.evidence)
        evidence = []
        for cid in request.deltas:
            single = MutationRequest(request.generation, request.child, cid, request.deltas, request.scratchpad,
                                     request.fitness, request.records)
            direction, reason, strength = self._direction(single, _latest([o for o in outcomes if o.cluster == cid]),
                                                          reading)
            evidence.append((cid, direction, reason, strength))
        ranked = sorted(evidence, key=lambda e: (not is_eos(e[0]), -e[3]))  # stable: cluster order on ties
        moved = VECTOR_MOVES + max(sum(map(is_eos, request.deltas)) - 1, 0)  # EOS of every other phase too
        rng = random.Random(f"{self.seed}/{request.generation}/{request.child}/vector/{attempt}")
        deltas = dict(request.deltas)
        mean_tokens = sum(r.tokens for r in request.records) / len(request.records)
        correct = sum(r.is_correct for r in request.records) / len(request.records)
        for cid, direction, reason, _ in ranked[:moved]:
            current = deltas[cid]
            new = self._next_value(current, direction, step * rng.uniform(*JITTER))
            if new == current:
                direction, reason = -direction, "it is at the limit of the delta range"
                new = self._next_value(current, direction, step)
            deltas[cid] = new
            notes.append(
                f"g{request.generation}: moved cluster {cid} {'up' if direction > 0 else 'down'} from "
                f"{current:.4f} to {new:.4f} (step {step:.4f}) because {reason}; before: fitness "
                f"{request.fitness:.4f}, {mean_tokens:.1f} tokens, {_percent(correct)} correct.")
        return Reply(json.dumps({"deltas": deltas, "summary": "\n".join(notes)}), Usage(calls=1))

    # -- selection ----------------------------------------------------------------------

    def selection(self, request: SelectionRequest, messages: list[Message], attempt: int) -> Reply:
        """performance: the fittest; diversity: the farthest from it in delta space among the
        better half; potential: the largest gain over its parent, else the most correct
        among the longer answers. Ties go to the fitter, then the older candidate."""
        del messages, attempt
        ranked = sorted(request.members, key=lambda m: (-m.fitness, m.candidate_id))
        best = ranked[0]
        picks = [{"candidate_id": best.candidate_id, "category": "performance",
                  "reasoning": f"the fittest: fitness {best.fitness:.4f}, {best.mean_tokens:.1f} tokens, "
                               f"{_percent(best.correctness)} correct"}]
        half = [m for m in ranked[:max(2, math.ceil(len(ranked) / 2))] if m is not best]
        far = max(half, key=lambda m: _distance(m.deltas, best.deltas))  # max keeps the first (fitter) on ties
        picks.append({"candidate_id": far.candidate_id, "category": "diversity",
                      "reasoning": f"the farthest from candidate {best.candidate_id} in delta space among the better "
                                   f"half: distance {_distance(far.deltas, best.deltas):.4f} (fitness "
                                   f"{far.fitness:.4f}, {far.mean_tokens:.1f} tokens)"})
        rest = [m for m in ranked if m is not best and m is not far]
        gains = [m for m in rest if m.parent_fitness is not None and m.fitness > m.parent_fitness]
        if gains:
            up = max(gains, key=lambda m: m.fitness - (m.parent_fitness or 0.0))
            picks.append({"candidate_id": up.candidate_id, "category": "potential",
                          "reasoning": f"the largest gain over its parent: {up.parent_fitness:.4f} -> "
                                       f"{up.fitness:.4f} ({up.operator})"})
        elif rest:
            median = float(np.median([m.mean_tokens for m in rest]))
            longer = max((m for m in rest if m.mean_tokens >= median), key=lambda m: m.correctness)
            picks.append({"candidate_id": longer.candidate_id, "category": "potential",
                          "reasoning": f"the most correct among the longer answers: {_percent(longer.correctness)} "
                                       f"correct at {longer.mean_tokens:.1f} tokens, room to shorten"})
        summary = "; ".join(f"{p['category']} #{p['candidate_id']}" for p in picks)
        return Reply(json.dumps({"selections": picks, "summary": f"local selection: {summary}"}), Usage(calls=1))

    def _judge_last_move(self, move: Move, request: MutationRequest | VectorRequest) -> tuple[float, str]:
        """Did the lineage's last move pay off? Returns the adapted step and the note."""
        low, high = (self.initial_step * f for f in STEP_RANGE)
        before, now = move.fitness_before, round(request.fitness, 4)
        way = "up" if move.direction > 0 else "down"
        if now > before:
            step = min(move.step * GROW, high)
            effect = f"paid off (fitness {before:.4f} -> {now:.4f}), so the step grows to {step:.4f}"
        elif now < before:
            step = max(move.step * SHRINK, low)
            effect = f"did not pay off (fitness {before:.4f} -> {now:.4f}), so the step shrinks to {step:.4f}"
            if not is_eos(move.cluster):  # EOS follows the cut-short evidence instead
                effect += f" and cluster {move.cluster} goes the other way next time"
        else:
            step = move.step
            effect = f"made no difference (fitness {now:.4f})"
        return step, f"g{request.generation}: moving cluster {move.cluster} {way} {effect}."

    def _direction(self, request: MutationRequest, memory: MoveOutcome | None,
                   reading: Reading | None = None) -> tuple[int, str, float]:
        """(direction, reason, strength of the evidence): EOS and a lineage's memory are the
        strongest, a probe of an unseen cluster the weakest. With the stop oracle's evidence
        (`reading`) it is read first: EOS by phase, the padding's pairs before the shares,
        and a cluster that writes missing gold figures is never lowered."""
        found = None
        if reading is not None:
            phased = phase_count(request.deltas) > 1
            if is_eos(request.target):
                found = eos_direction(request.target, reading, phased)
            elif memory is None or memory.effect == "made no difference":
                found = padding_direction(request.target, reading)
        direction, reason, strength = found or self._without_evidence(request, memory)
        needed = reading.needed[split_gene(request.target)[1]] if reading is not None else 0
        if direction < 0 and needed:
            return 1, (f"its tokens write gold figures that {needed} incorrect answer(s) lack, so it is not "
                       "lowered"), 0.0
        return direction, reason, strength

    def _without_evidence(self, request: MutationRequest, memory: MoveOutcome | None) -> tuple[int, str, float]:
        """The rules that read the answers alone (the module docstring)."""
        records = request.records
        correct = np.array([r.is_correct for r in records], dtype=bool)
        tokens = np.array([r.tokens for r in records], dtype=float)
        gold = np.array([max(self.tokens.length(r.gold), 1) for r in records], dtype=float)
        if is_eos(request.target):
            cut_short = int(np.sum(~correct & (tokens < gold)))
            if cut_short:
                return -1, (f"{cut_short} incorrect answer(s) are shorter than their gold answer, "
                            "so answers seem to stop before giving all the information"), math.inf
            return 1, "no incorrect answer is shorter than its gold answer, so answers can end sooner", math.inf
        if memory is not None and memory.effect != "made no difference":
            way = "up" if memory.direction > 0 else "down"
            if memory.effect == "paid off":
                return memory.direction, f"moving it {way} paid off last time", MEMORY_STRENGTH
            return -memory.direction, f"moving it {way} did not pay off last time", MEMORY_STRENGTH

        k = int(split_gene(request.target)[1])
        histograms = [self.tokens.histogram(r.answer) for r in records]
        shares = np.array([h[k] / max(h.sum(), 1) for h in histograms])
        if not shares.any():
            return -1, "its tokens appear in no answer, so lowering it is a harmless probe", 0.0
        padding = tokens / gold
        padded = padding > np.median(padding)
        in_padded, in_compact = _mean(shares[padded]), _mean(shares[~padded])
        in_correct, in_incorrect = _mean(shares[correct]), _mean(shares[~correct])
        # Evidence only counts when both groups exist.
        length_signal = (in_compact - in_padded) if padded.any() and (~padded).any() else 0.0
        correct_signal = (in_correct - in_incorrect) if correct.any() and (~correct).any() else 0.0
        seen = (f"its tokens are {_percent(in_padded)} of padded answers vs {_percent(in_compact)} of "
                f"compact ones and {_percent(in_correct)} of correct vs {_percent(in_incorrect)} of "
                "incorrect ones")
        signal = length_signal + correct_signal
        return (1 if signal > 0 else -1), seen, abs(signal)

    def _next_value(self, current: float, direction: int, step: float) -> float:
        return round(clamp(current + direction * step), 4)


def reading_of(evidence: Evidence | None) -> Reading | None:
    return Reading.of(evidence) if evidence is not None else None


def eos_direction(target: str, reading: Reading, phased: bool) -> tuple[int, str, float] | None:
    """EOS in the target's phase: down when an incorrect answer ended there with fewer figures
    than the gold (one answer cut short costs more than a few tokens), else up when answers
    could have stopped there; None when neither happened in that phase."""
    phase = split_gene(target)[0]
    stops, short = reading.stops[phase], reading.cut_short[phase]
    where = f" in phase {phase}" if phased else ""
    if short:
        return -1, (f"{short} incorrect answer(s) ended{where} with fewer figures than the gold "
                    f"({stops} could have stopped there)"), math.inf
    if stops:
        seen = ", ".join(list(dict.fromkeys(reading.stop_tokens[phase]))[:SHOWN_TOKENS])
        return 1, (f"{stops} answer(s) could have stopped{where} (where they generated {seen}) and no incorrect one "
                   "ended there with fewer figures than the gold"), math.inf
    return None


def padding_direction(target: str, reading: Reading) -> tuple[int, str, float] | None:
    """A (phase, cluster) pair down when it carries a larger share of the padding (the tokens
    after the points where answers could have stopped) than of the tokens answers keep; None
    otherwise: the evidence says nothing of a raise."""
    pad, kept = reading.share(target)
    if pad <= kept:
        return None
    return -1, (f"it carries {_percent(pad)} of the padding after the points where answers could have stopped and "
                f"{_percent(kept)} of the tokens they keep"), PADDING_STRENGTH + pad - kept


def _distance(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    return math.sqrt(sum((a[k] - b[k]) ** 2 for k in a))

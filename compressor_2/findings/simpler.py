"""The simpler tools a serving engineer tries first, measured in the same run after the
search, so that the run says whether the search earned its keep on this model
(CONFIG_COMPARE_SIMPLE, CONFIG_COMPARE_INSTRUCTION):

- EOS only: a bias on cluster 0 (the end-of-sequence tokens) alone, searched on the
  training pool by the run's fitness: the grid `EOS_GRID` at once, then Brent's bounded
  method (scipy's `minimize_scalar`: golden-section steps, parabolic where they pay) in
  the bracket of the grid's best; `EOS_EVALUATIONS` genomes at most. Its best goes to the
  held-out check.
- A token cap: the unsteered answers cut at N tokens and judged again, N chosen so that
  their mean tokens on the training pool match the best's. Nothing is generated: decoding
  is token by token, so the first N tokens of an answer are what a cap at N generates
  (greedy: the same tokens; sampling: the same distribution). The cut re-tokenises the
  answer's text.
- An instruction: the unsteered model with CONFIG_COMPARE_INSTRUCTION after every prompt,
  and the best's deltas with it on the held-out questions. With CONFIG_INSTRUCTION_IN_SEARCH
  every prompt of the run carries it already (data/financebench.py's `as_asked`): then the
  other side is measured, the unsteered model and the best's deltas without it.

They answer through the checks' evaluator, as the held-out check does (apart from the
search's budget and cache, cached for the next run). What they measured is recorded in the
archive's meta (`TOOLS_META`); every figure is read back from the answers, paired against
the baseline or the best (findings/claims.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scipy.optimize import minimize_scalar

from compressor_2.archive import Answer, CheckStore, RunArchive, genome_key
from compressor_2.clusters.tokens import AnswerTokens
from compressor_2.common import ConfigError, as_float
from compressor_2.config import Config
from compressor_2.data import Example, instructed, uninstructed
from compressor_2.deltas import split_gene
from compressor_2.fitness import Evaluator, evaluate_with_bar, example_key
from compressor_2.judges import JudgeItem
from compressor_2.findings.claims import HELDOUT, TRAINING, Arm, Claims, cap_context
from compressor_2.findings.confidence import Paired, ci, does_as_well

TOOLS_META = "simpler_tools"
EOS_GRID = (0.5, 1.0, 2.0, 3.0, 4.0, 6.0)  # EOS deltas tried at once; 0 is the baseline
EOS_TOP = 8.0  # the bracket's far end when the grid's last point is its best
EOS_REFINEMENTS = 6  # Brent's steps in the bracket
EOS_EVALUATIONS = len(EOS_GRID) + EOS_REFINEMENTS
EOS_DECIMALS = 2  # a bias is tried at this precision: what a user would type

Tried = tuple[float, float, float, float]  # an EOS delta and its (tokens, correctness, fitness) on the pool


def eos_search(assess: Callable[[Sequence[float]], Sequence[tuple[float, float, float]]]) -> list[Tried]:
    """Every EOS delta tried, in order: the grid (one call to `assess`), then Brent's bounded
    method between the grid's neighbours of its best (one call a step). `assess` gives each
    delta's (tokens, correctness, fitness); the search maximises the fitness."""
    tried = {x: r for x, r in zip(EOS_GRID, assess(EOS_GRID))}
    best = fittest([(x, *tried[x]) for x in EOS_GRID])[0]
    ends = (0.0, *EOS_GRID, EOS_TOP)
    at = ends.index(best)

    def loss(x: float) -> float:
        x = round(float(x), EOS_DECIMALS)
        if x not in tried:
            [tried[x]] = assess([x])
        return -tried[x][2]

    minimize_scalar(loss, bounds=(ends[at - 1], ends[at + 1]), method="bounded",
                    options={"maxiter": EOS_REFINEMENTS, "xatol": 10 ** -EOS_DECIMALS})
    return [(x, *r) for x, r in tried.items()]


def fittest(tried: Sequence[Tried]) -> Tried:
    """The fittest EOS delta tried; of equally fit ones, the smallest bias."""
    return max(tried, key=lambda t: (t[3], -t[0]))


def cap_for(tokens: Sequence[int], target: float) -> int:
    """The cap at which `tokens` cut short average nearest `target` (of two as near, the
    longer cap)."""
    def mean_at(n: int) -> float:
        return sum(min(t, n) for t in tokens) / len(tokens)

    return min(range(1, max(tokens, default=1) + 1), key=lambda n: (abs(mean_at(n) - target), -n))


# -- what was measured, in the archive ---------------------------------------------------------

@dataclass(frozen=True)
class ToolsRecord:
    eos: tuple[Tried, ...]  # every EOS delta tried, in order
    eos_genome: str  # the genome of the fittest
    cap: int  # tokens
    instruction: str  # "" when none was measured
    in_search: bool = False  # every prompt of the run carried the instruction: measured without it

    @property
    def eos_best(self) -> Tried:
        return fittest(self.eos)


def write_tools_record(archive: RunArchive, record: ToolsRecord) -> None:
    archive.set_meta({TOOLS_META: json.dumps({"eos": [list(t) for t in record.eos], "eos_genome": record.eos_genome,
                                              "cap": record.cap, "instruction": record.instruction,
                                              "in_search": record.in_search})})


def read_tools_record(archive: RunArchive) -> ToolsRecord | None:
    """What the simpler tools last measured, None before they ever ran; a row a hand edit
    broke is refused in one line."""
    stored = archive.meta(TOOLS_META)
    if stored is None:
        return None
    try:
        raw = json.loads(stored)
        eos = tuple(_tried(t) for t in raw["eos"])
        # A record written before CONFIG_INSTRUCTION_IN_SEARCH has no in_search: its run had none.
        record = ToolsRecord(eos, raw["eos_genome"], raw["cap"], raw["instruction"], raw.get("in_search", False))
        if (not eos or not isinstance(record.eos_genome, str) or type(record.cap) is not int or record.cap < 1
                or not isinstance(record.instruction, str) or not isinstance(record.in_search, bool)
                or (record.in_search and not record.instruction)):
            raise ValueError
    except (ValueError, TypeError, KeyError):
        raise ConfigError(f"'{archive.path}' table meta, row {TOOLS_META}: not what the simpler tools record; delete "
                          "that row, and the next evolve measures them again") from None
    return record


def _tried(raw: object) -> Tried:
    found = [as_float(v) for v in raw] if isinstance(raw, list) and len(raw) == 4 else []
    values = [v for v in found if v is not None]  # four only when every one is a finite number
    if len(values) != 4:
        raise ValueError
    x, tokens, correctness, fitness = values
    return x, tokens, correctness, fitness


# -- measuring them ------------------------------------------------------------------------

@dataclass(frozen=True)
class Simpler:
    """What CONFIG_COMPARE_* ask for, and what measuring it needs."""

    eos_indices: tuple[int, ...]  # cluster 0's places in a genome: one per answer phase
    instruction: str  # "": none
    tokens: AnswerTokens  # to cut answers at a cap
    in_search: bool = False  # the run's prompts carry the instruction (CONFIG_INSTRUCTION_IN_SEARCH)

    def other_side(self, examples: Sequence[Example]) -> tuple[Example, ...]:
        """`examples` (as the run asks them) on the instruction's other side: with it added,
        or taken off when the run's prompts carry it."""
        return (uninstructed if self.in_search else instructed)(examples, self.instruction)


def simpler_options(config: Config, genes: Sequence[str], tokens: AnswerTokens) -> Simpler | None:
    """What the config asks for, over the genome's ids `genes`; None with CONFIG_COMPARE_SIMPLE
    off. The EOS bias alone is the same bias in every answer phase."""
    if not config.compare_simple:
        return None
    eos = tuple(i for i, gene in enumerate(genes) if split_gene(gene)[1] == "0")
    return Simpler(eos, config.compare_instruction, tokens, config.instruction_in_search)


def other_side_examples(config: Config, examples: Sequence[Example]) -> tuple[Example, ...]:
    """The prompts the instruction tool adds to a run (none without one): `examples` with the
    instruction, or without it when the run's carry it. The engine checks them with the
    others before any work."""
    if not (config.compare_simple and config.compare_instruction):
        return ()
    return (uninstructed if config.instruction_in_search else instructed)(examples, config.compare_instruction)


class Measuring:
    """Measures genomes outside the search with `evaluator` (whose store must be the
    archive's `CheckStore`), on the pool and the held-out questions."""

    def __init__(self, evaluator: Evaluator, archive: RunArchive, pool: Sequence[Example],
                 heldout: Sequence[Example], n_clusters: int) -> None:
        self.evaluator = evaluator
        self.archive = archive
        self.pool = tuple(pool)
        self.heldout = tuple(heldout)
        self.zeros = [0.0] * n_clusters


class Tools(Measuring):
    """Measures the simpler tools with what measures the checks."""

    def __init__(self, checks: Measuring, options: Simpler) -> None:
        super().__init__(checks.evaluator, checks.archive, checks.pool, checks.heldout, len(checks.zeros))
        self.options = options
        self.store = CheckStore(self.archive)
        self.tried: list[Tried] = []

    def genome(self, eos_delta: float) -> list[float]:
        genome = list(self.zeros)
        for index in self.options.eos_indices:
            genome[index] = eos_delta
        return genome

    def search_eos(self) -> list[float]:
        """The EOS-only search on the pool; returns its fittest genome."""
        def assess(deltas: Sequence[float]) -> list[tuple[float, float, float]]:
            label = f"EOS bias alone: {len(deltas)} biases" if len(deltas) > 1 else f"EOS bias alone: {deltas[0]:+g}"
            evaluations = evaluate_with_bar(self.evaluator, [self.genome(x) for x in deltas], self.pool, label)
            return [(e.mean_tokens, e.correctness, e.fitness) for e in evaluations]

        self.tried = eos_search(assess)
        return self.genome(fittest(self.tried)[0])

    def finish(self, best_tokens: float, best: Sequence[float]) -> None:
        """The cap and the instruction's other side (unsteered on every question, and the
        `best` genome on the held-out ones, else on the pool), after the held-out check has
        answered with the baseline; then records what they measured."""
        cap = self.measure_cap(best_tokens)
        if self.options.instruction:
            side = "without the instruction" if self.options.in_search else "with the instruction"
            other = self.options.other_side
            evaluate_with_bar(self.evaluator, [self.zeros], other((*self.pool, *self.heldout)), f"unsteered, {side}")
            evaluate_with_bar(self.evaluator, [list(best)], other(self.heldout or self.pool), f"the best, {side}")
        fittest_genome = genome_key(self.genome(fittest(self.tried)[0]))
        write_tools_record(self.archive, ToolsRecord(tuple(self.tried), fittest_genome, cap, self.options.instruction,
                                                     self.options.in_search))

    def measure_cap(self, target: float) -> int:
        """Cuts the baseline's answers at the cap whose training mean matches `target`, and
        judges the cut ones again (from the cache where it can). Baseline answers the
        cache lost (rows deleted) are made again first: the cap is chosen on all of them."""
        zeros, context = genome_key(self.zeros), self.evaluator.context
        baseline = self.store.answers_for(zeros, context)
        if missing := [ex for ex in (*self.pool, *self.heldout) if example_key(ex) not in baseline]:
            evaluate_with_bar(self.evaluator, [self.zeros], missing, "unsteered baseline")
            baseline = self.store.answers_for(zeros, context)
        cap = cap_for([a.tokens for ex in self.pool if (a := baseline.get(example_key(ex)))], target)
        long = [(ex, a) for ex in (*self.pool, *self.heldout)
                if (a := baseline.get(example_key(ex))) is not None and a.tokens > cap]
        where = cap_context(context, cap)
        cached = self.store.cached([zeros], [example_key(ex) for ex, _ in long], where) if self.evaluator.reuse else {}
        todo = [(ex, a) for ex, a in long if (zeros, example_key(ex)) not in cached]
        texts = [self.cut(a.answer, cap) for _, a in todo]
        verdicts = self.evaluator.judge.judge([JudgeItem(ex.question, text, ex.gold)
                                               for (ex, _), text in zip(todo, texts)]) if todo else []
        fresh = {(zeros, example_key(ex)): Answer(text, cap, v.is_correct, v.reasoning)
                 for (ex, _), text, v in zip(todo, texts, verdicts)}
        if long:
            self.store.store(fresh, where, len(long) - len(todo))
        return cap

    def cut(self, text: str, cap: int) -> str:
        ids = self.options.tokens.ids(text)[:cap].tolist()
        return str(self.options.tokens.tokenizer.decode(ids, skip_special_tokens=True))


# -- reading them back ---------------------------------------------------------------------

@dataclass(frozen=True)
class Tool:
    name: str  # as a table row names it
    advice: str  # as "deploy that" names it
    arm: Arm


@dataclass(frozen=True)
class ToolRow:
    tool: Tool
    training: Paired | None  # against the baseline
    heldout: Paired | None
    against_best: Paired | None  # on the held-out questions when checked there, else on the pool


def tools(record: ToolsRecord, zeros: str) -> list[Tool]:
    delta = record.eos_best[0]
    found = [Tool(f"EOS bias alone ({delta:+g})", f"an EOS bias of {delta:+g}", Arm(record.eos_genome)),
             Tool(f"a cap at {_tokens(record.cap)}", f"a cap at {_tokens(record.cap)} (max_tokens)",
                  Arm(zeros, cap=record.cap))]
    if record.in_search:
        found.append(Tool("the model as it is (no instruction)", "the model as it is (no instruction, no deltas)",
                          Arm(zeros, without=record.instruction)))
    elif record.instruction:
        found.append(Tool("the instruction", f"the instruction {json.dumps(record.instruction)}",
                          Arm(zeros, instruction=record.instruction)))
    return found


def shown_split(claims: Claims, zeros: str, best: str) -> str:
    """The split the comparisons speak of: held out once the best was checked there."""
    return HELDOUT if claims.paired(Arm(zeros), Arm(best), HELDOUT) is not None else TRAINING


def tool_rows(claims: Claims, record: ToolsRecord, zeros: str, best: str) -> list[ToolRow]:
    split = shown_split(claims, zeros, best)
    return [ToolRow(t, claims.paired(Arm(zeros), t.arm, TRAINING), claims.paired(Arm(zeros), t.arm, HELDOUT),
                    claims.paired(Arm(best), t.arm, split))
            for t in tools(record, zeros)]


def simpler_advice(rows: Sequence[ToolRow], level: float) -> str:
    """Whether a simpler tool does as well as the evolved deltas, plainly."""
    matching = [row.tool for row in rows if row.against_best is not None and does_as_well(row.against_best)]
    if matching:
        return f"On this model {matching[0].advice} does as well: deploy that."
    return f"None does as well as the evolved deltas ({ci(level)}s, paired): the search earned its keep."


def simpler_line(claims: Claims, record: ToolsRecord, zeros: str, best: str) -> str | None:
    """The run's last line: the best and each simpler tool, tokens and correctness, and
    whether one does as well."""
    split = shown_split(claims, zeros, best)
    evolved = claims.paired(Arm(zeros), Arm(best), split)
    if evolved is None:
        return None
    parts = [f"the evolved deltas: {_at(evolved)}"]
    rows = tool_rows(claims, record, zeros, best)
    for row in rows:
        mine = row.heldout if split == HELDOUT else row.training
        parts.append(f"{row.tool.name}: {_at(mine) if mine is not None else 'not measured'}")
    where = "held out" if split == HELDOUT else "on the training pool"
    carried = ", every prompt of the run with the instruction" if record.in_search else ""
    return (f"simpler tools {where} ({evolved.questions} questions){carried}: " + "; ".join(parts)
            + f". {simpler_advice(rows, claims.level)}")


def _at(p: Paired) -> str:
    return f"{p.tokens:.1f} tokens at {100 * p.correctness:.1f}%"


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"

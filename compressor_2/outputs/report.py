"""report.html: one self-contained page that answers "what did I gain?" for a run.

It reads the run archive and the run directory only (a finished, interrupted or running
run of any strategy), so `evolve` refreshes it at the end of every step and the
`report` command writes it for any run. The page is rendered by Jinja2 from
`report.html.j2` with autoescaping on: answers are model output, and model output is
hostile. Images are inlined as data URIs, so the file needs no network and no folder.
"""

from __future__ import annotations

import base64
import datetime
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import jinja2

from compressor_2.archive import Answer, Candidate, RunArchive
from compressor_2.common import atomic_write_text
from compressor_2.data import Example
from compressor_2.fitness import example_key
from compressor_2.judges import gold_kind
from compressor_2.outputs.plots import FITNESS_PLOT, FRONT_PLOT, LENGTHS_PLOT
from compressor_2.outputs.tree import TREE_PLOT
from compressor_2.resume import IDENTITY_KEY, IN_SEARCH
from compressor_2.findings import (
    BASELINE_ID,
    HELDOUT,
    TRAINING,
    Arm,
    Claims,
    Standing,
    arm_results,
    ci,
    difference_in_words,
    does_as_well,
    p_text,
    read_tools_record,
    simpler_advice,
    standing,
    tool_rows,
)

REPORT_FILE = "report.html"
TEMPLATE = "report.html.j2"
# The step plots shown, in order, when the run directory has them; a strategy's own
# progress plot (`*_progress.png`) follows, and the tree comes last, full width.
FIGURES = ((FITNESS_PLOT, "Fitness by step"), (LENGTHS_PLOT, "Answer length by step"))
# Gold kinds the numeric judge reads by key terms, and how often it agrees with people on
# them (docs/judges.md, calibration on FinanceBench's human labels).
WEAK_GOLDS = {"prose": "81.5%", "figures_in_prose": "82.5%"}


def status(archive: RunArchive) -> str:
    """The run's state from its last start, stop, interruption or failure."""
    events = [e for e in archive.events() if e[0] in ("start", "stop", "interrupted", "failed")]
    if not events:
        return "never started"
    kind, detail, _ = events[-1]
    if kind == "stop":
        return f"stopped: {detail['reason']}"
    if kind == "failed":
        return f"failed: {detail['error']} (rerun evolve to resume)"
    if kind == "interrupted":
        return "interrupted (rerun evolve to resume)"
    return "running, or killed (no stop recorded since the last start; rerun evolve to resume)"


@dataclass(frozen=True)
class Side:
    """One genome's answer to one example."""

    text: str
    tokens: int
    correct: bool


@dataclass(frozen=True)
class Row:
    example: Example
    baseline: Side | None
    best: Side | None

    @property
    def broken(self) -> bool:
        """The steering broke it: the baseline was right and the best is wrong."""
        return self.baseline is not None and self.best is not None and self.baseline.correct and not self.best.correct

    @property
    def order(self) -> int:
        """Failures first: broken, both wrong, fixed by the steering, both right, unanswered."""
        if self.baseline is None or self.best is None:
            return 4
        return {(True, False): 0, (False, False): 1, (False, True): 2, (True, True): 3}[
            (self.baseline.correct, self.best.correct)]


def answer_rows(examples: Sequence[Example], baseline: Mapping[str, Answer], best: Mapping[str, Answer]) -> list[Row]:
    """One row per example, failures first (in example order within each kind)."""
    rows = [Row(ex, _side(baseline.get(example_key(ex))), _side(best.get(example_key(ex)))) for ex in examples]
    return sorted(rows, key=lambda r: r.order)


def _side(answer: Answer | None) -> Side | None:
    return None if answer is None else Side(answer.answer, answer.tokens, answer.is_correct)


def write_report(archive: RunArchive, out: Path, pool: Sequence[Example], heldout: Sequence[Example],
                 now: Standing | None = None) -> Path:
    """Renders the run in `out` (its archive open in `archive`; `now`, its standing, when
    the caller has just read it) to out/report.html."""
    path = out / REPORT_FILE
    atomic_write_text(path, render(archive, out, pool, heldout, now))
    return path


def render(archive: RunArchive, out: Path, pool: Sequence[Example], heldout: Sequence[Example],
           now: Standing | None = None) -> str:
    now = standing(archive) if now is None else now
    claims = Claims(archive, pool, heldout)
    best_genome = now.genome(now.best.id) if now.best is not None else None
    base_answers = claims.answers(now.zeros) if now.zeros is not None else {}
    best_answers = claims.answers(best_genome) if best_genome is not None else {}
    calls, prompt, completion = archive.reflector_tokens()
    check_fresh, check_cached = archive.check_calls()
    lineage: list[Candidate] = []
    if now.best is not None:
        lineage = [now.candidates[a] for a in archive.lineage().ancestors(now.best.id)] + [now.candidates[now.best.id]]
    zeros = Arm(now.zeros or "")
    best_arm = Arm(best_genome or "")
    record = read_tools_record(archive) if best_genome is not None and now.zeros is not None else None
    tools = tool_rows(claims, record, now.zeros or "", best_genome or "") if record is not None else []
    in_search = _recorded(archive, IN_SEARCH) not in ("", "n")  # the run's prompts carry the instruction
    arms_split, arms = ("", []) if record is None else arm_results(claims, record, now.zeros or "", best_genome or "")
    judge = scoring_judge(archive)
    return _template().render(
        run_dir=str(out), generated=datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"),
        strategy=archive.meta("strategy", "?"), status=status(archive),
        candidates=len(now.candidates), metric_calls=archive.metric_calls(), cache_hits=archive.cache_hits(),
        check_fresh=check_fresh, check_cached=check_cached,
        reflector_calls=calls, prompt_tokens=prompt, completion_tokens=completion,
        reflector_seconds=archive.reflector_seconds(),
        wall_minutes=archive.meta_count("wall_seconds") / 60,
        gain=now.gain, best=now.best, baseline=now.baseline,
        baseline_heldout=now.heldout.get(now.zeros or ""),
        best_heldout=now.heldout.get(best_genome or ""),
        heldout_size=len(heldout),
        front=[(p, held, claims.paired(zeros, Arm(now.genome(p.id)), HELDOUT if held else TRAINING))
               for p, held in now.front()],
        best_training=claims.paired(zeros, best_arm, TRAINING), best_claim=claims.paired(zeros, best_arm, HELDOUT),
        tools=tools, tools_advice=simpler_advice(tools, claims.level) if tools else "",
        arms=arms, arms_heldout=arms_split == HELDOUT, instruction_in_search=in_search,
        eos_tried=record.eos if record is not None else (), level=ci(claims.level), p_text=p_text, difference_in_words=difference_in_words,
        does_as_well=does_as_well,
        judge=judge, judge_warning=weak_gold_warning(judge, (*pool, *heldout)),
        front_image=_data_uri(out / FRONT_PLOT), figures=_figures(out), tree_image=_data_uri(out / TREE_PLOT),
        lineage=[_lineage_entry(c) for c in lineage],
        training_rows=answer_rows(pool, base_answers, best_answers),
        heldout_rows=answer_rows(heldout, base_answers, best_answers) if heldout else [],
        baseline_is_candidate=now.baseline is not None and now.baseline.id != BASELINE_ID,
    )


def scoring_judge(archive: RunArchive) -> str:
    """The judge the run was recorded with, as the config names it: numeric, llm (model)
    or hybrid (model)."""
    name, model = _recorded(archive, "CONFIG_JUDGE_*"), _recorded(archive, "CONFIG_JUDGE_MODEL")
    if not name:
        return "unknown (the run recorded no settings)"
    return f"{name} ({model})" if name != "numeric" and model else str(name)


def _recorded(archive: RunArchive, setting: str) -> str:
    """The value of `setting` in the run's recorded identity ("" when not recorded)."""
    try:
        identity = json.loads(archive.meta(IDENTITY_KEY) or "{}")
    except ValueError:
        identity = {}
    return str(identity.get(setting, "")) if isinstance(identity, dict) else ""


def weak_gold_warning(judge: str, examples: Sequence[Example]) -> str:
    """A warning when the numeric judge scored golds it reads only by key terms."""
    if judge != "numeric":
        return ""
    counts = {kind: sum(gold_kind(ex.gold) == kind for ex in examples) for kind in WEAK_GOLDS}
    if not any(counts.values()):
        return ""
    which = " and ".join(f"{n} {kind.replace('_', ' ')} golds (it agrees with people on {WEAK_GOLDS[kind]} of those)"
                         for kind, n in counts.items() if n)
    return (f"The numeric judge scored {which}, against 95.8% on bare figures: correctness there, and any loss or "
            "gain in it, is a rough proxy. Rerun with the hybrid or llm judge, and measure it on labelled data "
            "first (docs/judges.md).")


def _lineage_entry(c: Candidate) -> dict[str, object]:
    made = f"{c.operator} of {', '.join(f'#{p}' for p in c.parents)}" if c.parents else c.operator
    return {"id": c.id, "generation": c.generation, "made": made, "fitness": c.fitness, "tokens": c.mean_tokens,
            "correctness": c.correctness, "note": c.note}


@functools.cache
def _template() -> jinja2.Template:
    """Compiled once a process: evolve renders the page after every step."""
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent), autoescape=True,
                                     undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return environment.get_template(TEMPLATE)


def _figures(out: Path) -> list[tuple[str, str]]:
    """(title, data URI) of each step plot the run directory has."""
    named = [(out / name, title) for name, title in FIGURES]
    named += [(path, path.stem.replace("_", " ").capitalize()) for path in sorted(out.glob("*_progress.png"))]
    return [(title, uri) for path, title in named if (uri := _data_uri(path))]


def _data_uri(path: Path) -> str:
    """The PNG at `path` inlined, or '' when the run has not drawn it."""
    try:
        return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")
    except FileNotFoundError:
        return ""

"""`python -m compressor_2 show [CANDIDATE_ID] [--front]`: a run read from its archive, read only.

With --front: the tokens-versus-correctness front as a table, with the baseline, the
held-out results, each candidate's claims against the baseline with their confidence, and
the simpler tools. Without an id: the run summary (strategy, candidates, metric calls,
cache hits, reflector tokens, wall time, status and stop reason, best) and the best candidate's
lineage, one line per ancestor; for the archive strategy its viability rule, its fittest
members (each marked when not viable) and the feedback log. With an id: that candidate, its parents and children,
the generations that selected it (the GA's LLM selection) and why, the reflector
calls about it, and its answers on the training pool next to the
unsteered baseline's (the all-zero genome when the run or its checks evaluated it, else
the run's initial deltas).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compressor_2.archive import ARCHIVE_FILE, Answer, Candidate, CheckResult, CheckStore, RunArchive, genome_key
from compressor_2.common import ConfigError, as_float, shown
from compressor_2.config import Config
from compressor_2.deltas import by_phase
from compressor_2.fitness import example_key
from compressor_2.outputs import status
from compressor_2.strategies.archive import VIABILITY_META
from compressor_2.findings import (
    BASELINE_ID,
    HELDOUT,
    TRAINING,
    Arm,
    Claims,
    Measured,
    Standing,
    ci,
    correctness_claim,
    does_as_well,
    measured,
    points_claim,
    read_tools_record,
    refuse_emptied_heldout,
    refuse_lost,
    standing,
    tokens_change,
    tool_rows,
)

ANSWER_WIDTH = 100
SHOWN = 20  # archive members and feedback entries listed in the summary


def run_show(config: Config, candidate_id: int | None, front: bool = False) -> None:
    archive = RunArchive.open_read_only(config.output_dir / ARCHIVE_FILE)
    try:
        if front:
            print(front_table(archive, Claims.of_config(config, archive)))
        elif candidate_id is None:
            print(summary(archive) + front_and_merges(config, archive))
        else:
            print(candidate_report(config, archive, candidate_id))
    finally:
        archive.close()


def front_table(archive: RunArchive, claims: Claims) -> str:
    """The tokens-versus-correctness front on the training pool, shortest first, with the
    baseline and, once the held-out check ran, each one's held-out tokens and correctness;
    under each, its claims against the baseline (paired on the same questions); then the
    simpler tools, once measured."""
    now = standing(archive)
    refuse_lost(claims, measured(now, read_tools_record(archive)))
    refuse_emptied_heldout(archive, now)
    front = now.front()
    if not front:
        return "the front is empty: no candidate has been assessed yet"
    best, baseline = now.best, now.baseline
    lines = [f"the front on the training pool ({len(front)} of {len(now.points)} candidates: "
             "none has fewer tokens and is at least as correct), shortest first; under each, against the "
             f"unsteered baseline on the same questions ({ci(claims.level)}s, paired):",
             f"{'id':>7}  {'tokens':>7}  {'correct':>8}  {'fitness':>8}  {'held-out tokens':>15}  {'correct':>8}"]
    for p, held in front:
        mark = " (best)" if best is not None and p.id == best.id else ""
        lines.append(f"{'#' + str(p.id):>7}  {p.tokens:7.1f}  {100 * p.correctness:7.1f}%  {p.fitness:8.4f}  "
                     f"{_held(held)}{mark}")
        for split, label in ((TRAINING, "training"), (HELDOUT, "held out")):
            claim = claims.paired(Arm(now.zeros or ""), Arm(now.genome(p.id)), split)
            if claim is not None and now.genome(p.id) != now.zeros:
                lines.append(f"{'':9}{label}: {points_claim(claim)}; {tokens_change(claim)}")
    if baseline is not None:
        where = f"#{baseline.id}" if baseline.id != BASELINE_ID else "checked apart"
        held = now.heldout.get(now.zeros or "")
        lines.append(f"baseline ({where}): {baseline.tokens:.1f} tokens, {100 * baseline.correctness:.1f}% correct, "
                     f"fitness {baseline.fitness:.4f}" + (f"; held out {held.mean_tokens:.1f} tokens, "
                                                          f"{100 * held.correctness:.1f}% correct" if held else ""))
    return "\n".join(lines + simpler_lines(archive, claims, now))


def simpler_lines(archive: RunArchive, claims: Claims, now: Standing) -> list[str]:
    """The simpler tools against the baseline, and against the best; none before they ran."""
    record = read_tools_record(archive)
    if record is None or now.best is None or now.zeros is None:
        return []
    lines = ["", "the simpler tools, against the baseline (and the best) on the same questions:"]
    for row in tool_rows(claims, record, now.zeros, now.genome(now.best.id)):
        lines.append(f"  {row.tool.name}:")
        for label, claim in (("training", row.training), ("held out", row.heldout)):
            if claim is not None:
                lines.append(f"{'':4}{label}: {claim.tokens:.1f} tokens, {correctness_claim(claim)}")
        if row.against_best is not None:
            lines.append(f"{'':4}against the best: {'does as well' if does_as_well(row.against_best) else 'worse'}"
                         f" ({points_claim(row.against_best)}; {tokens_change(row.against_best)})")
    return lines


def _viability(archive: RunArchive) -> dict[str, float] | None:
    """The archive strategy's viability rule as it recorded it, None when it recorded none;
    a row a hand edit broke is refused in one line."""
    stored = archive.meta(VIABILITY_META)
    if stored is None:
        return None
    try:
        rule = json.loads(stored)
    except ValueError:
        rule = None
    keys = ("threshold", "min_correctness", "seed_correctness")
    if not isinstance(rule, dict) or any(as_float(rule.get(key)) is None for key in keys):
        raise ConfigError(f"'{archive.path}' table meta, row {VIABILITY_META}: not the viability rule (numbers "
                          f"{', '.join(keys)}); delete that row, and the next evolve records it again")
    return {key: float(rule[key]) for key in keys}


def _held(result: CheckResult | None) -> str:
    if result is None:
        return f"{'-':>15}  {'-':>8}"
    return f"{result.mean_tokens:15.1f}  {100 * result.correctness:7.1f}%"


def front_and_merges(config: Config, archive: RunArchive) -> str:
    """GEPA's Pareto front (pareto_front.json) and its merges; empty for other strategies."""
    lines = []
    front_path = config.output_dir / "pareto_front.json"
    if front_path.is_file():
        front = _front(front_path)
        lines += ["", f"Pareto front over {len(front)} valset examples (best score: candidates there):"]
        lines += [f"  {example}  {entry['score']:.4f}: {', '.join(f'#{c}' for c in entry['candidates'])}"
                  for example, entry in front.items()]
    merges = archive.merges()
    if merges:
        lines += ["", f"merges ({sum(m[5] for m in merges)} kept of {len(merges)} tested):"]
        lines += [f"  #{c}: #{a} + #{b} over ancestor #{anc}, components from "
                  f"{', '.join(f'#{s}' for s in sources)}: {'kept' if kept else 'rejected'}"
                  for c, a, b, anc, sources, kept in merges]
    return "\n".join(lines)


def _front(path: Path) -> dict[str, dict[str, Any]]:
    """pareto_front.json, written for other tools and read here only: {example: {score,
    candidates}}; a hand-edited one is refused, naming the entry."""
    try:
        front = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"'{path}' cannot be read ({exc}); the next GEPA iteration writes it again") from None
    if not isinstance(front, dict):
        raise ConfigError(f"'{path}' holds {shown(front)}, not an object {{example: {{score, candidates}}}}")
    for example, entry in front.items():
        if (not isinstance(entry, dict) or as_float(entry.get("score")) is None
                or not isinstance(entry.get("candidates"), list)
                or not all(type(c) is int for c in entry["candidates"])):
            raise ConfigError(f"'{path}': {example} is {shown(entry)}, not {{\"score\": a number, \"candidates\": "
                              "[ids]}; the next GEPA iteration writes it again")
    return front


def describe(c: Candidate) -> str:
    made = f"{c.operator} of {', '.join(f'#{p}' for p in c.parents)}" if c.parents else c.operator
    assessed = (f"fitness {c.fitness:.4f}  {c.mean_tokens:.1f} tokens  {100 * (c.correctness or 0):.1f}% correct"
                if c.fitness is not None else "not assessed on the whole pool")
    rejected = "  (rejected)" if c.status != "evaluated" else ""
    return f"#{c.id:<5} gen {c.generation:<3} {made:<24} {assessed}{rejected}"


def summary(archive: RunArchive) -> str:
    candidates = archive.candidates()
    rejected = sum(c.status != "evaluated" for c in candidates)
    calls, prompt, completion = archive.reflector_tokens()
    minutes = archive.meta_count("wall_seconds") / 60
    lines = [
        f"run           {archive.path.parent}",
        f"strategy      {archive.meta('strategy', '?')}",
        f"status        {status(archive)}",
        f"candidates    {len(candidates)} ({len(candidates) - rejected} kept, {rejected} rejected)",
        f"metric calls  {archive.metric_calls()} fresh answers; {archive.cache_hits()} served from the cache",
        f"reflector     {calls} calls, {prompt} prompt + {completion} completion tokens",
        f"wall time     {minutes:.1f} min",
    ]
    best = archive.best()
    if best is None:
        return "\n".join([*lines, "best          (nothing assessed yet)"])
    assert best.id is not None
    by_id = {c.id: c for c in candidates}
    ancestry = [by_id[a] for a in archive.lineage().ancestors(best.id)] + [best]
    lines += [f"best          {describe(best)}", "",
              f"lineage of #{best.id}, oldest first ({len(ancestry)} candidates):"]
    lines += [f"  {describe(c)}" for c in ancestry]
    feedback = archive.feedback()
    if feedback:
        kept = sorted((c for c in candidates if c.status == "evaluated" and c.fitness is not None),
                      key=lambda c: (-(c.fitness or 0.0), c.id))
        rule = _viability(archive)
        threshold = rule["threshold"] if rule else 0.0
        if rule:
            viable = sum((c.correctness or 0.0) >= threshold for c in kept)
            lines += ["", f"viability: correctness >= {100 * threshold:.1f}% ({rule['min_correctness']:g} x the "
                          f"seed candidate's {100 * rule['seed_correctness']:.1f}%); {viable} of {len(kept)} "
                          "members viable, only they can become parents"]
        lines += ["", f"archive members, fittest first ({min(len(kept), SHOWN)} of {len(kept)}):"]
        lines += [f"  {describe(c)}{'' if (c.correctness or 0.0) >= threshold else '  (not viable)'}"
                  for c in kept[:SHOWN]]
        lines += ["", f"feedback log, latest last ({min(len(feedback), SHOWN)} of {len(feedback)}):"]
        lines += [f"  #{c} from #{p} by {g} (iteration {t}): {change} -> {outcome}"
                  for c, p, t, g, change, outcome in feedback[-SHOWN:]]
    return "\n".join(lines)


def candidate_report(config: Config, archive: RunArchive, cid: int) -> str:
    candidate = archive.candidate(cid)
    if candidate is None:
        raise ConfigError(f"candidate {cid} is not in '{archive.path}' "
                          f"(it holds ids 1..{archive.last_candidate_id()})")
    lineage = archive.lineage()
    lines = [describe(candidate), f"strategy {candidate.strategy}, made {_when(candidate.created)}"]
    if candidate.note:
        lines.append(f"rejected: {candidate.note}")
    lines += [f"{g} proposal: {change} -> {outcome}" for c, _, _, g, change, outcome in archive.feedback()
              if c == cid]
    lines.append("")
    lines += ["parents:"] + [f"  {describe(p)}" for p in _lookup(archive, candidate.parents)] or ["  (none)"]
    children = lineage.children(cid)
    lines += [f"children: {len(children)}" + (f" ({', '.join(f'#{c}' for c in children)})" if children else "")]
    lines += ["", *deltas_lines(candidate.deltas)]
    lines += ["scratchpad:", textwrap.indent(candidate.scratchpad.strip() or "(empty)", "  ")]
    chosen = [(g, category, reasoning) for g, c, category, reasoning in archive.selections() if c == cid]
    if chosen:
        lines += ["", "selected as a parent:"]
        lines += [f"  gen {g} ({category}): {reasoning}" for g, category, reasoning in chosen]
    calls = archive.calls_about(cid)
    if calls:
        lines += ["", "reflector calls about it:"] + [
            f"  {c.kind} attempt {c.attempt}: {c.outcome} ({c.prompt_tokens}+{c.completion_tokens} tokens, "
            f"{c.latency:.2f}s)" for c in calls]
    lines += ["", *answers_side_by_side(config, archive, candidate)]
    return "\n".join(lines)


def deltas_lines(deltas: Mapping[str, float]) -> list[str]:
    """A genome's deltas by cluster id: one line, or one per answer phase."""
    maps = by_phase(deltas)
    if len(maps) == 1:
        return ["deltas: " + "  ".join(f"{k}:{v:+.3f}" for k, v in deltas.items())]
    return [f"deltas, phase {p}: " + "  ".join(f"{k}:{v:+.3f}" for k, v in m.items()) for p, m in enumerate(maps)]


def answers_side_by_side(config: Config, archive: RunArchive, candidate: Candidate) -> list[str]:
    from compressor_2.data import examples_from_config

    context = archive.meta("context", "") or ""
    examples = examples_from_config(config)
    genome = genome_key(list(candidate.deltas.values()))
    zeros = genome_key([0.0] * len(candidate.deltas))
    # What it reads: the candidate's answers when it was assessed, and the baseline's.
    read = [m for m in measured(standing(archive), None) if m.split == TRAINING and m.arm.genome == zeros]
    if candidate.fitness is not None:
        read.append(Measured(Arm(genome), TRAINING, f"candidate #{candidate.id}"))
    refuse_lost(Claims.of_config(config, archive), read)
    # Its answers and the baseline's, the search's or the checks' (which make again what the
    # archive lost, and measure the baseline apart when no candidate is the all-zero genome).
    mine = CheckStore(archive).answers_for(genome, context)
    baseline = CheckStore(archive).answers_for(zeros, context)
    label = "unsteered"
    if not baseline:
        initial = next(iter(archive.initial()), None)
        if initial is not None:
            baseline = archive.answers_for(genome_key(list(initial.deltas.values())), context)
            label = "initial"
    lines = [f"answers on the training pool: #{candidate.id} vs {label}"
             + ("" if baseline else " (the run never evaluated the all-zero genome)")]
    for ex in examples:
        key = example_key(ex)
        lines.append(f"{ex.id}  gold: {_one_line(ex.gold)}")
        lines.append(f"  #{candidate.id:<9}{_answer(mine.get(key))}")
        lines.append(f"  {label:<10}{_answer(baseline.get(key))}")
    return lines


def _answer(answer: Answer | None) -> str:
    if answer is None:
        return "(not evaluated on this example)"
    mark = "correct  " if answer.is_correct else "WRONG    "
    return f"{mark}{answer.tokens:>4} tok  {_one_line(answer.answer)}"


def _one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= ANSWER_WIDTH else flat[:ANSWER_WIDTH - 3] + "..."


def _lookup(archive: RunArchive, ids: Sequence[int]) -> list[Candidate]:
    return [c for c in (archive.candidate(i) for i in ids) if c is not None]


def _when(timestamp: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")

"""Numeric search without a reflector: the loop the "random" and "cmaes" strategies share.

A sampler proposes a batch of delta vectors; step t, top to bottom:
  1. ask the sampler for a batch;
  2. evaluate the whole batch in one engine call;
  3. archive every vector as a candidate (its parents: the vectors that shaped the
     sampler's batch), and keep the best ever;
  4. tell the sampler the batch's fitness;
  5. write the history, the state and the plots.
Step -1 evaluates the initial deltas, so the best ever starts at the unsteered answers
as every strategy's does. The state (the step, the global RNGs the samplers draw from,
the sampler's own state, the best, the archive's newest candidate) is written after
every step; a rerun resumes it, replaying an interrupted step from the archive's answers.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence
from typing import Any, Protocol

from compressor_2.archive.database import Candidate
from compressor_2.atomic import atomic_write_json
from compressor_2.deltas import load_deltas, to_dict, to_list
from compressor_2.fitness import Evaluation
from compressor_2.run import fields
from compressor_2.run.history import HISTORY_FILE, load_history, save_history
from compressor_2.run.plots import FITNESS_PLOT, LENGTHS_PLOT, plot_fitness, plot_lengths
from compressor_2.run.progress import say
from compressor_2.run.services import Run, resume_command
from compressor_2.run.state import Member, capture_rng, held, held_list, load_strategy_state, restore_rng, seed_rng
from compressor_2.run.tree import TREE_FILE, TREE_PLOT, EvolutionTree, cand_id

SEED_STEP = -1


class Sampler(Protocol):
    """Proposes batches; draws only from the global `random` and numpy RNGs, which the
    state saves, so a resumed run proposes what an uninterrupted one would have."""

    def ask(self) -> list[list[float]]: ...

    def tell(self, batch: Sequence[Sequence[float]], fitness: Sequence[float]) -> list[int]:
        """Learns from the evaluated batch; returns the positions of the vectors that
        shape the next batch (its candidates' parents)."""
        ...

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None:
        """Takes up `state()`'s output; a field it cannot use raises FieldError naming it
        (`sampler.NAME`)."""
        ...


def search(run: Run, sampler: Sampler, name: str, steps: int, state_file: str, step_name: str) -> str:
    out = run.out

    def read(raw: dict[str, Any]) -> None:
        held_list(raw, "parents", run.archive, assessed=True)
        held(fields.value(raw, "best"), "best", run.archive, raw["last_candidate_id"], assessed=True)
        sampler.restore(fields.typed(raw, "sampler", dict, "an object"))

    saved = load_strategy_state(out / state_file, run.archive, read)
    start = saved["iteration"] if saved else 0
    history = load_history(out / HISTORY_FILE, before=start)
    if saved:
        run.archive.rollback(saved["last_candidate_id"], from_step=start)
        restore_rng(saved["rng"])
        parents = tuple(saved["parents"])
        best = run.archive.candidate(saved["best"])
        assert best is not None and best.id is not None
        run.best.member, run.best.fitness = Member(dict(best.deltas), "", best.id), best.fitness
        say(f"resuming at {step_name} {start} of {steps} from {out / state_file}")
    else:
        run.start_afresh(out / state_file, SEED_STEP)
        initial = load_deltas(run.config.initial_deltas_path, run.cluster_ids)
        [(_, seed)] = _assess(run, name, [to_list(initial)], (), SEED_STEP, "initial deltas")
        seed_rng(run.config.seed)
        parents = ()
        _save(run, state_file, 0, sampler, parents)
        say(f"{name}: {steps} {step_name}s on {len(run.examples)} training examples, seeded by the initial "
            f"deltas (fitness {seed.fitness:.4f})")
    for t in range(start, steps):
        if reason := run.stop_reason(proposer="the sampler"):
            return _stop(run, history, reason)
        try:
            batch = sampler.ask()                                                           # 1.
            assessed = _assess(run, name, batch, parents, t, f"{step_name} {t}")           # 2., 3.
            shaping = sampler.tell(batch, [e.fitness for _, e in assessed])                 # 4.
        except KeyboardInterrupt:
            print(f"\ninterrupted: {step_name} {t} starts again when you rerun the same command: "
                  f"{resume_command()}", file=sys.stderr)
            raise
        parents = tuple(assessed[i][0] for i in shaping)
        history[t:] = [_entry(run, t, [e for _, e in assessed])]                           # 5.
        save_history(out / HISTORY_FILE, history)
        _save(run, state_file, t + 1, sampler, parents)
        _draw(run, history)
        say(f"{step_name} {t}: batch best {history[t]['best_fitness']:.4f}  best ever "
            f"{run.best.fitness:.4f}  metric calls {run.archive.metric_calls()}  "
            f"elapsed {run.budget.seconds():.0f}s")
    return _stop(run, history, f"all {max(steps, start)} {step_name}s ran")


def _assess(run: Run, name: str, batch: Sequence[Sequence[float]], parents: tuple[int, ...], step: int,
            label: str) -> list[tuple[int, Evaluation]]:
    """The batch evaluated in one engine call, archived and placed: (candidate id, evaluation)s."""
    evaluations = run.evaluate(batch, label)
    added = run.archive.add([
        Candidate(to_dict(genome, run.cluster_ids), "", "initial" if step == SEED_STEP else name, parents,
                  name, step, fitness=e.fitness, mean_tokens=e.mean_tokens, correctness=e.correctness)
        for genome, e in zip(batch, evaluations)])
    ids = [c.id for c in added if c.id is not None]
    run.archive.place([(cand_id(cid), cid, step + 1, "cand", i) for i, cid in enumerate(ids)], step)
    run.best.consider([(Member(dict(c.deltas), "", cid), e) for c, cid, e in zip(added, ids, evaluations)])
    return list(zip(ids, evaluations))


def _entry(run: Run, t: int, assessed: Sequence[Evaluation]) -> dict[str, Any]:
    fitness = [e.fitness for e in assessed]
    best = assessed[max(range(len(assessed)), key=fitness.__getitem__)]
    return {"generation": t, "best_fitness": max(fitness), "mean_fitness": statistics.fmean(fitness),
            "min_fitness": min(fitness), "mean_tokens": statistics.fmean(e.mean_tokens for e in assessed),
            "correctness": statistics.fmean(e.correctness for e in assessed), "best_mean_tokens": best.mean_tokens,
            "best_correctness": best.correctness, "best_ever_fitness": run.best.fitness,
            "metric_calls": run.archive.metric_calls(), "seconds": round(run.budget.seconds(), 3)}


def _save(run: Run, state_file: str, iteration: int, sampler: Sampler, parents: tuple[int, ...]) -> None:
    assert run.best.member is not None
    atomic_write_json(run.out / state_file, {
        "iteration": iteration, "rng": capture_rng(), "sampler": sampler.state(), "parents": list(parents),
        "best": run.best.member.candidate_id, "last_candidate_id": run.archive.last_candidate_id()})


def _draw(run: Run, history: Sequence[dict[str, Any]]) -> None:
    tree = EvolutionTree.from_archive(run.archive)
    tree.save(run.out / TREE_FILE)
    tree.render(run.out / TREE_PLOT)
    if history:
        plot_fitness(history, run.out / FITNESS_PLOT)
        plot_lengths(history, run.out / LENGTHS_PLOT)


def _stop(run: Run, history: list[dict[str, Any]], reason: str) -> str:
    if history and history[-1].get("stop_reason") != reason:
        history[-1]["stop_reason"] = reason
        save_history(run.out / HISTORY_FILE, history)
    _draw(run, history)
    return reason

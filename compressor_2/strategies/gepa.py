"""`CONFIG_STRATEGY="gepa"`: seed 004's GEPA proposers over delta vectors.

A candidate is a delta vector whose components are the clusters; an example's score is
the per-example score `s_i`; a candidate's aggregate valset score (its `fitness` here)
is the mean of its `s_i` over the valset. The pool is split once: the valset carries
the Pareto front, the rest (the feedback set) the minibatches. The engine loop:
  1. evaluate the seed candidate (the initial deltas) on the valset;
  2. per iteration, run the merge proposer when it is due, otherwise the reflective
     mutation proposer;
  3. test the proposal's acceptance, then evaluate it fully on the valset and add it to
     the pool;
  4. update the Pareto front;
  5. stop on the budgets (CONFIG_MAX_METRIC_CALLS is GEPA's natural stop).
The state (iteration, RNG, sampler, merge counters, the pool, the front) is written after
every iteration; a rerun resumes it, and the valset scores come back from the archive.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from compressor_2.archive.database import Candidate
from compressor_2.atomic import atomic_write_json
from compressor_2.config import Config, GepaOptions
from compressor_2.data.example import Example
from compressor_2.data.financebench import parse_indices
from compressor_2.deltas import load_deltas, to_list
from compressor_2.errors import ConfigError
from compressor_2.fitness import Evaluation
from compressor_2.reflector.base import MutationRequest, VectorRequest
from compressor_2.reflector.prompts import estimated_call_tokens
from compressor_2.run import fields
from compressor_2.run.budget import Cost
from compressor_2.run.fields import FieldError
from compressor_2.run.history import HISTORY_FILE, load_history, save_history
from compressor_2.run.plots import FITNESS_PLOT, LENGTHS_PLOT, plot_archive, plot_fitness, plot_lengths
from compressor_2.run.progress import say
from compressor_2.run.services import Run, resume_command
from compressor_2.run.state import Member, capture_rng_of, held_list, load_strategy_state, restore_rng
from compressor_2.run.tree import TREE_FILE, TREE_PLOT, EvolutionTree, cand_id
from compressor_2.strategies.gepa_pareto import (
    EpochSampler,
    find_merge_triplet,
    merge_accepted,
    merge_components,
    mutation_accepted,
    pareto_front,
    remove_dominated,
    select_from_front,
    stratified_subsample,
)
from compressor_2.strategies.operators import append_summary

NAME = "gepa"
STATE_FILE = "gepa_state.json"
FRONT_FILE = "pareto_front.json"
PROGRESS_PLOT = "gepa_progress.png"
SEED_STEP = -1
# What it writes in the run directory besides the shared services' files.
OUTPUT_FILES = (STATE_FILE, FRONT_FILE, PROGRESS_PLOT)


def estimate(config: Config, n_examples: int) -> Cost:
    """GEPA's cost model: the seed costs |valset|; each proposal a minibatch twice (before,
    after; the parent's answers are often cached) and, when kept, |valset|."""
    options = _options(config)
    valset = _valset_size(options, n_examples)
    calls = 1.0 if config.reflector != "local" else 0.0
    return Cost("iteration", valset, 2 * options.minibatch_size + valset,
                calls * estimated_call_tokens(config, options.minibatch_size))


def run(run: Run) -> str:
    options, out = _options(run.config), run.out
    saved = load_strategy_state(out / STATE_FILE, run.archive, functools.partial(read_state, run=run))
    g = Gepa(run, options, random.Random(run.config.seed), load_history(out / HISTORY_FILE,
                                                                            before=saved["iteration"] if saved else 0))
    if saved:
        g.resume(saved)
        say(f"resuming at iteration {g.iteration} from {out / STATE_FILE} ({len(g.pool)} candidates in the pool)")
    else:
        g.start()
        say(f"GEPA on {len(g.valset)} valset and {len(g.sampler.ids)} feedback examples, minibatches of "
            f"{options.minibatch_size}, until CONFIG_MAX_METRIC_CALLS={run.config.max_metric_calls}")
    while True:
        if reason := run.stop_reason():
            g.stop(reason)
            return reason
        try:
            record = iteration(g, g.iteration)
        except KeyboardInterrupt:
            print(f"\ninterrupted: iteration {g.iteration} starts again when you rerun the same command: "
                  f"{resume_command()}", file=sys.stderr)
            raise
        g.finish(record)


def iteration(g: Gepa, t: int) -> dict[str, Any]:
    # 2. The merge proposer when it is due (the last iteration found a new program and a
    # merge was scheduled); when it finds no pair, the reflective proposer runs instead.
    if g.options.use_merge and g.last_found_new and g.merges_due > 0:
        g.last_found_new = False
        merged = g.merge(t)
        if merged is not None:
            return merged
    g.last_found_new = False
    return g.reflect(t)


@dataclass
class Gepa:
    run: Run
    options: GepaOptions
    rng: random.Random
    history: list[dict[str, Any]]
    iteration: int = 0
    valset: list[str] = field(default_factory=list)
    sampler: EpochSampler = field(default_factory=lambda: EpochSampler([], 1))
    pool: list[int] = field(default_factory=list)
    val_scores: dict[int, dict[str, float]] = field(default_factory=dict)
    evaluations: dict[int, Evaluation] = field(default_factory=dict)
    merges_due: int = 0
    merges_tested: int = 0
    merges_performed: list[list[int]] = field(default_factory=list)  # [first, second, ancestor]
    merge_descriptions: list[list[Any]] = field(default_factory=list)  # [first, second, sources]
    last_found_new: bool = False
    # candidate id -> its round-robin index; a kept child starts at its parents' (the highest)
    next_component: dict[str, int] = field(default_factory=dict)

    @functools.cached_property
    def by_id(self) -> dict[str, Example]:
        return {ex.id: ex for ex in self.run.examples}

    def examples(self, ids: Sequence[str]) -> list[Example]:
        by_id = self.by_id
        return [by_id[e] for e in ids]

    def aggregate(self, cid: int) -> float:
        return statistics.fmean(self.val_scores[cid].values())

    # -- 1. the split and the seed ----------------------------------------------------------

    def start(self) -> None:
        self.run.start_afresh(self.run.out / STATE_FILE, SEED_STEP)
        self.valset = split_valset(self.run.examples, self.options, random.Random(self.run.config.seed))
        feedback = [ex.id for ex in self.run.examples if ex.id not in set(self.valset)]
        self.sampler = EpochSampler(feedback, self.options.minibatch_size)
        deltas = load_deltas(self.run.config.initial_deltas_path, self.run.cluster_ids)
        seed = self.add(deltas, "", "initial", (), 0, "seed candidate")
        self.run.archive.place([(cand_id(seed), seed, 0, "cand", 0)], SEED_STEP)
        self.save_state()

    def resume(self, saved: dict[str, Any]) -> None:
        self.iteration = saved["iteration"]
        self.run.archive.rollback(saved["last_candidate_id"], from_step=self.iteration)
        restore_rng(saved["rng"], into=(self.rng, np.random.RandomState()))
        self.valset = saved["valset"]
        self.sampler = EpochSampler(**saved["sampler"])
        self.merges_due, self.merges_tested = saved["merges_due"], saved["merges_tested"]
        self.merges_performed, self.merge_descriptions = saved["merges_performed"], saved["merge_descriptions"]
        self.last_found_new, self.next_component = saved["last_found_new"], saved["next_component"]
        members = {c.id: c for c in self.run.archive.candidates()}
        for cid in saved["pool"]:
            self.assess(members[cid])  # served from the archive; sampled afresh when CONFIG_TEMPERATURE > 0
            self.pool.append(cid)
        # The stored best is the pool's best aggregate as the archive records it; a member
        # whose fresh valset samples beat it replaces it (seed 000 §2, resume).
        stored = members[max(self.pool, key=lambda c: (members[c].fitness or 0.0, -c))]
        self.run.best.member = Member(dict(stored.deltas), stored.scratchpad, stored.id or 0)
        self.run.best.fitness = stored.fitness
        if self.run.best.consider([(Member(dict(members[c].deltas), members[c].scratchpad, c),
                                    replace(self.evaluations[c], fitness=self.aggregate(c))) for c in self.pool]):
            assert self.run.best.member is not None
            best = self.run.best.member.candidate_id  # the archive records its new fitness: the next resume's
            self.run.archive.assess(best, self.aggregate(best), self.evaluations[best].mean_tokens,
                                    self.evaluations[best].correctness)

    # -- pool -------------------------------------------------------------------------------

    def assess(self, candidate: Candidate) -> Evaluation:
        """The candidate on the valset; its scores go to `val_scores`."""
        assert candidate.id is not None
        [evaluation] = self.run.evaluate([to_list(candidate.deltas)], "valset", self.examples(self.valset))
        self.evaluations[candidate.id] = evaluation
        self.val_scores[candidate.id] = {r.id: s for r, s in zip(evaluation.records, evaluation.scores)}
        return evaluation

    def add(self, deltas: dict[str, float], scratchpad: str, operator: str, parents: tuple[int, ...], step: int,
            label: str, note: str = "") -> int:
        """Evaluates a kept proposal fully on the valset and adds it to the pool."""
        [evaluation] = self.run.evaluate([to_list(deltas)], label, self.examples(self.valset))
        aggregate = statistics.fmean(evaluation.scores)
        [c] = self.run.archive.add([Candidate(deltas, scratchpad, operator, parents, NAME, step, "evaluated", note,
                                              aggregate, evaluation.mean_tokens, evaluation.correctness)])
        assert c.id is not None
        self.evaluations[c.id] = evaluation
        self.val_scores[c.id] = {r.id: s for r, s in zip(evaluation.records, evaluation.scores)}
        self.pool.append(c.id)
        if parents:  # GEPA hands a new program its parents' round-robin position, the highest of them
            self.next_component[str(c.id)] = max(self.next_component.get(str(p), 0) for p in parents)
        self.run.best.consider([(Member(dict(deltas), scratchpad, c.id), replace(evaluation, fitness=aggregate))])
        return c.id

    def reject(self, deltas: dict[str, float], scratchpad: str, operator: str, parents: tuple[int, ...], step: int,
               note: str) -> int:
        [c] = self.run.archive.add([Candidate(deltas, scratchpad, operator, parents, NAME, step, "rejected", note)])
        assert c.id is not None
        return c.id

    def fronts(self) -> list[set[int]]:
        return [holders for _, holders in pareto_front({c: self.val_scores[c] for c in self.pool}).values()]

    # -- the reflective mutation proposer (seed 004, steps 1-8) ------------------------------

    def select_parent(self) -> int:
        aggregates = {c: self.aggregate(c) for c in self.pool}
        best = max(self.pool, key=lambda c: (aggregates[c], -c))
        selector = self.options.candidate_selector
        if selector == "current_best":
            return best
        if selector == "epsilon_greedy":
            return self.rng.choice(self.pool) if self.rng.random() < self.options.epsilon else best
        return select_from_front(self.fronts(), aggregates, self.rng)

    def reflect(self, t: int) -> dict[str, Any]:
        archive = self.run.archive
        pid = self.select_parent()                                                          # 1. candidate
        parent = archive.candidate(pid)
        assert parent is not None
        ids = self.sampler.next(self.rng)                                                   # 2. minibatch
        minibatch = self.examples(ids)
        [before] = self.run.evaluate([to_list(parent.deltas)], f"iteration {t} parent", minibatch)  # 3. before
        record: dict[str, Any] = {"proposer": "reflective", "parent": pid, "minibatch": ids,
                                  "before": sum(before.scores)}
        gold = self.run.gold_tokens
        if self.options.skip_perfect and all(r.is_correct and r.tokens <= gold[r.id] for r in before.records):
            return {**record, "accepted": False, "skipped": "every minibatch answer is already perfect"}
        records = [replace(r, reasoning=f"{r.reasoning}; {r.tokens} tokens against the gold answer's {gold[r.id]}")
                   for r in before.records]                                                  # 5. reflective dataset
        deltas, scratchpad, change = self.propose(t, parent, before, records)               # 4., 6. component, propose
        if deltas is None:
            return {**record, "accepted": False, "skipped": "the reflector's replies were invalid twice"}
        [after] = self.run.evaluate([to_list(deltas)], f"iteration {t} proposal", minibatch)  # 7. after
        record.update(after=sum(after.scores), change=change)
        operator = "mutation" if self.options.component_selector == "round_robin" else "vector_mutation"
        if not mutation_accepted(before.scores, after.scores):                             # 8. accept?
            record["candidate"] = self.reject(deltas, scratchpad, operator, (pid,), t + 1,
                                              f"minibatch {sum(after.scores):.4f} <= the parent's "
                                              f"{sum(before.scores):.4f}")
            return {**record, "accepted": False}
        cid = self.add(deltas, scratchpad, operator, (pid,), t + 1, f"iteration {t} valset")
        self.found_new()
        return {**record, "accepted": True, "candidate": cid}

    def propose(self, t: int, parent: Candidate, before: Evaluation,
                records: list[Any]) -> tuple[dict[str, float] | None, str, str]:
        """One reflector call: one cluster (round robin per candidate, seed 000's prompt) or
        every delta (seed 001's)."""
        assert parent.id is not None
        deltas = dict(parent.deltas)
        if self.options.component_selector == "all":
            vector = self.run.reflector.mutate_vector(VectorRequest(t, 0, deltas, parent.scratchpad, before.fitness,
                                                                    records, parent.id))
            if vector.deltas is None:
                return None, "", ""
            return vector.deltas, append_summary(parent.scratchpad, vector.summary), "all clusters"
        k = self.next_component.get(str(parent.id), 0)
        target = self.run.cluster_ids[k]
        self.next_component[str(parent.id)] = (k + 1) % len(self.run.cluster_ids)
        result = self.run.reflector.mutate(MutationRequest(t, 0, target, deltas, parent.scratchpad, before.fitness,
                                                           records, parent.id))
        if result.delta is None:
            return None, "", ""
        return {**deltas, target: result.delta}, result.scratchpad, f"cluster {target}"

    def found_new(self) -> None:
        self.last_found_new = True
        if self.options.use_merge and self.merges_tested < self.options.max_merge_invocations:
            self.merges_due += 1

    # -- the merge proposer (seed 004, steps 1-9) ---------------------------------------------

    def merge(self, t: int) -> dict[str, Any] | None:
        archive, eps = self.run.archive, self.options.merge_eps
        aggregates = {c: self.aggregate(c) for c in self.pool}
        dominators = sorted(remove_dominated(self.fronts(), aggregates))
        members = {c.id: c for c in archive.candidates(f"id IN ({','.join(map(str, self.pool))})")}
        genomes = {c: to_list(members[c].deltas) for c in self.pool}
        lineage = archive.lineage()
        tried = {tuple(m) for m in self.merges_performed}
        for _ in range(10):
            triplet = find_merge_triplet(dominators, lambda c: set(lineage.ancestors(c)) & set(self.pool),
                                         aggregates, genomes, tried, eps, self.rng)  # type: ignore[arg-type]
            if triplet is None:
                return None
            i, j, ancestor = triplet
            tried.add(triplet)
            self.merges_performed.append([i, j, ancestor])
            merged, sources = merge_components(genomes[ancestor], genomes[i], genomes[j], aggregates[i],
                                               aggregates[j], (i, j), eps, self.rng)
            if [i, j, list(sources)] in self.merge_descriptions:
                continue  # this exact merge was tried before
            self.merge_descriptions.append([i, j, list(sources)])
            overlap = set(self.val_scores[i]) & set(self.val_scores[j])
            if len(overlap) < self.options.val_overlap_floor:
                continue
            return self.test_merge(t, i, j, ancestor, merged, sources)
        return None

    def test_merge(self, t: int, i: int, j: int, ancestor: int, merged: list[float],
                   sources: tuple[int, ...]) -> dict[str, Any]:
        self.merges_due -= 1
        self.merges_tested += 1
        ids = stratified_subsample(self.val_scores[i], self.val_scores[j], self.options.merge_subsample, self.rng)
        [after] = self.run.evaluate([merged], f"iteration {t} merge", self.examples(ids))
        before_i = [self.val_scores[i][e] for e in ids]
        before_j = [self.val_scores[j][e] for e in ids]
        deltas = dict(zip(self.run.cluster_ids, merged))
        members = {c.id: c for c in self.run.archive.candidates(f"id IN ({i}, {j})")}
        scratchpad = members[i].scratchpad if self.aggregate(i) >= self.aggregate(j) else members[j].scratchpad
        note = f"merge of #{i} and #{j} over their common ancestor #{ancestor}"
        record = {"proposer": "merge", "parents": [i, j], "ancestor": ancestor, "subsample": ids,
                  "before": max(sum(before_i), sum(before_j)), "after": sum(after.scores)}
        if merge_accepted(after.scores, before_i, before_j):
            cid = self.add(deltas, scratchpad, "merge", (i, j), t + 1, f"iteration {t} valset", note)
            self.last_found_new = True
        else:
            cid = self.reject(deltas, scratchpad, "merge", (i, j), t + 1,
                              f"{note}: subsample {sum(after.scores):.4f} < the better parent's "
                              f"{max(sum(before_i), sum(before_j)):.4f}")
        accepted = cid in self.pool
        self.run.archive.record_merge(cid, i, j, ancestor, sources, accepted)
        return {**record, "accepted": accepted, "candidate": cid}

    # -- records -------------------------------------------------------------------------------

    def finish(self, record: dict[str, Any]) -> None:
        """After iteration t: placements, history, front, state, plots, one line."""
        t, archive, out = self.iteration, self.run.archive, self.run.out
        if record.get("accepted"):
            archive.place([(cand_id(record["candidate"]), record["candidate"], t + 1, "cand",
                            len(self.pool) - 1)], t)
        aggregates = [self.aggregate(c) for c in self.pool]
        best = max(self.pool, key=lambda c: (self.aggregate(c), -c))
        tokens = [self.evaluations[c].mean_tokens for c in self.pool]
        entry = {"generation": t, **record, "pool": len(self.pool), "best_fitness": max(aggregates),
                 "mean_fitness": statistics.fmean(aggregates), "best_ever_fitness": self.run.best.fitness,
                 "p10": float(np.percentile(aggregates, 10)), "p50": float(np.percentile(aggregates, 50)),
                 "p90": float(np.percentile(aggregates, 90)), "mean_tokens": statistics.fmean(tokens),
                 "best_mean_tokens": self.evaluations[best].mean_tokens, "merges_due": self.merges_due,
                 "merges_tested": self.merges_tested, "metric_calls": archive.metric_calls()}
        self.history[t:] = [entry]
        save_history(out / HISTORY_FILE, self.history)
        atomic_write_json(out / FRONT_FILE, self.front_json())
        self.iteration = t + 1
        self.save_state()
        if record.get("accepted"):  # iterations are cheap: draw only when the pool changed, and at the end
            self.draw()
        kept = "kept" if record.get("accepted") else record.get("skipped", "rejected")
        scores = (f" ({record['before']:.4f} -> {record['after']:.4f})" if "after" in record else "")
        say(f"iteration {t}: {record['proposer']} {kept}{scores}  pool {len(self.pool)}  best "
            f"{max(aggregates):.4f}  metric calls {entry['metric_calls']}  elapsed {self.run.budget.seconds():.0f}s")

    def draw(self) -> None:
        out = self.run.out
        tree = EvolutionTree.from_archive(self.run.archive)
        tree.save(out / TREE_FILE)
        tree.render(out / TREE_PLOT)
        if self.history:
            plot_fitness(self.history, out / FITNESS_PLOT)
            plot_lengths(self.history, out / LENGTHS_PLOT)
            plot_archive(self.history, out / PROGRESS_PLOT)

    def front_json(self) -> dict[str, Any]:
        front = pareto_front({c: self.val_scores[c] for c in self.pool})
        return {example: {"score": score, "candidates": sorted(holders)} for example, (score, holders) in
                sorted(front.items())}

    def save_state(self) -> None:
        atomic_write_json(self.run.out / STATE_FILE, {
            "iteration": self.iteration, "rng": capture_rng_of(self.rng), "valset": self.valset,
            "sampler": dataclasses.asdict(self.sampler),
            "pool": self.pool, "merges_due": self.merges_due, "merges_tested": self.merges_tested,
            "merges_performed": self.merges_performed, "merge_descriptions": self.merge_descriptions,
            "last_found_new": self.last_found_new, "next_component": self.next_component,
            "pareto_front": self.front_json(), "last_candidate_id": self.run.archive.last_candidate_id(),
        })

    def stop(self, reason: str) -> None:
        if self.history:
            self.history[-1]["stop_reason"] = reason
            save_history(self.run.out / HISTORY_FILE, self.history)
        self.draw()


def read_state(raw: dict[str, Any], run: Run) -> None:
    """gepa_state.json's own fields, each read before any work: a FieldError names the one
    that is off (`pareto_front` is only written, for other tools)."""
    examples = {ex.id for ex in run.examples}
    valset = _example_ids(raw, "valset", examples, "an example of the training pool")
    sampler = fields.typed(raw, "sampler", dict, "an object")
    unknown = set(sampler) - {f.name for f in dataclasses.fields(EpochSampler)}
    if unknown:
        raise FieldError(f"sampler has the unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    ids = _example_ids(sampler, "ids", examples - set(valset), "a feedback example (in the pool, not the valset)",
                       "sampler.")
    fields.integer(sampler, "size", "sampler.", minimum=1)
    fields.integer(sampler, "epoch", "sampler.", minimum=-1)
    fields.integer(sampler, "position", "sampler.")
    if fields.value(sampler, "order", "sampler.") is not None:
        _example_ids(sampler, "order", set(ids), "one of sampler.ids", "sampler.")
    if not held_list(raw, "pool", run.archive, assessed=True):
        raise FieldError("pool is empty, but it holds at least the seed candidate")
    for key in ("merges_due", "merges_tested"):
        fields.integer(raw, key)
    for i, triplet in enumerate(fields.typed(raw, "merges_performed", list, "a list")):
        _ids(triplet, f"merges_performed[{i}]", 3)
    for i, entry in enumerate(fields.typed(raw, "merge_descriptions", list, "a list")):
        if not isinstance(entry, list) or len(entry) != 3:
            raise FieldError(f"merge_descriptions[{i}] is {fields.shown(entry)}, not [first, second, sources]")
        _ids(entry[:2], f"merge_descriptions[{i}]", 2)
        _ids(entry[2], f"merge_descriptions[{i}][2]", len(run.cluster_ids))
    fields.typed(raw, "last_found_new", bool, "true or false")
    positions = fields.typed(raw, "next_component", dict, "an object {candidate id: cluster position}")
    for key in positions:
        if fields.integer(positions, key, "next_component.") >= len(run.cluster_ids):
            raise FieldError(f"next_component.{key} is {positions[key]}, not a cluster position in "
                             f"[0, {len(run.cluster_ids)})")


def _example_ids(raw: dict[str, Any], key: str, allowed: set[str], what: str, where: str = "") -> list[str]:
    found = fields.typed(raw, key, list, "a list of example ids", where)
    for i, example in enumerate(found):
        if not isinstance(example, str) or example not in allowed:
            raise FieldError(f"{where}{key}[{i}] is {fields.shown(example)}, not {what}")
    return found


def _ids(found: Any, where: str, length: int) -> None:
    """`found`: `length` candidate ids."""
    if (not isinstance(found, list) or len(found) != length
            or not all(type(c) is int and c >= 1 for c in found)):
        raise FieldError(f"{where} is {fields.shown(found)}, not {length} candidate ids")


def split_valset(examples: Sequence[Example], options: GepaOptions, rng: random.Random) -> list[str]:
    """The valset's example ids, in pool order: explicit positions, or a seeded draw."""
    n = len(examples)
    if options.valset_indices:
        positions = set(parse_indices(options.valset_indices, n, "CONFIG_GEPA_VALSET_INDICES (positions in the pool)"))
    else:
        size = _valset_size(options, n)
        positions = set(rng.sample(range(n), size))
    if n - len(positions) < options.minibatch_size:
        raise ConfigError(f"a pool of {n} examples is too small for a valset of {len(positions)} and minibatches of "
                          f"{options.minibatch_size}: lower CONFIG_GEPA_VALSET_SIZE (or the indices) or "
                          "CONFIG_GEPA_MINIBATCH_SIZE, or widen CONFIG_FINANCEBENCH_POOL_INDICES")
    return [examples[i].id for i in sorted(positions)]


def _valset_size(options: GepaOptions, n_examples: int) -> int:
    return min(options.valset_size, n_examples)


def _options(config: Config) -> GepaOptions:
    if config.gepa is None:
        raise ConfigError("CONFIG_STRATEGY_GEPA=y is needed for the GEPA strategy's options")
    return config.gepa

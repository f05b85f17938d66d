"""`CONFIG_STRATEGY="gepa"`: GEPA's proposers over delta vectors.

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
The state (the split, the sampler, the merge counters, the pool, the front; with the
iteration and the RNG the run's driver keeps) is written after every iteration; a rerun
resumes it, and the valset scores come back from the archive.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from compressor_2.archive import Candidate, Spot
from compressor_2.common import ConfigError, say
from compressor_2.config import MAX_LOGITS, Config, Reader, check_each_once, require
from compressor_2.data import Example, parse_indices
from compressor_2.deltas import to_list, visiting_order
from compressor_2.fitness import Evaluation
from compressor_2.reflector import MutationRequest, VectorRequest, estimated_call_tokens
from compressor_2.resume import (
    FieldError,
    Member,
    RunFiles,
    StateFormat,
    candidate_ids,
    compared,
    fields,
    held_list,
    state_json,
    step_entry,
)
from compressor_2.run import Cost, NewCandidate, Report, Run, Strategy
from compressor_2.strategies import options_of
from compressor_2.strategies.gepa.pareto import (
    EpochSampler,
    example_fronts,
    find_merge_triplet,
    merge_accepted,
    merge_components,
    mutation_accepted,
    remove_dominated,
    select_from_front,
    stratified_subsample,
)
from compressor_2.strategies.operators import append_summary

FRONT_FILE = "pareto_front.json"
FILES = RunFiles("gepa_state.json", plot="gepa_progress.png", others=(FRONT_FILE,))
CANDIDATE_SELECTORS = ("pareto", "current_best", "epsilon_greedy")
COMPONENT_SELECTORS = ("round_robin", "all")
IDENTITY = compared("GEPA_", "valset_size", "valset_indices", "minibatch_size", "candidate_selector", "epsilon",
                    "skip_perfect", "component_selector", "use_merge", "max_merge_invocations", "merge_eps",
                    "merge_subsample", "val_overlap_floor")


@dataclass(frozen=True)
class GepaOptions:
    """GEPA's options (CONFIG_GEPA_*)."""

    valset_size: int
    valset_indices: str  # "" or pool positions such as "0-9,20"
    minibatch_size: int
    candidate_selector: str
    epsilon: float
    skip_perfect: bool
    component_selector: str
    use_merge: bool
    max_merge_invocations: int
    merge_eps: float
    merge_subsample: int
    val_overlap_floor: int


def read_options(r: Reader) -> GepaOptions:
    require(r.integer("MAX_METRIC_CALLS") > 0, "CONFIG_STRATEGY_GEPA needs CONFIG_MAX_METRIC_CALLS > 0: the "
            "metric-call budget is GEPA's natural stopping criterion")
    indices = r.string("GEPA_VALSET_INDICES").strip()
    require(indices == "" or re.fullmatch(r"[0-9]+(-[0-9]+)?(\s*,\s*[0-9]+(-[0-9]+)?)*", indices) is not None,
             f"CONFIG_GEPA_VALSET_INDICES={indices!r} must be empty or pool positions such as '0-9,20'")
    selector = r.string("GEPA_CANDIDATE_SELECTOR").strip()
    require(selector in CANDIDATE_SELECTORS, f"CONFIG_GEPA_CANDIDATE_SELECTOR={selector!r} is unknown; use one "
             f"of {', '.join(CANDIDATE_SELECTORS)}")
    component = r.string("GEPA_COMPONENT_SELECTOR").strip()
    require(component in COMPONENT_SELECTORS, f"CONFIG_GEPA_COMPONENT_SELECTOR={component!r} is unknown; use "
             f"one of {', '.join(COMPONENT_SELECTORS)}")
    for low, high in re.findall(r"([0-9]+)-([0-9]+)", indices):
        require(int(low) <= int(high), f"CONFIG_GEPA_VALSET_INDICES={indices!r} has the range {low}-{high}, which "
                 f"runs backwards: write {high}-{low}")
    check_each_once(indices, "CONFIG_GEPA_VALSET_INDICES", "position")
    epsilon = r.number("GEPA_EPSILON", 0, 1)
    eps = r.number("GEPA_MERGE_EPS", 0, MAX_LOGITS)
    return GepaOptions(
        valset_size=r.integer("GEPA_VALSET_SIZE"), valset_indices=indices,
        minibatch_size=r.integer("GEPA_MINIBATCH_SIZE"), candidate_selector=selector, epsilon=epsilon,
        skip_perfect=r.flag("GEPA_SKIP_PERFECT"), component_selector=component, use_merge=r.flag("GEPA_USE_MERGE"),
        max_merge_invocations=r.integer("GEPA_MAX_MERGE_INVOCATIONS"), merge_eps=eps,
        merge_subsample=r.integer("GEPA_MERGE_SUBSAMPLE"), val_overlap_floor=r.integer("GEPA_VAL_OVERLAP_FLOOR"),
    )


def estimate(config: Config, n_examples: int) -> Cost:
    """GEPA's cost model: the seed costs |valset|; each proposal a minibatch twice (before,
    after; the parent's answers are often cached) and, when kept, |valset|."""
    options = options_of(config, "gepa")
    valset = _valset_size(options, n_examples)
    calls = 1.0 if config.reflector != "local" else 0.0
    return Cost("iteration", valset, 2 * options.minibatch_size + valset,
                calls * estimated_call_tokens(config, options.minibatch_size))


def make(run: Run) -> Gepa:
    return Gepa(run, options_of(run.config, "gepa"))


def iteration(gepa: Gepa, t: int) -> dict[str, Any]:
    # 2. The merge proposer when it is due (the last iteration found a new program and a
    # merge was scheduled); when it finds no pair, the reflective proposer runs instead.
    if gepa.options.use_merge and gepa.state.last_found_new and gepa.state.merges_due > 0:
        gepa.state.last_found_new = False
        merged = gepa.merge(t)
        if merged is not None:
            return merged
    gepa.state.last_found_new = False
    return gepa.reflect(t)


@dataclass
class GepaState:
    """What GEPA keeps between iterations besides the RNG: the split, the sampler, the
    pool, the merge counters and what merges were tried, each candidate's next round-robin
    component; and the front, written for other tools."""

    valset: list[str]
    sampler: EpochSampler
    pool: list[int]
    merges_due: int = 0
    merges_tested: int = 0
    merges_performed: list[list[int]] = field(default_factory=list)  # [first, second, ancestor]
    merge_descriptions: list[list[Any]] = field(default_factory=list)  # [first, second, sources]
    last_found_new: bool = False
    # candidate id -> its round-robin index; a kept child starts at its parents' (the highest)
    next_component: dict[str, int] = field(default_factory=dict)
    pareto_front: dict[str, Any] = field(default_factory=dict)


class Gepa(Strategy):
    """GEPA's engine's decisions; the run's driver runs its loop."""

    step_name, steps, steps_symbol, proposer = "iteration", None, "", "the reflector"
    progress_plot = FILES.plot

    def __init__(self, run: Run, options: GepaOptions) -> None:
        self.run, self.options = run, options
        self.rng = random.Random(run.config.seed)
        self.state = GepaState([], EpochSampler([], 1), [])
        self.val_scores: dict[int, dict[str, float]] = {}
        self.evaluations: dict[int, Evaluation] = {}
        self.state_format = StateFormat(FILES, "iteration", ("random",), functools.partial(read_own, run=run),
                                        state_json, check_own)

    def rngs(self) -> Mapping[str, Any]:
        return {"random": self.rng}

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
        valset = split_valset(self.run.examples, self.options, random.Random(self.run.config.seed))
        feedback = [ex.id for ex in self.run.examples if ex.id not in set(valset)]
        self.state = GepaState(valset, EpochSampler(feedback, self.options.minibatch_size), [])
        self.add(self.run.initial, "", "initial", (), 0, "seed candidate")
        say(f"GEPA on {len(valset)} valset and {len(feedback)} feedback examples, minibatches of "
            f"{self.options.minibatch_size}, until CONFIG_MAX_METRIC_CALLS={self.run.config.max_metric_calls}")

    def restore(self, own: GepaState, t: int) -> None:
        """The pool's valset scores, served from the archive (sampled afresh when
        CONFIG_TEMPERATURE > 0: a member whose fresh samples beat the stored best replaces
        it, and the archive records its new aggregate for the next resume)."""
        self.state = own
        members = self.run.archive.among(own.pool)
        for cid in own.pool:
            self.assess(members[cid])
        scored = [(Member(dict(members[c].deltas), members[c].scratchpad, c),
                   replace(self.evaluations[c], fitness=self.aggregate(c))) for c in own.pool]
        if self.run.best.consider(scored):
            self.run.assess([(member, e) for member, e in scored if member == self.run.best.member])

    def own_state(self) -> GepaState:
        return replace(self.state, pareto_front=self.front_json())

    def step(self, t: int) -> Report:
        """Iteration t, then its history entry, the front and its line."""
        record = iteration(self, t)
        scored = [replace(self.evaluations[c], fitness=self.aggregate(c)) for c in self.state.pool]
        entry = {**step_entry(t, scored, self.run.best.fitness, percentiles=True), **record,
                 "pool": len(self.state.pool), "merges_due": self.state.merges_due,
                 "merges_tested": self.state.merges_tested, "metric_calls": self.run.archive.metric_calls()}
        kept = "kept" if record.get("accepted") else record.get("skipped", "rejected")
        scores = (f" ({record['before']:.4f} -> {record['after']:.4f})" if "after" in record else "")
        line = (f"iteration {t}: {record['proposer']} {kept}{scores}  pool {len(self.state.pool)}  best "
                f"{entry['best_fitness']:.4f}  metric calls {entry['metric_calls']}  elapsed "
                f"{self.run.budget.seconds():.0f}s")
        return Report([entry], line, files={FRONT_FILE: self.front_json()})

    # -- pool -------------------------------------------------------------------------------

    def assess(self, candidate: Candidate) -> Evaluation:
        """The candidate on the valset; its scores go to `val_scores`."""
        assert candidate.id is not None
        [evaluation] = self.run.evaluate([to_list(candidate.deltas)], "valset", self.examples(self.state.valset))
        self.evaluations[candidate.id] = evaluation
        self.val_scores[candidate.id] = {r.id: s for r, s in zip(evaluation.records, evaluation.scores)}
        return evaluation

    def add(self, deltas: dict[str, float], scratchpad: str, operator: str, parents: tuple[int, ...], made_in: int,
            label: str, note: str = "") -> int:
        """Evaluates a kept proposal fully on the valset and adds it to the pool: a candidate
        whose fitness is its aggregate valset score, placed in the column of `made_in` and
        decided in the step before it (the seed, made in 0: the start's step)."""
        [evaluation] = self.run.evaluate([to_list(deltas)], label, self.examples(self.state.valset))
        aggregate = replace(evaluation, fitness=statistics.fmean(evaluation.scores))
        [c] = self.run.admit(made_in - 1, [NewCandidate(
            deltas, scratchpad, operator, parents, made_in, aggregate, note=note,
            spot=Spot(made_in, "cand", len(self.state.pool)))])
        assert c.id is not None
        self.evaluations[c.id] = evaluation
        self.val_scores[c.id] = {r.id: s for r, s in zip(evaluation.records, evaluation.scores)}
        self.state.pool.append(c.id)
        if parents:  # GEPA hands a new program its parents' round-robin position, the highest of them
            self.state.next_component[str(c.id)] = max(self.state.next_component.get(str(p), 0) for p in parents)
        return c.id

    def reject(self, deltas: dict[str, float], scratchpad: str, operator: str, parents: tuple[int, ...], made_in: int,
               note: str) -> int:
        [c] = self.run.admit(made_in - 1, [NewCandidate(deltas, scratchpad, operator, parents, made_in,
                                                    status="rejected", note=note)])
        assert c.id is not None
        return c.id

    def fronts(self) -> list[set[int]]:
        return [holders for _, holders in example_fronts({c: self.val_scores[c] for c in self.state.pool}).values()]

    # -- the reflective mutation proposer --------------------------------------------------

    def select_parent(self) -> int:
        aggregates = {c: self.aggregate(c) for c in self.state.pool}
        best = max(self.state.pool, key=lambda c: (aggregates[c], -c))
        selector = self.options.candidate_selector
        if selector == "current_best":
            return best
        if selector == "epsilon_greedy":
            return self.rng.choice(self.state.pool) if self.rng.random() < self.options.epsilon else best
        return select_from_front(self.fronts(), aggregates, self.rng)

    def reflect(self, t: int) -> dict[str, Any]:
        archive = self.run.archive
        pid = self.select_parent()                                                          # 1. candidate
        parent = archive.candidate(pid)
        assert parent is not None
        ids = self.state.sampler.next(self.rng)                                                   # 2. minibatch
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
        """One reflector call: one cluster (round robin per candidate, the mutation prompt) or
        every delta (the full-vector prompt)."""
        assert parent.id is not None
        deltas = dict(parent.deltas)
        if self.options.component_selector == "all":
            vector = self.run.reflector.mutate_vector(VectorRequest(t, 0, deltas, parent.scratchpad, before.fitness,
                                                                    records, parent.id))
            if vector.deltas is None:
                return None, "", ""
            return vector.deltas, append_summary(parent.scratchpad, vector.summary), "all clusters"
        k = self.state.next_component.get(str(parent.id), 0)
        target = visiting_order(self.run.cluster_ids)[k]
        self.state.next_component[str(parent.id)] = (k + 1) % len(self.run.cluster_ids)
        result = self.run.reflector.mutate(MutationRequest(t, 0, target, deltas, parent.scratchpad, before.fitness,
                                                           records, parent.id))
        if result.delta is None:
            return None, "", ""
        return {**deltas, target: result.delta}, result.scratchpad, f"cluster {target}"

    def found_new(self) -> None:
        self.state.last_found_new = True
        if self.options.use_merge and self.state.merges_tested < self.options.max_merge_invocations:
            self.state.merges_due += 1

    # -- the merge proposer ------------------------------------------------------------------

    def merge(self, t: int) -> dict[str, Any] | None:
        archive, eps = self.run.archive, self.options.merge_eps
        aggregates = {c: self.aggregate(c) for c in self.state.pool}
        dominators = sorted(remove_dominated(self.fronts(), aggregates))
        members = archive.among(self.state.pool)
        genomes = {c: to_list(members[c].deltas) for c in self.state.pool}
        lineage = archive.lineage()
        tried = {tuple(m) for m in self.state.merges_performed}
        for _ in range(10):
            triplet = find_merge_triplet(dominators, lambda c: set(lineage.ancestors(c)) & set(self.state.pool),
                                         aggregates, genomes, tried, eps, self.rng)  # type: ignore[arg-type]
            if triplet is None:
                return None
            i, j, ancestor = triplet
            tried.add(triplet)
            self.state.merges_performed.append([i, j, ancestor])
            merged, sources = merge_components(genomes[ancestor], genomes[i], genomes[j], aggregates[i],
                                               aggregates[j], (i, j), eps, self.rng)
            if [i, j, list(sources)] in self.state.merge_descriptions:
                continue  # this exact merge was tried before
            self.state.merge_descriptions.append([i, j, list(sources)])
            overlap = set(self.val_scores[i]) & set(self.val_scores[j])
            if len(overlap) < self.options.val_overlap_floor:
                continue
            return self.test_merge(t, i, j, ancestor, merged, sources)
        return None

    def test_merge(self, t: int, i: int, j: int, ancestor: int, merged: list[float],
                   sources: tuple[int, ...]) -> dict[str, Any]:
        self.state.merges_due -= 1
        self.state.merges_tested += 1
        ids = stratified_subsample(self.val_scores[i], self.val_scores[j], self.options.merge_subsample, self.rng)
        [after] = self.run.evaluate([merged], f"iteration {t} merge", self.examples(ids))
        before_i = [self.val_scores[i][e] for e in ids]
        before_j = [self.val_scores[j][e] for e in ids]
        deltas = dict(zip(self.run.cluster_ids, merged))
        members = self.run.archive.among([i, j])
        scratchpad = members[i].scratchpad if self.aggregate(i) >= self.aggregate(j) else members[j].scratchpad
        note = f"merge of #{i} and #{j} over their common ancestor #{ancestor}"
        record = {"proposer": "merge", "parents": [i, j], "ancestor": ancestor, "subsample": ids,
                  "before": max(sum(before_i), sum(before_j)), "after": sum(after.scores)}
        if merge_accepted(after.scores, before_i, before_j):
            cid = self.add(deltas, scratchpad, "merge", (i, j), t + 1, f"iteration {t} valset", note)
            self.state.last_found_new = True
        else:
            cid = self.reject(deltas, scratchpad, "merge", (i, j), t + 1,
                              f"{note}: subsample {sum(after.scores):.4f} < the better parent's "
                              f"{max(sum(before_i), sum(before_j)):.4f}")
        accepted = cid in self.state.pool
        self.run.archive.record_merge(cid, i, j, ancestor, sources, accepted)
        return {**record, "accepted": accepted, "candidate": cid}

    # -- records -------------------------------------------------------------------------------

    def front_json(self) -> dict[str, Any]:
        front = example_fronts({c: self.val_scores[c] for c in self.state.pool})
        return {example: {"score": score, "candidates": sorted(holders)} for example, (score, holders) in
                sorted(front.items())}


def read_own(raw: Mapping[str, Any], run: Run) -> GepaState:
    """gepa_state.json's own fields, each read before any work: a FieldError names the one
    that is off."""
    examples = {ex.id for ex in run.examples}
    valset = _example_ids(raw, "valset", examples, "an example of the training pool")
    if not valset:
        raise FieldError("valset is empty, but the front is kept on it")
    sampler = fields.typed(raw, "sampler", dict, "an object")
    unknown = set(sampler) - {f.name for f in dataclasses.fields(EpochSampler)}
    if unknown:
        raise FieldError(f"sampler has the unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    ids = _example_ids(sampler, "ids", examples - set(valset), "a feedback example (in the pool, not the valset)",
                       "sampler.")
    if not ids:
        raise FieldError("sampler.ids is empty, but the minibatches are drawn from it")
    fields.integer(sampler, "size", "sampler.", minimum=1)
    fields.integer(sampler, "epoch", "sampler.", minimum=-1)
    fields.integer(sampler, "position", "sampler.")
    if fields.value(sampler, "order", "sampler.") is not None:
        _example_ids(sampler, "order", set(ids), "one of sampler.ids", "sampler.")
    counts = fields.typed(sampler, "counts", dict, "an object {example id: count}", "sampler.")
    for key in counts:
        fields.integer(counts, key, "sampler.counts.")
    pool = candidate_ids(raw, "pool")
    if not pool:
        raise FieldError("pool is empty, but it holds at least the seed candidate")
    performed = fields.typed(raw, "merges_performed", list, "a list")
    for i, triplet in enumerate(performed):
        _ids(triplet, f"merges_performed[{i}]", 3)
    descriptions = fields.typed(raw, "merge_descriptions", list, "a list")
    for i, entry in enumerate(descriptions):
        if not isinstance(entry, list) or len(entry) != 3:
            raise FieldError(f"merge_descriptions[{i}] is {fields.shown(entry)}, not [first, second, sources]")
        _ids(entry[:2], f"merge_descriptions[{i}]", 2)
        _ids(entry[2], f"merge_descriptions[{i}][2]", len(run.cluster_ids))
    positions = fields.typed(raw, "next_component", dict, "an object {candidate id: cluster position}")
    for key in positions:
        if fields.integer(positions, key, "next_component.") >= len(run.cluster_ids):
            raise FieldError(f"next_component.{key} is {positions[key]}, not a cluster position in "
                             f"[0, {len(run.cluster_ids)})")
    return GepaState(valset, EpochSampler(**sampler), pool, fields.integer(raw, "merges_due"),
                     fields.integer(raw, "merges_tested"), performed, descriptions,
                     fields.typed(raw, "last_found_new", bool, "true or false"), positions,
                     fields.typed(raw, "pareto_front", dict, "an object"))


def check_own(own: GepaState, archive: Any, last: int) -> None:
    """Every pool member a candidate the archive held, assessed."""
    held_list(own.pool, "pool", archive, last, assessed=True)

def _example_ids(raw: dict[str, Any], key: str, allowed: set[str], what: str, where: str = "") -> list[str]:
    found = fields.typed(raw, key, list, "a list of example ids", where)
    for i, example in enumerate(found):
        if not isinstance(example, str) or example not in allowed:
            raise FieldError(f"{where}{key}[{i}] is {fields.shown(example)}, not {what}")
    return found


def _ids(found: Any, where: str, length: int) -> None:
    """`found`: `length` candidate ids."""
    if not isinstance(found, list) or len(found) != length or not all(map(fields.is_candidate_id, found)):
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


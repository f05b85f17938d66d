"""`CONFIG_STRATEGY="archive"`: a weighted candidate archive with parallel mutation.

A candidate is a delta vector and its scratchpad; its assessment is its fitness on the
training pool with per-example records. The seed candidate (the initial deltas) starts
the archive. Iteration t, top to bottom:
  1. select parents among the archive's viable members (correctness at least
     CONFIG_ARCHIVE_MIN_CORRECTNESS of the seed's): weight = quality sigmoid x novelty bonus;
  2. sample one issue batch per parent, by issue type (typed defects of single answers,
     each naming the cluster a single-cluster move turns);
  3. gather feedback memory: entries of earlier proposals near the parent's lineage;
  4. run the generators concurrently: every generator once per parent;
  5. pass the proposals through the post-check gate (range, already known, optionally a
     try on the parent's failing examples); rejections are archived with their reason;
  6. assess the survivors together, in one engine call, and append them to the archive;
  7. record the feedback entries and a snapshot.
The run's driver writes the state (iteration, RNG, the archive's newest candidate) after
every iteration; Ctrl+C, kill -9 and a rerun resume it, replaying the interrupted iteration.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from compressor_2.archive import SEED_STEP, Candidate, Lineage, Spot, genome_key
from compressor_2.common import say, timed
from compressor_2.config import MAX_LOGITS, Config, Reader, decimal, require, shown_number
from compressor_2.deltas import to_list
from compressor_2.fitness import Evaluation, Record
from compressor_2.reflector import MergeRequest, MutationRequest, VectorRequest, estimated_call_tokens
from compressor_2.resume import (
    CONCURRENCY, STEPS, Option, RunFiles, Score, StateFormat, compared, state_json, step_entry,
)
from compressor_2.run import Cost, NewCandidate, Report, Run, Strategy
from compressor_2.strategies import options_of
from compressor_2.strategies.archive.ops import (
    ARCHIVE_GENERATORS,
    FEEDBACK_SCOPES,
    ISSUE_TYPES,
    MAX_ISSUE_WEIGHT,
    MAX_NOVELTY_WEIGHT,
    MAX_POSTCHECK_MARGIN,
    MAX_SHARPNESS,
    ArchiveOptions,
    Issue,
    batch_target,
    feedback_scope,
    issues_of,
    midpoint_of,
    parent_weights,
    sample_issue_batch,
    sample_parents,
    viability_threshold,
)
from compressor_2.strategies.operators import append_summary, weighted_average

# Its log: the snapshots, its history entries, one JSON line per iteration.
FILES = RunFiles("archive_state.json", log="snapshots.jsonl", plot="archive_progress.png")
VIABILITY_META = "archive_viability"  # the archive's meta key of the viability rule, read by `show`
IDENTITY = (*compared("ARCHIVE_", "parents_per_iteration", "replace", "sharpness", "novelty_weight", "issue_batch",
                      "issue_weights", "generators", "feedback_scope", "feedback_depth", "postcheck_examples",
                      "postcheck_margin", "delta_limit", "min_correctness"),
            Option("ARCHIVE_MIDPOINT", lambda o: o.midpoint if o.midpoint_percentile is None
                   else f"p{o.midpoint_percentile:g}"),
            Option("ARCHIVE_ITERATIONS", attrgetter("iterations"), STEPS),
            *(Option(o.symbol, o.value, CONCURRENCY)
              for o in compared("ARCHIVE_", "generation_concurrency", "assessment_concurrency")))


def read_options(r: Reader) -> ArchiveOptions:
    midpoint = r.string("ARCHIVE_MIDPOINT")
    fixed, percentile = None, None
    if midpoint.startswith("p"):
        percentile = decimal(midpoint[1:])
        require(0 <= percentile <= 100, f"CONFIG_ARCHIVE_MIDPOINT={midpoint!r}: a percentile is p0 .. p100")
    else:
        # The sigmoid's exponent is sharpness x (fitness - midpoint), and a fitness lies in [0, 1];
        # that range is checked here, with a hint at the percentile form.
        fixed = r.number("ARCHIVE_MIDPOINT", -math.inf, math.inf)
        require(0 <= fixed <= 1, f"CONFIG_ARCHIVE_MIDPOINT={midpoint!r}: a fixed midpoint is a fitness in [0, 1] "
                 f"(or write p{midpoint} for a percentile of the archive's fitness values)")
    weights = _issue_weights(r)
    generators = tuple(g.strip() for g in r.string("ARCHIVE_GENERATORS").split(",") if g.strip())
    require(bool(generators) and all(g in ARCHIVE_GENERATORS for g in generators)
             and len(set(generators)) == len(generators),
             f"CONFIG_ARCHIVE_GENERATORS={','.join(generators)!r} must name some of "
             f"{', '.join(ARCHIVE_GENERATORS)}, each once")
    scope = r.string("ARCHIVE_FEEDBACK_SCOPE").strip()
    require(scope in FEEDBACK_SCOPES,
             f"CONFIG_ARCHIVE_FEEDBACK_SCOPE={scope!r} is unknown; use one of {', '.join(FEEDBACK_SCOPES)}")
    return ArchiveOptions(
        iterations=r.integer("ARCHIVE_ITERATIONS"),
        parents_per_iteration=r.integer("ARCHIVE_PARENTS_PER_ITERATION"),
        replace=r.flag("ARCHIVE_REPLACE"),
        sharpness=r.number("ARCHIVE_SHARPNESS", 0, MAX_SHARPNESS, above=True),
        midpoint=fixed,
        midpoint_percentile=percentile,
        novelty_weight=r.number("ARCHIVE_NOVELTY_WEIGHT", 0, MAX_NOVELTY_WEIGHT),
        min_correctness=r.number("ARCHIVE_MIN_CORRECTNESS", 0, 1),
        issue_batch=r.integer("ARCHIVE_ISSUE_BATCH"),
        issue_weights=tuple(weights),
        generators=generators,
        generation_concurrency=r.integer("ARCHIVE_GENERATION_CONCURRENCY"),
        assessment_concurrency=r.integer("ARCHIVE_ASSESSMENT_CONCURRENCY"),
        feedback_scope=scope,
        feedback_depth=r.integer("ARCHIVE_FEEDBACK_DEPTH"),
        postcheck_examples=r.integer("ARCHIVE_POSTCHECK_EXAMPLES"),
        postcheck_margin=r.number("ARCHIVE_POSTCHECK_MARGIN", 0, MAX_POSTCHECK_MARGIN),
        delta_limit=r.number("ARCHIVE_DELTA_LIMIT", 0, MAX_LOGITS, above=True),
    )


def _issue_weights(r: Reader) -> list[tuple[str, float]]:
    """CONFIG_ARCHIVE_ISSUE_WEIGHTS as (type, weight) pairs, each type once."""
    weights: list[tuple[str, float]] = []
    given: dict[str, str] = {}  # type -> the part that gave its weight
    for part in filter(None, (p.strip() for p in r.string("ARCHIVE_ISSUE_WEIGHTS").split(","))):
        name, _, value = part.partition("=")
        weight = decimal(value.strip())
        require(name.strip() in ISSUE_TYPES and 0 <= weight <= MAX_ISSUE_WEIGHT,
                 f"CONFIG_ARCHIVE_ISSUE_WEIGHTS has {part!r}: write type=weight with a type among "
                 f"{', '.join(ISSUE_TYPES)} and a weight in [0, {shown_number(MAX_ISSUE_WEIGHT)}]")
        require(name.strip() not in given,
                 f"CONFIG_ARCHIVE_ISSUE_WEIGHTS names {name.strip()} more than once ({given.get(name.strip())!r} and "
                 f"{part!r}): give each issue type one weight")
        given[name.strip()] = part
        weights.append((name.strip(), weight))
    require(any(w > 0 for _, w in weights), "CONFIG_ARCHIVE_ISSUE_WEIGHTS gives no issue type a weight above 0")
    return weights



def estimate(config: Config, n_examples: int) -> Cost:
    options = options_of(config, "archive")
    proposals = options.parents_per_iteration * len(options.generators)
    calls = proposals if config.reflector != "local" else 0.0
    per_proposal = n_examples + min(options.postcheck_examples, n_examples)
    return Cost("iteration", n_examples, proposals * per_proposal,
                calls * estimated_call_tokens(config, options.issue_batch))


def make(run: Run) -> Archive:
    return Archive(run, options_of(run.config, "archive"))


def iteration(a: Archive, t: int) -> Report:
    options, seconds = a.options, {}
    members, lineage = a.members(), a.run.archive.lineage()  # nothing joins the archive before step 6
    viable = a.viable(members)  # only these can become parents

    # 1. Select parents from the archive's viable members: quality x novelty.
    with timed(seconds, "selection"):
        parents = a.select_parents(viable, lineage)

    # 2. Sample an issue batch, by issue type, once per parent; its generators share it.
    # 3. Gather feedback memory.
    with timed(seconds, "selection"):
        jobs = []
        for i, parent in enumerate(parents):
            issues = sample_issue_batch(a.issues(parent), dict(options.issue_weights), options.issue_batch, a.rng)
            feedback = a.feedback_for(parent, lineage)
            jobs += [Job(t, i * len(options.generators) + k, parent, generator, issues, feedback,
                         a.partner_for(parent, viable, lineage) if generator == "crossover" else None)
                     for k, generator in enumerate(options.generators)]

    # 4. Run the generators concurrently (CONFIG_ARCHIVE_GENERATION_CONCURRENCY at a time).
    with timed(seconds, "generation"):
        proposals = list(a.generation_pool.map(a.generate, jobs))

    # 5. The post-check gate; rejections go to the archive with their reason.
    with timed(seconds, "postcheck"):
        survivors = a.postcheck(t, [p for p in proposals if p is not None])

    # 6. Assess the survivors together and append them to the archive.
    with timed(seconds, "assessment"):
        accepted = a.assess(t, survivors)

    # 7. Feedback entries and a snapshot.
    made = [p for p in proposals if p is not None]
    return a.record(t, len(jobs) - len(made), len(made), len(made) - len(survivors), accepted, seconds)


@dataclass(frozen=True)
class Job:
    iteration: int
    index: int  # its place in the iteration: the child index of its reflector calls
    parent: Candidate
    generator: str
    issues: list[Issue]
    feedback: tuple[str, ...]
    partner: Candidate | None


@dataclass(frozen=True)
class Proposal:
    job: Job
    deltas: dict[str, float]
    scratchpad: str
    operator: str
    parents: tuple[int, ...]
    change: str  # the change summary


@dataclass(frozen=True)
class NoState:
    """The archive strategy keeps nothing of its own between iterations: the archive is its
    state, and the driver keeps the iteration and the RNG."""


class Archive(Strategy):
    """The strategy's services over the run archive: selection, generators, gate,
    assessment, records."""

    step_name, steps_symbol, proposer = "iteration", "CONFIG_ARCHIVE_ITERATIONS", "the reflector"
    progress_plot = FILES.plot
    state_format = StateFormat(FILES, "iteration", ("random",), lambda raw: NoState(), state_json)

    def __init__(self, run: Run, options: ArchiveOptions) -> None:
        self.run, self.options = run, options
        self.steps = options.iterations
        self.rng = random.Random(run.config.seed)
        self.generation_pool = run.workers.pool(options.generation_concurrency, "generator")
        self.gold_tokens = run.gold_tokens
        self._records: dict[int, Evaluation] = {}
        self.threshold = 0.0  # the least correctness of a viable candidate (`settle_viability`)

    def rngs(self) -> Mapping[str, Any]:
        return {"random": self.rng}

    def start(self) -> None:
        self.seed()
        self.settle_viability()
        say(f"evolving an archive for {self.options.iterations} iterations on {len(self.run.examples)} training "
            f"examples ({self.options.parents_per_iteration} parents x {len(self.options.generators)} generators "
            "per iteration)")

    def restore(self, own: NoState, t: int) -> None:
        del own, t
        self.settle_viability()

    def own_state(self) -> NoState:
        return NoState()

    def step(self, t: int) -> Report:
        return iteration(self, t)

    # -- the archive's members ----------------------------------------------------------

    def members(self) -> list[Candidate]:
        return self.run.archive.assessed()

    def evaluation(self, candidate: Candidate) -> Evaluation:
        """Its records on the pool, served from the cache (no metric call)."""
        assert candidate.id is not None
        if candidate.id not in self._records:
            [self._records[candidate.id]] = self.run.evaluate([to_list(candidate.deltas)], "archive records")
        return self._records[candidate.id]

    def seed(self) -> None:
        """The seed candidate: the initial deltas, assessed on the pool."""
        [evaluation] = self.run.evaluate([to_list(self.run.initial)], "seed candidate")
        [seed] = self.run.admit(SEED_STEP, [NewCandidate(self.run.initial, "", "initial", (), 0, evaluation,
                                                      spot=Spot(0, "cand", 0))])
        assert seed.id is not None
        self._records[seed.id] = evaluation

    def settle_viability(self) -> None:
        """Viability: correctness at least CONFIG_ARCHIVE_MIN_CORRECTNESS times the
        seed candidate's. The rule and its threshold go to the archive's meta for `show`."""
        [seed] = self.run.archive.initial()
        self.threshold = viability_threshold(self.options.min_correctness, seed.correctness or 0.0)
        self.run.archive.set_meta({VIABILITY_META: json.dumps({
            "min_correctness": self.options.min_correctness, "seed_correctness": seed.correctness,
            "threshold": self.threshold})})

    def viable(self, members: Sequence[Candidate]) -> list[Candidate]:
        return [m for m in members if (m.correctness or 0.0) >= self.threshold]

    # -- 1. parents -----------------------------------------------------------------------

    def weights(self, members: Sequence[Candidate], lineage: Lineage) -> list[float]:
        scores = [m.fitness or 0.0 for m in members]
        midpoint = midpoint_of(scores, self.options.midpoint, self.options.midpoint_percentile)
        return parent_weights(scores, [lineage.children_count(m.id) for m in members if m.id is not None],
                              self.options.sharpness, midpoint, self.options.novelty_weight)

    def select_parents(self, members: Sequence[Candidate], lineage: Lineage) -> list[Candidate]:
        chosen = sample_parents([m.id for m in members if m.id is not None], self.weights(members, lineage),
                                self.options.parents_per_iteration, self.options.replace, self.rng)
        by_id = {m.id: m for m in members}
        return [by_id[c] for c in chosen]

    def partner_for(self, parent: Candidate, members: Sequence[Candidate], lineage: Lineage) -> Candidate | None:
        """Crossover's second parent: another member, by the same weights."""
        others = [m for m in members if m.id != parent.id]
        if not others:
            return None
        [pick] = sample_parents([m.id for m in others if m.id is not None], self.weights(others, lineage), 1, True,
                                self.rng)
        return next(m for m in others if m.id == pick)

    # -- 2. issues, 3. feedback -----------------------------------------------------------

    def issues(self, parent: Candidate) -> list[Issue]:
        tokens = self.run.answer_tokens
        return issues_of(self.evaluation(parent).records, self.gold_tokens,
                         lambda r: tokens.padding(r.answer, r.gold), self.run.cluster_ids)

    def feedback_for(self, parent: Candidate, lineage: Lineage) -> tuple[str, ...]:
        assert parent.id is not None
        scope = feedback_scope(lineage.graph, parent.id, self.options.feedback_scope,
                               self.options.feedback_depth)
        return tuple(f"#{c} from #{p} by {g}: {change} -> {outcome}"
                     for c, p, _, g, change, outcome in self.run.archive.feedback(scope))

    # -- 4. generators ----------------------------------------------------------------------

    def generate(self, job: Job) -> Proposal | None:
        return GENERATORS[job.generator](self, job)

    def request_records(self, job: Job) -> list[Record]:
        """The sampled issues' answers, each labelled with its issue; the whole pool when the
        parent has no issue left."""
        if not job.issues:
            return list(self.evaluation(job.parent).records)
        return [Record(i.record.id, i.record.question, i.record.answer, i.record.gold, i.record.tokens,
                       i.record.is_correct, f"[{i.type}, gold {i.gold_tokens} tokens] {i.record.reasoning}")
                for i in job.issues]

    # -- 5. the gate ------------------------------------------------------------------------

    def postcheck(self, t: int, proposals: Sequence[Proposal]) -> list[Proposal]:
        known = self.run.archive.genomes()
        survivors, rejected = [], []
        for p in proposals:
            key = genome_key(to_list(p.deltas))
            values = list(p.deltas.values())
            if not all(math.isfinite(v) and abs(v) <= self.options.delta_limit for v in values):
                rejected.append((p, f"a delta outside [-{self.options.delta_limit:g}, {self.options.delta_limit:g}]"))
            elif key in known:
                rejected.append((p, "its genome is already in the archive or in another proposal of this iteration"))
            else:
                known.add(key)
                survivors.append(p)
        if self.options.postcheck_examples and survivors:
            survivors = self._try_on_failures(survivors, rejected)
        if rejected:
            added = self.run.admit(t, [self.candidate(t, p, "rejected", why) for p, why in rejected])
            self.run.archive.record_feedback([
                (c.id, p.job.parent.id, t, p.job.generator, p.change, f"rejected by the post-check: {c.note}")
                for c, (p, _) in zip(added, rejected) if c.id is not None and p.job.parent.id is not None])
        return survivors

    def _try_on_failures(self, survivors: list[Proposal],
                         rejected: list[tuple[Proposal, str]]) -> list[Proposal]:
        """Each survivor on up to N examples where its parent failed or padded: worse than the
        parent there by more than the margin (summed per-example score) is rejected."""
        kept = []
        for p in survivors:
            parent = self.evaluation(p.job.parent)
            failing = {i.record.id for i in self.issues(p.job.parent)}
            chosen = [i for i, r in enumerate(parent.records) if r.id in failing][:self.options.postcheck_examples]
            if not chosen:
                kept.append(p)
                continue
            examples = [self.run.examples[i] for i in chosen]
            [tried] = self.run.evaluate([to_list(p.deltas)], "post-check", examples)
            before, after = sum(parent.scores[i] for i in chosen), sum(tried.scores)
            if after < before - self.options.postcheck_margin:
                rejected.append((p, f"on {len(chosen)} examples its parent failed or padded it scores "
                                    f"{after:.4f} against the parent's {before:.4f}"))
            else:
                kept.append(p)
        return kept

    # -- 6. assessment ----------------------------------------------------------------------

    def assess(self, t: int, survivors: Sequence[Proposal]) -> list[tuple[Proposal, Candidate, Evaluation]]:
        size = self.options.assessment_concurrency
        evaluations: list[Evaluation] = []
        for i in range(0, len(survivors), size):
            evaluations += self.run.evaluate([to_list(p.deltas) for p in survivors[i:i + size]],
                                             f"iteration {t} proposals")
        added = self.run.admit(t, [self.candidate(t, p, "evaluated", "", e, Spot(t + 1, "cand", i))
                                   for i, (p, e) in enumerate(zip(survivors, evaluations))])
        for c, e in zip(added, evaluations):
            assert c.id is not None
            self._records[c.id] = e
        return list(zip(survivors, added, evaluations))

    def candidate(self, t: int, p: Proposal, status: str, note: str, evaluation: Evaluation | None = None,
                  spot: Spot | None = None) -> NewCandidate:
        return NewCandidate(p.deltas, p.scratchpad, p.operator, p.parents, t + 1, evaluation, status, note, spot)

    # -- 7. records -------------------------------------------------------------------------

    def record(self, t: int, skipped: int, proposed: int, rejected: int,
               accepted: Sequence[tuple[Proposal, Candidate, Evaluation]], seconds: dict[str, float]) -> Report:
        """The feedback entries and the iteration's snapshot (its history entry). `skipped`:
        generator calls that gave no proposal (the reflector's replies were invalid twice,
        or a crossover found no partner)."""
        entries = []
        for p, c, e in accepted:
            parent = self.evaluation(p.job.parent)
            entries.append((c.id, p.job.parent.id, t, p.job.generator, p.change,
                            f"fitness {parent.fitness:.4f} -> {e.fitness:.4f} ({e.fitness - parent.fitness:+.4f}), "
                            f"tokens {parent.mean_tokens:.1f} -> {e.mean_tokens:.1f}, correct "
                            f"{100 * parent.correctness:.1f}% -> {100 * e.correctness:.1f}%"))
        self.run.archive.record_feedback(entries)
        snapshot = {**self.census(t), "proposals": proposed, "skipped": skipped,
                    "rejected": rejected, "accepted": len(accepted), "seconds": seconds}
        snapshot.update(zip(("metric_calls", "reflector_calls", "reflector_tokens"), self.spent()))
        return Report([snapshot], f"iteration {t + 1} of {self.options.iterations}: archive "
                                  f"{snapshot['archive_size']} ({snapshot['viable']} viable)  best "
                                  f"{snapshot['best_fitness']:.4f}  p50 {snapshot['p50']:.4f}  proposals {proposed} "
                                  f"(rejected {rejected}, accepted {len(accepted)}; {skipped} generator calls without "
                                  f"one)  metric calls {snapshot['metric_calls']}  elapsed "
                                  f"{self.run.budget.seconds():.0f}s")

    def census(self, t: int) -> dict[str, Any]:
        """The archive's members as iteration t's snapshot counts them."""
        members = self.members()
        scored = [Score(m.fitness or 0.0, m.mean_tokens or 0.0, m.correctness or 0.0) for m in members]
        best = max(members, key=lambda m: (m.fitness or 0.0, -(m.id or 0)))
        return {**step_entry(t, scored, self.run.best.fitness, percentiles=True), "archive_size": len(members),
                "best_candidate": best.id, "viable": len(self.viable(members))}

    def spent(self) -> tuple[int, int, int]:
        """(metric calls, reflector calls, reflector tokens) so far."""
        calls, prompt, completion = self.run.archive.reflector_tokens()
        return self.run.archive.metric_calls(), calls, prompt + completion


# -- generators: (archive, job) -> a proposal, or None when the reflector gave none --------

def cluster_generator(a: Archive, job: Job) -> Proposal | None:
    """The single-cluster mutation of the cluster the sampled issue batch names
    (`batch_target`): any cluster, e.g. the one whose tokens pad the batch's answers most."""
    evaluation = a.evaluation(job.parent)
    target = batch_target(job.issues, a.run.cluster_ids)
    result = a.run.reflector.mutate(MutationRequest(
        job.iteration, job.index, target, dict(job.parent.deltas), job.parent.scratchpad, evaluation.fitness,
        a.request_records(job), job.parent.id, job.feedback))
    if result.delta is None:
        return None
    deltas = {**job.parent.deltas, target: result.delta}
    return Proposal(job, deltas, result.scratchpad, "mutation", (job.parent.id or 0,),
                    f"cluster {target}: {job.parent.deltas[target]:.4f} -> {result.delta:.4f} "
                    f"({', '.join(sorted({i.type for i in job.issues})) or 'no issue'})")


def vector_generator(a: Archive, job: Job) -> Proposal | None:
    """The full-vector mutation (every delta at once) on the sampled issues."""
    evaluation = a.evaluation(job.parent)
    result = a.run.reflector.mutate_vector(VectorRequest(
        job.iteration, job.index, dict(job.parent.deltas), job.parent.scratchpad, evaluation.fitness,
        a.request_records(job), job.parent.id, job.feedback))
    if result.deltas is None:
        return None
    moved = [f"{k} {job.parent.deltas[k]:.2f}->{v:.2f}" for k, v in result.deltas.items()
             if v != job.parent.deltas[k]]
    return Proposal(job, result.deltas, append_summary(job.parent.scratchpad, result.summary), "vector_mutation",
                    (job.parent.id or 0,), f"vector: {', '.join(moved)}")


def crossover_generator(a: Archive, job: Job) -> Proposal | None:
    """The fitness-weighted average with another archive member, scratchpads merged."""
    partner = job.partner
    if partner is None or partner.id is None or job.parent.id is None:
        return None
    fa, fb = job.parent.fitness or 0.0, partner.fitness or 0.0
    ids = list(job.parent.deltas)
    child = weighted_average(to_list(job.parent.deltas), to_list(partner.deltas), fa, fb)
    merged = a.run.reflector.merge(MergeRequest(job.iteration, job.index, (job.parent.id, partner.id),
                                                job.parent.scratchpad, fa, partner.scratchpad, fb,
                                                (job.parent.id, partner.id)))
    return Proposal(job, dict(zip(ids, child)), merged.scratchpad, "crossover", (job.parent.id, partner.id),
                    f"crossover of #{job.parent.id} ({fa:.4f}) and #{partner.id} ({fb:.4f})")


GENERATORS: dict[str, Callable[[Archive, Job], Proposal | None]] = {
    "cluster": cluster_generator, "vector": vector_generator, "crossover": crossover_generator,
}

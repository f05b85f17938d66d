"""`CONFIG_STRATEGY="ga"`: the genetic algorithm as a DEAP loop, to be read top to bottom.

Generation g:
  1. evaluate every individual without a valid fitness, all in one engine call, and
     clone the elites right away;
  2. select 2 x (population - elitism) parents: tournament or truncation, or (LLM selection)
     drawn from the 2 to 5 members one reflector call chose, with its reasons;
  3. pair them; each pair gives ONE child: with CXPB by crossover (fitness-weighted
     deltas, reflector-merged scratchpad), otherwise as a clone of A or B (50/50);
     evaluate all children together (clones come from the cache);
  4. with MUTPB mutate a child in place (round-robin target cluster, the reflector's
     new delta; or, with CONFIG_MUTATION_SCOPE="vector", every delta at once)
     and evaluate the mutated children again, together;
  5. next population = elites + children.
Every child and every mutated child becomes a candidate of the run archive, with its
parents and operator; the tree's seed node ids are its placements. The run's driver
(run/driver.py) writes the state, history, tree and plots after every generation and
checks the budgets; a resume restores the round-robin index before mutate is registered
and replays the interrupted generation from the same RNG state, with the answers the
archive already holds.

evolution_state.json is the one state format's (resume/state.py: `generation`,
`rng`, `last_candidate_id`, `best_individual`, `best_fitness`) with the GA's own fields:
`population` [{candidate_id, deltas, scratchpad}], candidates the archive holds with the
same deltas, and `rr_idx`, the round robin's next mutation target.

Its options (CONFIG_POPULATION_SIZE, CONFIG_NGEN, ...) have no defaults, so a config that
leaves one at its sentinel (-1 or "") is refused; a tournament size or truncation top-k
lies in [2, population], and is set only when a selection draws by it. No Kconfig menu
depends on its entry, so every config sets them and they are checked whatever the strategy.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

from deap import base, tools

from compressor_2.archive import SEED_STEP, Placement, RunArchive, Spot
from compressor_2.common import answers_bar, ordinal, say
from compressor_2.config import Config, Reader, require
from compressor_2.deltas import to_dict, to_list, visiting_order
from compressor_2.reflector import PopulationMember, Selected, SelectionRequest, estimated_call_tokens
from compressor_2.resume import (
    GLOBAL_RNGS,
    STEPS,
    FieldError,
    Member,
    Option,
    RunFiles,
    StateFormat,
    StepEntry,
    Work,
    compared,
    fields,
    read_member,
    seed_rng,
    state_json,
    step_entry,
    work_entry,
)
from compressor_2.run import Cost, NewCandidate, Report, Run
from compressor_2.strategies import options_of
from compressor_2.strategies.ga.individual import initial_population, invalidate, make_toolbox
from compressor_2.strategies.ga.operators import SELECTIONS, GaOptions, RRState, make_fallback, make_selection, pairs
from compressor_2.strategies.individual import Individual, new_individual

FILES = RunFiles("evolution_state.json")
SENTINELS = ("POPULATION_SIZE", "NGEN", "CXPB", "MUTPB", "ELITISM_SIZE", "SELECTION")
FALLBACK_SELECTIONS = ("tournament", "truncation")
MUTATION_SCOPES = ("cluster", "vector")
MAX_POPULATION = 100_000
MAX_STEPS = 1_000_000  # generations (Kconfig's ranges bound the other strategies' step counts)
IDENTITY = (*compared("", "population_size", "cxpb", "mutpb", "elitism_size", "selection", "selection_fallback",
                      "tournament_size", "truncation_top_k", "mutation_scope"),
            Option("NGEN", attrgetter("ngen"), STEPS))


def read_options(r: Reader) -> GaOptions:
    population = r.integer("POPULATION_SIZE", 2, MAX_POPULATION)
    ngen = r.integer("NGEN", 1, MAX_STEPS)
    elitism = r.integer("ELITISM_SIZE")
    require(0 <= elitism < population,
            f"CONFIG_ELITISM_SIZE={elitism} must satisfy 0 <= elitism < population ({population})")
    cxpb, mutpb = r.number("CXPB", 0, 1), r.number("MUTPB", 0, 1)
    selection = r.string("SELECTION").strip()
    require(selection in SELECTIONS,
            f"CONFIG_SELECTION={selection!r} is unknown; use one of {', '.join(SELECTIONS)}")
    fallback = _fallback(r) if selection == "llm" else None
    drawn = {selection, fallback}
    sizes = {"TOURNAMENT_SIZE": "tournament", "TRUNCATION_TOP_K": "truncation"}
    used = {name: _selection_size(r, name, population) for name, kind in sizes.items() if kind in drawn}
    for name, kind in sizes.items():
        # A size no selection reads is a sign that the selection is not the one meant.
        require(name in used or r.integer(name) == -1,
                f"CONFIG_{name}={r.integer(name)} is set but no selection draws by {kind} "
                f"(CONFIG_SELECTION={selection!r}"
                f"{f', CONFIG_SELECTION_FALLBACK={fallback!r}' if fallback else ''}): set it to -1 (unset)")
    scope = r.string("MUTATION_SCOPE").strip()
    require(scope in MUTATION_SCOPES,
            f"CONFIG_MUTATION_SCOPE={scope!r} is unknown; use one of {', '.join(MUTATION_SCOPES)}")
    return GaOptions(population, ngen, cxpb, mutpb, elitism, selection, fallback, used.get("TOURNAMENT_SIZE"),
                     used.get("TRUNCATION_TOP_K"), scope)


def _fallback(r: Reader) -> str:
    fallback = r.string("SELECTION_FALLBACK").strip()
    require(fallback != "", 'CONFIG_SELECTION_FALLBACK is not set but CONFIG_SELECTION="llm" needs it '
            f"(one of {', '.join(FALLBACK_SELECTIONS)})")
    require(fallback in FALLBACK_SELECTIONS, f"CONFIG_SELECTION_FALLBACK={fallback!r} is unknown; use one of "
            f"{', '.join(FALLBACK_SELECTIONS)}")
    return fallback


def _selection_size(r: Reader, name: str, population: int) -> int:
    value = r.integer(name)
    require(value != -1, f"CONFIG_{name} is not set (still at its sentinel -1) but CONFIG_SELECTION "
            "(or CONFIG_SELECTION_FALLBACK) needs it")
    require(2 <= value <= population, f"CONFIG_{name}={value} must be in [2, population] = [2, {population}]")
    return value


def estimate(config: Config, n_examples: int) -> Cost:
    """The initial population is one genome cloned; then per generation every crossover
    child and every mutated child is a new genome (clones are cache hits)."""
    options = options_of(config, "ga")
    new_genomes = (options.population_size - options.elitism_size) * (options.cxpb + options.mutpb)
    calls = new_genomes + (options.selection == "llm") if config.reflector != "local" else 0.0
    return Cost("generation", n_examples, new_genomes * n_examples,
                calls * estimated_call_tokens(config, n_examples))


def make(run: Run) -> Ga:
    return Ga(run)


def generation(ga: Ga, g: int) -> Report:
    run, options, toolbox, population = ga.run, ga.options, ga.toolbox, ga.population
    n_children = options.population_size - options.elitism_size
    index = {id(ind): i for i, ind in enumerate(population)}
    with ga.tally() as work:
        # 1. Evaluate all (only genomes without a valid fitness cost anything), then the elites.
        ga.evaluate([ind for ind in population if not ind.fitness.valid], work, f"gen {g} population")
        stats = ga.stats(g, population)
        elites = [toolbox.clone(ind) for ind in tools.selBest(population, options.elitism_size)]

        # 2. Selection: 2 x (population - elitism) parents, references into `population`.
        if options.selection == "llm":
            parents, work.selection = ga.select_by_reflector(population, 2 * n_children, g)
        else:
            parents = toolbox.select(population, 2 * n_children)
        work.parents = len(parents)

        # 3. One child per pair. Every random draw happens here, in pair order, before any
        # reflector call; the merges then run concurrently.
        plans = []
        for j, (a, b) in enumerate(pairs(parents)):
            crossover = random.random() < options.cxpb
            plans.append((j, a, b, None if crossover else (a if random.random() < 0.5 else b)))

        def make_child(plan: tuple[int, Individual, Individual, Individual | None]) -> Individual:
            j, a, b, clone_of = plan
            if clone_of is None:
                return toolbox.mate(a, b, generation=g, child=j, parents=(index[id(a)], index[id(b)]))
            child = toolbox.clone(clone_of)
            invalidate(child)
            return child

        children = list(run.pool.map(make_child, plans))
        work.children, work.crossovers = len(children), sum(plan[3] is None for plan in plans)
        work.clones = work.children - work.crossovers
        ga.evaluate(children, work, f"gen {g} offspring")
        ga.admit(g, children, "pre", range(len(children)),
                 [("crossover", (a, b)) if clone_of is None else ("clone", (clone_of,)) for _, a, b, clone_of in plans])

        # 4. Mutation with MUTPB: targets are drawn in offspring order as mutate is called;
        # the reflector calls run concurrently and change the children in place.
        chosen = [j for j in range(len(children)) if random.random() < options.mutpb]
        before = {j: children[j].candidate_id for j in chosen}
        futures = [toolbox.mutate(children[j], generation=g, child=j) for j in chosen]
        mutated = [j for j, future in zip(chosen, futures) if future.result().changed]
        work.mutations, work.mutations_skipped = len(mutated), len(chosen) - len(mutated)
        ga.evaluate([children[j] for j in mutated], work, f"gen {g} mutated")
        ga.admit(g, [children[j] for j in mutated], "mut", mutated, [("mutation", (before[j],)) for j in mutated])

        # 5. Replace: cloned elites first, then the children.
        ga.population = elites + children
        run.admit(g, placements=[Placement(ind.candidate_id, Spot(g + 1, "pop", i))
                                 for i, ind in enumerate(ga.population)])
    return ga.report(g, stats, work)


class Ga:
    """The GA's decisions over the DEAP population; the driver runs the loop."""

    step_name, steps_symbol, proposer, progress_plot = "generation", "CONFIG_NGEN", "the reflector", None

    def __init__(self, run: Run) -> None:
        self.run, self.options = run, options_of(run.config, "ga")
        self.steps = self.options.ngen
        self.state_format = ga_format(run.out, run.cluster_ids, self.options.population_size)
        self.rr_state = RRState(visiting_order(run.cluster_ids))
        self.toolbox = base.Toolbox()  # the operators, registered once rr_idx holds its value
        self.population: list[Individual] = []

    def rngs(self) -> dict[str, Any]:
        return GLOBAL_RNGS

    def start(self) -> None:
        """The initial deltas cloned; each clone is an "initial" candidate."""
        run, options = self.run, self.options
        self.toolbox = self._toolbox()
        initial = to_list(run.initial)
        self.population = initial_population(initial, options.population_size)
        made = run.admit(SEED_STEP, [NewCandidate(to_dict(ind, run.cluster_ids), ind.scratchpad, "initial", (), 0,
                                               spot=Spot(0, "pop", i)) for i, ind in enumerate(self.population)])
        for ind, candidate in zip(self.population, made):
            ind.candidate_id = candidate.id
        seed_rng(run.config.seed)
        say(f"evolving {options.population_size} individuals for {options.ngen} generations on "
            f"{len(run.examples)} training examples ({run.config.engine} engine, {run.config.reflector} reflector)")

    def restore(self, own: GaState, t: int) -> None:
        """The saved population, its fitness served from the archive (sampled afresh when
        CONFIG_TEMPERATURE > 0, and then a member that now beats the stored best replaces
        it)."""
        self.rr_state.rr_idx = own.rr_idx  # before mutate is registered: the targets go on where they stopped
        self.toolbox = self._toolbox()
        self.population = [new_individual(to_list(m.deltas), m.scratchpad, m.candidate_id) for m in own.population]
        self.toolbox.evaluate(self.population)
        # A stop inside generation 0's first evaluation left the initial candidates without
        # the fitness that generation would have recorded: the replay no longer evaluates them.
        made = self.run.archive.among([ind.candidate_id for ind in self.population])
        self.run.assess([(self.member(ind), ind.evaluation) for ind in self.population
                         if made[ind.candidate_id].fitness is None])
        self.run.best.consider([(self.member(ind), ind.evaluation) for ind in self.population])

    def own_state(self) -> GaState:
        return GaState(tuple(self.member(ind) for ind in self.population), self.rr_state.rr_idx)

    def step(self, t: int) -> Report:
        return generation(self, t)

    def closing(self, t: int) -> list[StepEntry]:
        """The history ends with the population entering generation t."""
        if not all(ind.fitness.valid for ind in self.population):
            return []
        return [work_entry(self.stats(t, self.population), Work())]

    def _toolbox(self) -> base.Toolbox:
        return make_toolbox(self.run.evaluator, self.run.reflector, make_selection(self.options),
                            make_fallback(self.options), self.rr_state, self.run.cluster_ids, self.run.pool,
                            self.options.mutation_scope)

    @contextmanager
    def tally(self) -> Iterator[Work]:
        """What the block does to the run: its metric calls, reflector calls and tokens, seconds."""
        run, work = self.run, Work()
        usage, calls, started = run.reflector.usage, run.evaluator.stats.metric_calls, time.perf_counter()
        yield work
        now = run.reflector.usage
        work.metric_calls = run.evaluator.stats.metric_calls - calls
        work.reflector_calls = now.calls - usage.calls
        work.reflector_prompt_tokens = now.prompt_tokens - usage.prompt_tokens
        work.reflector_completion_tokens = now.completion_tokens - usage.completion_tokens
        work.seconds = round(time.perf_counter() - started, 3)

    def evaluate(self, individuals: Sequence[Individual], work: Work, label: str) -> None:
        """toolbox.evaluate on all `individuals` at once; those already in the archive (the
        initial population) get their fitness recorded there and are offered as best."""
        if not individuals:
            return
        stats = self.run.evaluator.stats
        run_before, hits_before = stats.evaluations_run, stats.cache_hits
        with answers_bar(len(individuals) * len(self.run.examples), label) as bar:
            self.toolbox.evaluate(individuals, bar.update)
        work.evaluations_run += stats.evaluations_run - run_before
        work.cache_hits += stats.cache_hits - hits_before
        self.run.assess([(self.member(ind), ind.evaluation) for ind in individuals if ind.candidate_id is not None])

    def admit(self, g: int, individuals: Sequence[Individual], stage: str, positions: Sequence[int],
              origins: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """New candidates for the evaluated `individuals`, made by (operator, parents), in
        order (so a replayed generation gives them the same ids), each at its `stage` node
        of offspring position j."""
        ids = self.run.cluster_ids
        made = self.run.admit(g, [
            NewCandidate(to_dict(ind, ids), ind.scratchpad, operator,
                     tuple(p if isinstance(p, int) else p.candidate_id for p in parents), g, ind.evaluation,
                     spot=Spot(g, stage, j))
            for ind, j, (operator, parents) in zip(individuals, positions, origins)])
        for ind, candidate in zip(individuals, made):
            ind.candidate_id = candidate.id

    def select_by_reflector(self, population: Sequence[Individual], k: int,
                            g: int) -> tuple[list[Individual], dict[str, Any]]:
        """LLM selection: one reflector call chooses 2 to 5 members, with reasons and categories;
        `k` parents are drawn from them (toolbox.select: uniform, with replacement). Two
        invalid replies: CONFIG_SELECTION_FALLBACK draws from the whole population. The
        choice goes to the archive and, returned, to the history."""
        by_id = {ind.candidate_id: ind for ind in population}
        result = self.run.reflector.select(SelectionRequest(g, tuple(self.shown(ind) for ind in by_id.values())))
        if result.selections:
            chosen, summary, fallback = result.selections, result.summary, None
            parents_drawn = self.toolbox.select([by_id[s.candidate_id] for s in chosen], k)
        else:
            fallback = "; ".join(result.rejected)
            parents_drawn = self.toolbox.fallback(population, k)
            chosen = tuple(Selected(cid, f"auto-selected: {fallback}", "performance")
                           for cid in dict.fromkeys(p.candidate_id for p in parents_drawn))
            summary = f"auto-selected by {self.options.selection_fallback}: the selector's reply was invalid twice"
        self.run.archive.record_selection(g, [(s.candidate_id, s.category, s.reasoning) for s in chosen], summary,
                                          fallback)
        return parents_drawn, {"selections": [{"candidate_id": s.candidate_id, "category": s.category,
                                               "reasoning": s.reasoning} for s in chosen],
                               "summary": summary, "fallback": fallback}

    def shown(self, ind: Individual) -> PopulationMember:
        """A member as the selector sees it: its numbers, deltas, scratchpad and making."""
        archive = self.run.archive
        made = archive.candidate(ind.candidate_id)
        assert made is not None
        parents = [p.fitness for p in map(archive.candidate, made.parents) if p is not None and p.fitness is not None]
        return PopulationMember(ind.candidate_id, ind.evaluation.fitness, ind.evaluation.mean_tokens,
                                ind.evaluation.correctness, to_dict(ind, self.run.cluster_ids), ind.scratchpad,
                                made.operator, made.parents, max(parents) if parents else None)

    def best_so_far(self) -> float | None:
        """The best fitness among the archive's candidates: what the history reports. After
        a resume the best-ever may come from the generation being replayed (its files are
        kept), but the history, like the archive, only knows what has been made again."""
        best = self.run.archive.best()
        return best.fitness if best is not None else self.run.best.fitness

    def stats(self, g: int, population: Sequence[Individual]) -> StepEntry:
        """The history's fields of the population entering generation g."""
        return step_entry(g, [ind.evaluation for ind in population], self.best_so_far())

    def member(self, ind: Individual) -> Member:
        return Member(to_dict(ind, self.run.cluster_ids), ind.scratchpad, ind.candidate_id)

    def report(self, g: int, stats: StepEntry, work: Work) -> Report:
        """Generation g's history entries (the population it saw and the work it did; the
        population it leaves) and its line."""
        final = self.stats(g + 1, self.population)
        return Report([work_entry(stats, work), work_entry(final, Work())],
                      generation_line(g, self.options.ngen, final, work_entry(stats, work), self.run.budget.seconds()))


def generation_line(generation: int, ngen: int, stats: StepEntry, work: Mapping[str, Any],
                    elapsed: float) -> str:
    return (f"gen {ordinal(generation, ngen)}: best {stats['best_fitness']:.4f}  "
            f"mean {stats['mean_fitness']:.4f}  tokens {stats['mean_tokens']:.1f}  "
            f"correct {100 * stats['correctness']:.0f}%  best ever {stats['best_ever_fitness']:.4f}  "
            f"evals {work['evaluations_run']} (+{work['cache_hits']} cached)  "
            f"reflector {work['reflector_calls']} calls  elapsed {elapsed:.0f}s")


@dataclass(frozen=True)
class GaState:
    population: tuple[Member, ...]
    rr_idx: int


def ga_format(out: Path, cluster_ids: Sequence[str], population_size: int) -> StateFormat[GaState]:
    def read(raw: Mapping[str, Any]) -> GaState:
        rr_idx = fields.integer(raw, "rr_idx")
        if rr_idx >= len(cluster_ids):
            raise FieldError(f"rr_idx is {rr_idx}, not in [0, {len(cluster_ids)})")
        members = fields.typed(raw, "population", list, "a list")
        population = tuple(read_member(m, f"population[{i}]", cluster_ids, out / FILES.state)
                           for i, m in enumerate(members))
        if len(population) != population_size:
            raise FieldError(f"holds {len(population)} individuals but CONFIG_POPULATION_SIZE={population_size}")
        return GaState(population, rr_idx)

    return StateFormat(FILES, "generation", ("random", "numpy"), read, state_json, check_population,
                       keeps_best=True)


def check_population(state: GaState, archive: RunArchive, last: int) -> None:
    """The population is candidates the archive held when the state was taken, with the
    same deltas."""
    for i, member in enumerate(state.population):
        candidate = archive.candidate(member.candidate_id) if member.candidate_id <= last else None
        if candidate is None or dict(candidate.deltas) != member.deltas:
            held = "does not hold it" if candidate is None else "holds it with other deltas"
            raise FieldError(f"population[{i}] is candidate {member.candidate_id}, but '{archive.path}' {held}")

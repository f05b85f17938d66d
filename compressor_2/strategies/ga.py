"""`CONFIG_STRATEGY="ga"`: seed 000's DEAP loop, to be read top to bottom.

Generation g (seed 000 §1 step 4):
  1. evaluate every individual without a valid fitness, all in one engine call, and
     clone the elites right away;
  2. select 2 x (population - elitism) parents: tournament or truncation, or (seed 002)
     drawn from the 2 to 5 members one reflector call chose, with its reasons;
  3. pair them; each pair gives ONE child: with CXPB by crossover (fitness-weighted
     deltas, reflector-merged scratchpad), otherwise as a clone of A or B (50/50);
     evaluate all children together (clones come from the cache);
  4. with MUTPB mutate a child in place (round-robin target cluster, the reflector's
     new delta; or, with CONFIG_MUTATION_SCOPE="vector", every delta at once, seed 001
     §4) and evaluate the mutated children again, together;
  5. next population = elites + children.
Every child and every mutated child becomes a candidate of the run archive, with its
parents and operator; the tree's seed node ids are its placements. State, history,
tree and plots are written at the end of every generation, and the budgets are checked
before the next. Ctrl+C or SIGTERM saves the state and exits; rerunning the same command
resumes, replaying the interrupted generation from the same RNG state and round-robin
index with the answers the archive already holds.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from deap import base, tools

from compressor_2.archive.database import Candidate
from compressor_2.config import Config
from compressor_2.deltas import load_deltas, to_dict, to_list
from compressor_2.errors import ReflectorUnavailable
from compressor_2.interrupts import signals_ignored
from compressor_2.reflector.base import PopulationMember, Selected, SelectionRequest
from compressor_2.reflector.prompts import estimated_call_tokens
from compressor_2.run.budget import Cost
from compressor_2.run.history import HISTORY_FILE, Work, entry, load_history, population_stats, save_history
from compressor_2.run.plots import FITNESS_PLOT, LENGTHS_PLOT, plot_fitness, plot_lengths
from compressor_2.run.progress import answers_bar, generation_line, ordinal, say
from compressor_2.run.services import Run, resume_command
from compressor_2.run.state import Member, capture_rng, restore_rng, seed_rng
from compressor_2.run.tree import TREE_FILE, TREE_PLOT, EvolutionTree, mut_id, pop_id, pre_id
from compressor_2.strategies.ga_individual import (
    Individual,
    initial_population,
    invalidate,
    make_toolbox,
    new_individual,
)
from compressor_2.strategies.ga_operators import RRState, make_fallback, make_selection, pairs
from compressor_2.strategies.ga_state import STATE_FILE, EvolutionState, check_against_archive, load_state, save_state

NAME = "ga"
INITIAL_STEP = -1  # the initial population is placed before generation 0
# What it writes in the run directory besides the shared services' files.
OUTPUT_FILES = (STATE_FILE,)


def estimate(config: Config, n_examples: int) -> Cost:
    """The initial population is one genome cloned; then per generation every crossover
    child and every mutated child is a new genome (clones are cache hits)."""
    children = config.population_size - config.elitism_size
    new_genomes = children * (config.cxpb + config.mutpb)
    calls = new_genomes + (config.selection == "llm") if config.reflector != "local" else 0.0
    return Cost("generation", n_examples, new_genomes * n_examples,
                calls * estimated_call_tokens(config, n_examples))


def run(run: Run) -> str:
    config, out, ids = run.config, run.out, run.cluster_ids
    saved = load_state(out / STATE_FILE, ids, config.population_size,
                       config.lambda_shortness + config.lambda_correctness)
    if saved:
        check_against_archive(saved, out / STATE_FILE, run.archive, deterministic=config.temperature == 0)
    start = saved.generation if saved else 0
    if saved and start >= config.ngen:
        run.best.member, run.best.fitness = saved.best_individual, saved.best_fitness
        finish_outputs(run, start)  # CONFIG_NGEN may have been lowered since: nothing that ran is dropped
        return f"all {start} generations have run; raise CONFIG_NGEN to evolve further"
    # Seed 000 §8: rr_idx is restored before mutate is registered.
    rr_state = RRState(list(ids), saved.rr_idx if saved else 0)
    toolbox = make_toolbox(run.evaluator, run.reflector, make_selection(config), make_fallback(config), rr_state,
                           ids, run.pool, config.mutation_scope)
    ga = GA(run, toolbox, rr_state, load_history(out / HISTORY_FILE, before=start))
    if saved:
        run.archive.rollback(saved.last_candidate_id, from_step=start)
        population = [new_individual(to_list(m.deltas), m.scratchpad, m.candidate_id) for m in saved.population]
        run.best.member, run.best.fitness = saved.best_individual, saved.best_fitness
        # Served from the archive; sampled afresh when CONFIG_TEMPERATURE > 0, and then a
        # member that now beats the stored best replaces it (seed 000 §2, resume).
        toolbox.evaluate(population)
        # A stop inside generation 0's first evaluation left the initial candidates without
        # the fitness that generation would have recorded: the replay no longer evaluates them.
        for ind in population:
            if (made := run.archive.candidate(ind.candidate_id)) is not None and made.fitness is None:
                run.archive.assess(ind.candidate_id, ind.evaluation.fitness, ind.evaluation.mean_tokens,
                                   ind.evaluation.correctness)
        if run.best.consider([(ga.member(ind), ind.evaluation) for ind in population]):
            save_state(out / STATE_FILE, replace(saved, best_individual=run.best.member,
                                                 best_fitness=run.best.fitness))
        restore_rng(saved.rng)
        say(f"resuming at generation {ordinal(start, config.ngen)} from {out / STATE_FILE} "
            f"({len(run.examples)} training examples)")
    else:
        population = ga.initial_population()
        seed_rng(config.seed)
        say(f"evolving {config.population_size} individuals for {config.ngen} generations on "
            f"{len(run.examples)} training examples ({config.engine} engine, {config.reflector} reflector)")
    try:
        for g in range(start, config.ngen):
            if reason := run.stop_reason():
                ga.stop(g, population, reason)
                return reason
            ga.snapshot = ga.state(g, population)
            population = generation(ga, g, population)
    except (KeyboardInterrupt, ReflectorUnavailable) as exc:
        if ga.snapshot is not None:
            ga.persist_interrupted("interrupted" if isinstance(exc, KeyboardInterrupt) else "stopped")
        raise
    ga.stop(config.ngen, population, reason := f"all {config.ngen} generations ran")
    return reason


def finish_outputs(run: Run, ngen: int) -> None:
    """A run killed after its last state was saved but before its last outputs were: the
    history gets its stop reason and the plots and tree are drawn again."""
    out = run.out
    history = load_history(out / HISTORY_FILE, before=ngen + 1)
    if not history or "stop_reason" in history[-1]:
        return
    history[-1]["stop_reason"] = f"all {ngen} generations ran"
    save_history(out / HISTORY_FILE, history)
    plot_fitness(history, out / FITNESS_PLOT)
    plot_lengths(history, out / LENGTHS_PLOT)
    tree = EvolutionTree.from_archive(run.archive)
    tree.save(out / TREE_FILE)
    tree.render(out / TREE_PLOT)


def generation(ga: GA, g: int, population: list[Individual]) -> list[Individual]:
    run, config, toolbox = ga.run, ga.run.config, ga.toolbox
    work, usage_before, calls_before = Work(), run.reflector.usage, run.evaluator.stats.metric_calls
    started = time.perf_counter()
    n_children = config.population_size - config.elitism_size
    index = {id(ind): i for i, ind in enumerate(population)}

    # 1. Evaluate all (only genomes without a valid fitness cost anything), then the elites.
    ga.evaluate([ind for ind in population if not ind.fitness.valid], work, f"gen {g} population")
    stats = population_stats(g, population, ga.best_so_far())
    elite_parents = tools.selBest(population, config.elitism_size)
    elites = [toolbox.clone(ind) for ind in elite_parents]

    # 2. Selection: 2 x (population - elitism) parents, references into `population`.
    if config.selection == "llm":
        parents, work.selection = ga.select_by_reflector(population, 2 * n_children, g)
    else:
        parents = toolbox.select(population, 2 * n_children)
    work.parents = len(parents)

    # 3. One child per pair. Every random draw happens here, in pair order, before any
    # reflector call; the merges then run concurrently.
    plans = []
    for j, (a, b) in enumerate(pairs(parents)):
        crossover = random.random() < config.cxpb
        clone_of = None if crossover else (a if random.random() < 0.5 else b)
        plans.append((j, a, b, clone_of))

    def make_child(plan: tuple[int, Individual, Individual, Individual | None]) -> Individual:
        j, a, b, clone_of = plan
        if clone_of is None:
            return toolbox.mate(a, b, generation=g, child=j, parents=(index[id(a)], index[id(b)]))
        child = toolbox.clone(clone_of)
        invalidate(child)
        return child

    children = list(run.pool.map(make_child, plans))
    work.children = len(children)
    work.crossovers = sum(plan[3] is None for plan in plans)
    work.clones = work.children - work.crossovers
    ga.evaluate(children, work, f"gen {g} offspring")
    ga.archive(children, g, [("crossover", [a, b]) if clone_of is None else ("clone", [clone_of])
                             for _, a, b, clone_of in plans])
    run.archive.place([(pre_id(g, j), child.candidate_id, g, "pre", j) for j, child in enumerate(children)], g)

    # 4. Mutation with MUTPB: targets are drawn in offspring order as mutate is called;
    # the reflector calls run concurrently and change the children in place.
    chosen = [j for j in range(len(children)) if random.random() < config.mutpb]
    before = {j: children[j].candidate_id for j in chosen}
    futures = [toolbox.mutate(children[j], generation=g, child=j) for j in chosen]
    mutated = [j for j, future in zip(chosen, futures) if future.result().changed]
    work.mutations, work.mutations_skipped = len(mutated), len(chosen) - len(mutated)
    ga.evaluate([children[j] for j in mutated], work, f"gen {g} mutated")
    ga.archive([children[j] for j in mutated], g, [("mutation", [before[j]]) for j in mutated])
    run.archive.place([(mut_id(g, j), children[j].candidate_id, g, "mut", j) for j in mutated], g)

    # 5. Replace: cloned elites first, then the children.
    next_population = elites + children
    run.archive.place([(pop_id(g + 1, i), ind.candidate_id, g + 1, "pop", i)
                       for i, ind in enumerate(next_population)], g)

    usage = run.reflector.usage
    work.metric_calls = run.evaluator.stats.metric_calls - calls_before
    work.reflector_calls = usage.calls - usage_before.calls
    work.reflector_prompt_tokens = usage.prompt_tokens - usage_before.prompt_tokens
    work.reflector_completion_tokens = usage.completion_tokens - usage_before.completion_tokens
    work.seconds = round(time.perf_counter() - started, 3)
    ga.record(g, stats, work, next_population)
    return next_population


@dataclass
class GA:
    """What the loop carries between generations, and the writes it makes."""

    run: Run
    toolbox: base.Toolbox
    rr_state: RRState
    history: list[dict[str, Any]]
    snapshot: EvolutionState | None = None  # this generation's starting point, for Ctrl+C

    def initial_population(self) -> list[Individual]:
        """Seed 000 §1: the initial deltas cloned; each clone is an "initial" candidate.
        A start that saved no state left nothing worth keeping but its answers."""
        run, config = self.run, self.run.config
        run.start_afresh(run.out / STATE_FILE, INITIAL_STEP)
        population = initial_population(to_list(load_deltas(config.initial_deltas_path, run.cluster_ids)),
                                        config.population_size)
        added = run.archive.add([Candidate(to_dict(ind, run.cluster_ids), ind.scratchpad, "initial", (), NAME, 0)
                                 for ind in population])
        for ind, candidate in zip(population, added):
            ind.candidate_id = candidate.id
        run.archive.place([(pop_id(0, i), ind.candidate_id, 0, "pop", i) for i, ind in enumerate(population)],
                          INITIAL_STEP)
        return population

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
        known = [ind for ind in individuals if ind.candidate_id is not None]
        for ind in known:
            self.run.archive.assess(ind.candidate_id, ind.evaluation.fitness, ind.evaluation.mean_tokens,
                                    ind.evaluation.correctness)
        self.run.best.consider([(self.member(ind), ind.evaluation) for ind in known])

    def archive(self, individuals: Sequence[Individual], g: int,
                origins: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """New candidates for evaluated `individuals`, made by (operator, parents), in
        order, so a replayed generation gives them the same ids; then the best-ever."""
        ids = self.run.cluster_ids
        added = self.run.archive.add([
            Candidate(to_dict(ind, ids), ind.scratchpad, operator,
                      tuple(p if isinstance(p, int) else p.candidate_id for p in parents), NAME, g,
                      fitness=ind.evaluation.fitness, mean_tokens=ind.evaluation.mean_tokens,
                      correctness=ind.evaluation.correctness)
            for ind, (operator, parents) in zip(individuals, origins)])
        for ind, candidate in zip(individuals, added):
            ind.candidate_id = candidate.id
        self.run.best.consider([(self.member(ind), ind.evaluation) for ind in individuals])

    def select_by_reflector(self, population: Sequence[Individual], k: int,
                            g: int) -> tuple[list[Individual], dict[str, Any]]:
        """Seed 002: one reflector call chooses 2 to 5 members, with reasons and categories;
        `k` parents are drawn from them (toolbox.select: uniform, with replacement). Two
        invalid replies: CONFIG_SELECTION_FALLBACK draws from the whole population. The
        choice goes to the archive and, returned, to the history."""
        archive, config = self.run.archive, self.run.config
        by_id = {ind.candidate_id: ind for ind in population}
        members = []
        for ind in by_id.values():
            made = archive.candidate(ind.candidate_id)
            assert made is not None
            parents = [p.fitness for p in map(archive.candidate, made.parents)
                       if p is not None and p.fitness is not None]
            members.append(PopulationMember(ind.candidate_id, ind.evaluation.fitness, ind.evaluation.mean_tokens,
                                            ind.evaluation.correctness, to_dict(ind, self.run.cluster_ids),
                                            ind.scratchpad, made.operator, made.parents,
                                            max(parents) if parents else None))
        result = self.run.reflector.select(SelectionRequest(g, tuple(members)))
        if result.selections:
            chosen, summary, fallback = result.selections, result.summary, None
            parents_drawn = self.toolbox.select([by_id[s.candidate_id] for s in chosen], k)
        else:
            fallback = "; ".join(result.rejected)
            parents_drawn = self.toolbox.fallback(population, k)
            chosen = tuple(Selected(cid, f"auto-selected: {fallback}", "performance")
                           for cid in dict.fromkeys(p.candidate_id for p in parents_drawn))
            summary = f"auto-selected by {config.selection_fallback}: the selector's reply was invalid twice"
        archive.record_selection(g, [(s.candidate_id, s.category, s.reasoning) for s in chosen], summary, fallback)
        return parents_drawn, {"selections": [{"candidate_id": s.candidate_id, "category": s.category,
                                               "reasoning": s.reasoning} for s in chosen],
                               "summary": summary, "fallback": fallback}

    def best_so_far(self) -> float | None:
        """The best fitness among the archive's candidates: what the history reports. After
        a resume the best-ever may come from the generation being replayed (its files are
        kept), but the history, like the archive, only knows what has been made again."""
        best = self.run.archive.best()
        return best.fitness if best is not None else self.run.best.fitness

    def member(self, ind: Individual) -> Member:
        return Member(to_dict(ind, self.run.cluster_ids), ind.scratchpad, ind.candidate_id)

    def state(self, generation: int, population: Sequence[Individual]) -> EvolutionState:
        return EvolutionState(generation, tuple(self.member(ind) for ind in population),
                              self.run.best.member, self.run.best.fitness, self.rr_state.rr_idx, capture_rng(),
                              self.run.archive.last_candidate_id())

    def record(self, g: int, stats: dict[str, Any], work: Work, next_population: Sequence[Individual]) -> None:
        """End of generation g: history and tree first, then the state that points past
        them, so an interruption between the writes never loses a finished generation's
        records."""
        out = self.run.out
        final = population_stats(g + 1, next_population, self.best_so_far())
        self.history[g:] = [entry(stats, work), entry(final, Work())]
        save_history(out / HISTORY_FILE, self.history)
        tree = EvolutionTree.from_archive(self.run.archive)
        tree.save(out / TREE_FILE)
        self.snapshot = self.state(g + 1, next_population)
        save_state(out / STATE_FILE, self.snapshot)
        plot_fitness(self.history, out / FITNESS_PLOT)
        plot_lengths(self.history, out / LENGTHS_PLOT)
        tree.render(out / TREE_PLOT)
        say(generation_line(g, self.run.config.ngen, final, entry(stats, work),
                            self.run.budget.seconds()))

    def stop(self, g: int, population: Sequence[Individual], reason: str) -> None:
        """The history ends with the population entering generation g, and why the run
        stopped there."""
        if all(ind.fitness.valid for ind in population):
            self.history[g:] = [entry(population_stats(g, population, self.best_so_far()), Work())]
        if self.history:
            self.history[-1]["stop_reason"] = reason
            save_history(self.run.out / HISTORY_FILE, self.history)

    def persist_interrupted(self, why: str) -> None:
        assert self.snapshot is not None
        out = self.run.out
        with signals_ignored():
            save_state(out / STATE_FILE, replace(self.snapshot, best_individual=self.run.best.member,
                                                 best_fitness=self.run.best.fitness))
        print(f"\n{why}: state saved to {out / STATE_FILE}; generation "
              f"{ordinal(self.snapshot.generation, self.run.config.ngen)} starts again when you rerun the same "
              f"command: {resume_command()}", file=sys.stderr)

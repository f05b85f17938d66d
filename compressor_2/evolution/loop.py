"""`python -m compressor_2 evolve`: seed 000's DEAP loop, to be read top to bottom.

Generation g (seed 000 §1 step 4):
  1. evaluate every individual without a valid fitness, all in one engine call, and
     clone the elites right away;
  2. select 2 x (population - elitism) parents;
  3. pair them; each pair gives ONE child: with CXPB by crossover (fitness-weighted
     deltas, reflector-merged scratchpad), otherwise as a clone of A or B (50/50);
     evaluate all children together (clones come from the genome cache);
  4. with MUTPB mutate a child in place (round-robin target cluster, the reflector's
     new delta) and evaluate the mutated children again, together;
  5. next population = elites + children.
State, history, tree and plots are written at the end of every generation. Ctrl+C or
SIGTERM saves the state and exits; rerunning the same command resumes, replaying the
interrupted generation from the same RNG state and round-robin index.
"""

from __future__ import annotations

import contextlib
import io
import random
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from deap import base, tools

from compressor_2.config import Config
from compressor_2.evolution.best import BestEver
from compressor_2.evolution.history import HISTORY_FILE, Work, entry, load_history, population_stats, save_history
from compressor_2.evolution.individual import Individual, initial_population, invalidate, make_toolbox, new_individual
from compressor_2.evolution.operators import RRState, make_selection, pairs
from compressor_2.evolution.plots import FITNESS_PLOT, LENGTHS_PLOT, plot_fitness, plot_lengths
from compressor_2.evolution.progress import answers_bar, generation_line, ordinal, say
from compressor_2.evolution.state import (
    STATE_FILE, EvolutionState, Member, capture_rng, load_state, restore_rng, save_state, seed_rng,
)
from compressor_2.evolution.tree import TREE_FILE, EvolutionTree, mut_id, pop_id, pre_id
from compressor_2.fitness import Evaluator
from compressor_2.reflector.base import Reflector
from compressor_2.steering.deltas import load_deltas, to_dict, to_list

TREE_PLOT = "evolution_tree.png"


def evolve(config: Config) -> None:
    from compressor_2.clusters.build import build_clusters
    from compressor_2.data.financebench import examples_from_config
    from compressor_2.engines.registry import make_engine
    from compressor_2.judges.registry import make_judge
    from compressor_2.reflector.registry import make_reflector
    from compressor_2.steering.generate import generate_processor

    out = config.output_dir
    clusters = build_clusters(config)
    ids = clusters.cluster_ids
    saved = load_state(out / STATE_FILE, ids, config.population_size)
    start = saved.generation if saved else 0
    if saved and start >= config.ngen:
        say(f"{out / STATE_FILE}: all {config.ngen} generations have run (best fitness "
            f"{saved.best_fitness:.4f}); raise CONFIG_NGEN to evolve further")
        return
    examples = examples_from_config(config)
    initial = to_list(load_deltas(config.initial_deltas_path, ids))
    selection = make_selection(config)
    reflector = make_reflector(config, clusters)  # a missing API key stops us before the model loads
    pool = ThreadPoolExecutor(config.reflector_concurrency, thread_name_prefix="reflector")
    engine, run = None, None
    try:
        with sigterm_as_interrupt():
            engine = make_engine(config, clusters)
            evaluator = Evaluator(engine, make_judge(config), examples, config.lambda_shortness,
                                  config.lambda_correctness, config.shortness_scale)
            # Seed 000 §8: rr_idx is restored before mutate is registered.
            rr_state = RRState(list(ids), saved.rr_idx if saved else 0)
            toolbox = make_toolbox(evaluator, reflector, selection, rr_state, ids, pool)
            best = BestEver(out, ids, lambda d, o: quietly(generate_processor, config, deltas_path=d, out=o),
                            saved.best_individual if saved else None, saved.best_fitness if saved else None)
            run = Run(config, list(ids), toolbox, evaluator, reflector, pool, rr_state, best,
                      _load_tree(out, start), load_history(out / HISTORY_FILE, before=start),
                      len(examples), time.perf_counter())
            if saved:
                population = [new_individual(to_list(m.deltas), m.scratchpad) for m in saved.population]
                restore_rng(saved.rng)
                say(f"resuming at generation {ordinal(start, config.ngen)} from {out / STATE_FILE} "
                    f"({len(examples)} training examples)")
            else:
                population = initial_population(initial, config.population_size)
                seed_rng(config.seed)
                say(f"evolving {config.population_size} individuals for {config.ngen} generations on "
                    f"{len(examples)} training examples ({config.engine} engine, {config.reflector} reflector)")
            for g in range(start, config.ngen):
                run.snapshot = run.state(g, population)
                population = generation(run, g, population)
        say(f"done: best fitness {best.fitness:.4f}; {out / 'deltas_best.json'} and "
            f"{out / 'processor_best.py'} hold the best deltas")
    except KeyboardInterrupt:
        if run is not None and run.snapshot is not None:
            run.persist_interrupted()
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        reflector.close()
        if engine is not None:
            engine.close()


def generation(run: Run, g: int, population: list[Individual]) -> list[Individual]:
    config, toolbox, tree = run.config, run.toolbox, run.tree
    work, usage_before, started = Work(), run.reflector.usage, time.perf_counter()
    n_children = config.population_size - config.elitism_size
    index = {id(ind): i for i, ind in enumerate(population)}

    # 1. Evaluate all (only genomes without a valid fitness cost anything), then the elites.
    run.evaluate([ind for ind in population if not ind.fitness.valid], work, f"gen {g} population")
    for i, ind in enumerate(population):
        tree.node(pop_id(g, i), g, "pop", i, ind)
    stats = population_stats(g, population, run.best.fitness)
    elite_parents = tools.selBest(population, config.elitism_size)
    elites = [toolbox.clone(ind) for ind in elite_parents]

    # 2. Selection: 2 x (population - elitism) parents, references into `population`.
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
    run.evaluate(children, work, f"gen {g} offspring")
    for j, (child, (_, a, b, clone_of)) in enumerate(zip(children, plans)):
        tree.node(pre_id(g, j), g, "pre", j, child)
        for parent in ([a, b] if clone_of is None else [clone_of]):
            tree.edge(pop_id(g, index[id(parent)]), pre_id(g, j), "parent")

    # 4. Mutation with MUTPB: targets are drawn in offspring order as mutate is called;
    # the reflector calls run concurrently and change the children in place.
    chosen = [j for j in range(len(children)) if random.random() < config.mutpb]
    futures = [toolbox.mutate(children[j], generation=g, child=j) for j in chosen]
    mutated = [j for j, future in zip(chosen, futures) if future.result().delta is not None]
    work.mutations, work.mutations_skipped = len(mutated), len(chosen) - len(mutated)
    run.evaluate([children[j] for j in mutated], work, f"gen {g} mutated")
    for j in mutated:
        tree.node(mut_id(g, j), g, "mut", j, children[j])
        tree.edge(pre_id(g, j), mut_id(g, j), "mutation")

    # 5. Replace: cloned elites first, then the children.
    next_population = elites + children
    finals = [pop_id(g, index[id(e)]) for e in elite_parents] + [
        mut_id(g, j) if j in mutated else pre_id(g, j) for j in range(len(children))]
    for i, (ind, source) in enumerate(zip(next_population, finals)):
        tree.node(pop_id(g + 1, i), g + 1, "pop", i, ind)
        tree.edge(source, pop_id(g + 1, i), "carry")

    usage = run.reflector.usage
    work.reflector_calls = usage.calls - usage_before.calls
    work.reflector_prompt_tokens = usage.prompt_tokens - usage_before.prompt_tokens
    work.reflector_completion_tokens = usage.completion_tokens - usage_before.completion_tokens
    work.seconds = round(time.perf_counter() - started, 3)
    run.record(g, stats, work, next_population)
    return next_population


@dataclass
class Run:
    """What the loop carries between generations, and the writes it makes."""

    config: Config
    cluster_ids: list[str]
    toolbox: base.Toolbox
    evaluator: Evaluator
    reflector: Reflector
    pool: Executor  # reflector calls in flight at once: CONFIG_REFLECTOR_CONCURRENCY
    rr_state: RRState
    best: BestEver
    tree: EvolutionTree
    history: list[dict[str, Any]]
    n_examples: int
    started: float
    snapshot: EvolutionState | None = None  # this generation's starting point, for Ctrl+C

    @property
    def out(self) -> Path:
        return self.config.output_dir

    def evaluate(self, individuals: Sequence[Individual], work: Work, label: str) -> None:
        if not individuals:
            return
        stats = self.evaluator.stats
        run_before, hits_before = stats.evaluations_run, stats.cache_hits
        with answers_bar(len(individuals) * self.n_examples, label) as bar:
            self.toolbox.evaluate(individuals, bar.update)
        work.evaluations_run += stats.evaluations_run - run_before
        work.cache_hits += stats.cache_hits - hits_before
        self.best.consider(individuals)

    def state(self, generation: int, population: Sequence[Individual]) -> EvolutionState:
        return EvolutionState(
            generation, tuple(Member(to_dict(ind, self.cluster_ids), ind.scratchpad) for ind in population),
            self.best.member, self.best.fitness, self.rr_state.rr_idx, capture_rng())

    def record(self, g: int, stats: dict[str, Any], work: Work, next_population: Sequence[Individual]) -> None:
        """End of generation g: history and tree first, then the state that points past
        them, so an interruption between the writes never loses a finished generation's
        records."""
        final = population_stats(g + 1, next_population, self.best.fitness)
        self.history[g:] = [entry(stats, work), entry(final, Work())]
        save_history(self.out / HISTORY_FILE, self.history)
        self.tree.save(self.out / TREE_FILE)
        self.snapshot = self.state(g + 1, next_population)
        save_state(self.out / STATE_FILE, self.snapshot)
        plot_fitness(self.history, self.out / FITNESS_PLOT)
        plot_lengths(self.history, self.out / LENGTHS_PLOT)
        self.tree.render(self.out / TREE_PLOT)
        say(generation_line(g, self.config.ngen, final, entry(stats, work), time.perf_counter() - self.started))

    def persist_interrupted(self) -> None:
        assert self.snapshot is not None
        with signals_ignored():
            save_state(self.out / STATE_FILE, replace(self.snapshot, best_individual=self.best.member,
                                                      best_fitness=self.best.fitness))
        print(f"\ninterrupted: state saved to {self.out / STATE_FILE}; generation "
              f"{ordinal(self.snapshot.generation, self.config.ngen)} starts again when you rerun the same "
              f"command: {resume_command()}", file=sys.stderr)


def quietly(fn: Callable[..., None], *args: Any, **kwargs: Any) -> None:
    """Runs `fn` without its own report lines: BestEver says what changed, once."""
    with contextlib.redirect_stdout(io.StringIO()):
        fn(*args, **kwargs)


def _load_tree(out: Path, start: int) -> EvolutionTree:
    tree = EvolutionTree.load(out / TREE_FILE)
    tree.truncate(start)
    return tree


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM takes the Ctrl+C path: save the state, close the engine, exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        del signum, frame
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    """A second Ctrl+C must not cut the final save short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def resume_command() -> str:
    """The command line this process was started with, as the user would retype it."""
    args = sys.argv[1:]
    if Path(sys.argv[0]).name == "__main__.py":
        return shlex.join(["python", "-m", "compressor_2", *args])
    return shlex.join([Path(sys.argv[0]).name, *args])

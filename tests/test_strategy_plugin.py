"""Issue AA, item 3: a strategy is one module plus its Kconfig entry. The package and Kconfig
are copied into a temporary directory; a small strategy (a hill climber with two options of
its own) is written into the copy's strategies/ and its entry and menu into the copy's
Kconfig, and no other file of the copy changes. Run through `evolve` in that copy, its
options are typed and checked when the config loads, its part of the run identity refuses a
changed option on a resume and allows a raised step count, and its state format resumes a
run stopped by its budget to the end an uninterrupted run reaches."""

from __future__ import annotations

import filecmp
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_evolution_support import write_config

pytestmark = pytest.mark.slow

HILL = '''"""`CONFIG_STRATEGY="hill"`: a (1+1) hill climber. Each step moves one cluster's delta of the
incumbent (drawn from its own RNG) by CONFIG_HILL_STEP up or down, evaluates that genome, and
keeps it as the incumbent when it is fitter."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from compressor_2.archive import SEED_STEP, Candidate, RunArchive, Spot
from compressor_2.config import Config
from compressor_2.config.kconfig import MAX_LOGITS, Reader
from compressor_2.deltas import to_dict, to_list
from compressor_2.resume import fields
from compressor_2.resume.identity import STEPS, Option
from compressor_2.resume.state import RunFiles, StateFormat, held, state_json
from compressor_2.run.budget import Cost
from compressor_2.run.driver import Report
from compressor_2.run.services import NewCandidate, Run
from compressor_2.strategies import options_of

FILES = RunFiles("hill_state.json")
IDENTITY = (Option("HILL_STEP", attrgetter("step")), Option("HILL_STEPS", attrgetter("steps"), STEPS))


@dataclass(frozen=True)
class HillOptions:
    step: float
    steps: int


def read_options(r: Reader) -> HillOptions:
    return HillOptions(r.number("HILL_STEP", 0, MAX_LOGITS, above=True), r.integer("HILL_STEPS"))


def estimate(config: Config, n_examples: int) -> Cost:
    return Cost("step", n_examples, n_examples, 0.0)


def make(run: Run) -> Hill:
    return Hill(run, options_of(run.config, "hill"))


@dataclass
class HillState:
    incumbent: int  # its candidate id


class Hill:
    step_name, steps_symbol, proposer, progress_plot = "step", "CONFIG_HILL_STEPS", "the climber", None

    def __init__(self, run: Run, options: HillOptions) -> None:
        self.run, self.options, self.steps = run, options, options.steps
        self.rng = random.Random(run.config.seed)
        self.incumbent: Candidate | None = None
        self.state_format = StateFormat(FILES, "step", ("random",), self.read, state_json, self.check)

    def read(self, raw: Mapping[str, Any]) -> HillState:
        return HillState(fields.integer(raw, "incumbent", minimum=1))

    def check(self, own: HillState, archive: RunArchive, last: int) -> None:
        held(own.incumbent, "incumbent", archive, last, assessed=True)

    def rngs(self) -> Mapping[str, Any]:
        return {"random": self.rng}

    def start(self) -> None:
        self.incumbent = self.admit(SEED_STEP, to_list(self.run.initial), "initial", ())

    def own_state(self) -> HillState:
        assert self.incumbent is not None and self.incumbent.id is not None
        return HillState(self.incumbent.id)

    def restore(self, own: HillState, t: int) -> None:
        self.incumbent = self.run.archive.candidate(own.incumbent)

    def step(self, t: int) -> Report:
        assert self.incumbent is not None and self.incumbent.id is not None
        genome = to_list(self.incumbent.deltas)
        genome[self.rng.randrange(len(genome))] += self.rng.choice((-1.0, 1.0)) * self.options.step
        made = self.admit(t, genome, "climb", (self.incumbent.id,))
        if (made.fitness or 0.0) > (self.incumbent.fitness or 0.0):
            self.incumbent = made
        fitness, tokens = made.fitness or 0.0, made.mean_tokens or 0.0
        return Report([{"generation": t, "best_fitness": fitness, "mean_fitness": fitness, "mean_tokens": tokens,
                        "best_mean_tokens": tokens, "best_ever_fitness": self.run.best.fitness}],
                      f"step {t}: {fitness:.4f}")

    def closing(self, t: int) -> list[dict[str, Any]]:
        return []

    def admit(self, step: int, genome: list[float], operator: str, parents: tuple[int, ...]) -> Candidate:
        [evaluation] = self.run.evaluate([genome], f"{operator} {step}")
        [made] = self.run.admit(step, [NewCandidate(to_dict(genome, self.run.cluster_ids), "", operator, parents,
                                                    step + 1, evaluation, spot=Spot(step + 1, "cand", 0))])
        return made
'''

ENTRY = 'config STRATEGY_GA\n\tbool "ga: a DEAP genetic algorithm"\n'
HILL_KCONFIG = '''
menu "Hill climber (a strategy added by a test)"
	depends on STRATEGY_HILL

config HILL_STEP
	string "The move of one delta, in logit units"
	default "1.0"

config HILL_STEPS
	int "Steps"
	default 3
	range 1 1000

endmenu
'''


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    """The package and Kconfig copied, the hill climber added as a module and a Kconfig entry."""
    root = tmp_path_factory.mktemp("plugin")
    shutil.copytree(REPO / "compressor_2", root / "compressor_2", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "compressor_2" / "strategies" / "hill.py").write_text(HILL, encoding="utf-8")
    kconfig = (REPO / "Kconfig").read_text(encoding="utf-8")
    assert ENTRY in kconfig
    (root / "Kconfig").write_text(kconfig.replace(ENTRY, f'{ENTRY}\nconfig STRATEGY_HILL\n\tbool "hill"\n')
                                  + HILL_KCONFIG, encoding="utf-8")
    return root


def run(copy: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m compressor_2 ARGS` in the copy: its own package is the one imported."""
    return subprocess.run([sys.executable, "-m", "compressor_2", *args], cwd=copy, capture_output=True, text=True,
                          timeout=1800, check=False)


def evolve(copy: Path, work: Path, shared: Path, model: Path, **symbols: str) -> subprocess.CompletedProcess[str]:
    config = write_config(work, shared, model, STRATEGY_HILL="y", **symbols)
    return run(copy, "evolve", "--config", str(config))


def rows(out: Path) -> list[tuple]:
    with sqlite3.connect(out / "run.sqlite") as db:
        return db.execute("SELECT id, operator, deltas, generation, fitness FROM candidates ORDER BY id").fetchall()


def test_only_the_module_and_the_kconfig_entry_were_added(copy):
    compared = filecmp.dircmp(REPO / "compressor_2", copy / "compressor_2", ignore=["__pycache__"])

    def differences(d: filecmp.dircmp) -> list[str]:
        found = [*d.left_only, *d.diff_files, *d.funny_files]
        return found + [name for sub in d.subdirs.values() for name in differences(sub)]

    assert differences(compared) == [] and compared.right_only == [] and compared.subdirs["strategies"].right_only == [
        "hill.py"]


def test_its_options_are_checked_when_the_config_loads(copy, tmp_path, shared, tiny_model_dir):
    config = write_config(tmp_path, shared, tiny_model_dir, STRATEGY_HILL="y", HILL_STEP='"-1"')
    done = run(copy, "check-config", "--config", str(config))
    assert done.returncode == 2 and "CONFIG_HILL_STEP" in done.stderr, done.stderr
    config = write_config(tmp_path, shared, tiny_model_dir, STRATEGY_HILL="y", HILL_STEP='"0.5"')
    done = run(copy, "check-config", "--config", str(config))
    assert done.returncode == 0 and "hill.step" in done.stdout and "= 0.5" in done.stdout, done.stderr


def test_it_runs_resumes_and_is_compared_through_evolve(copy, tmp_path, shared, tiny_model_dir):
    whole, split = tmp_path / "whole", tmp_path / "split"
    whole.mkdir()
    split.mkdir()
    done = evolve(copy, whole, shared, tiny_model_dir)
    assert done.returncode == 0 and "done: all 3 steps ran" in done.stdout, done.stderr
    # Two answers of three examples: the start's and step 0's; the budget stops it there.
    done = evolve(copy, split, shared, tiny_model_dir, MAX_METRIC_CALLS="6")
    assert done.returncode == 0 and "CONFIG_MAX_METRIC_CALLS=6 reached" in done.stdout, done.stderr
    assert json.loads((split / "out" / "hill_state.json").read_text())["step"] == 1
    done = evolve(copy, split, shared, tiny_model_dir, HILL_STEP='"2.0"')
    assert done.returncode == 2 and "CONFIG_HILL_STEP: 1.0 when the run started, 2.0 now" in done.stderr, done.stderr
    done = evolve(copy, split, shared, tiny_model_dir)
    assert done.returncode == 0 and "resuming at step 1 (2 of 3)" in done.stdout, done.stderr
    assert rows(whole / "out") == rows(split / "out") and len(rows(whole / "out")) == 4
    assert (whole / "out" / "deltas_best.json").read_bytes() == (split / "out" / "deltas_best.json").read_bytes()
    done = evolve(copy, split, shared, tiny_model_dir, HILL_STEPS="4")
    assert done.returncode == 0 and "changed since the last start: CONFIG_HILL_STEPS: 3 -> 4" in done.stdout, (
        done.stderr)
    assert len(rows(split / "out")) == 5

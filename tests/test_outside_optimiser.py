"""Issue V item 7, the proof that the seam is right: an outside ask/tell optimiser (Optuna's
TPE) plugs in as a strategy of about 40 lines, and the run's driver runs it, interrupts it
and resumes it like any other. Its state is the trials it was told; each step's sampler
is seeded by the step, so a replayed step asks what the interrupted one asked."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass

import pytest

import compressor_2.config.kconfig as config_module
from compressor_2.archive import Spot
from compressor_2.commands.evolve import evolve
from compressor_2.resume.state import RunFiles, StateFormat, state_json
from compressor_2.run.budget import Cost
from compressor_2.run.driver import Report
from compressor_2.run.services import NewCandidate, Run
from tests.test_evolution_support import config_for, interrupted_then_resumed, query

optuna = pytest.importorskip("optuna", reason="optuna (requirements-test.txt) is not installed")
pytestmark = pytest.mark.slow

BATCH, STEPS = 3, 3
TPE_FILES = RunFiles("tpe_state.json")


@dataclass
class Told:
    trials: list[list]  # [params by cluster id, fitness]


class Tpe:
    step_name, steps, steps_symbol, proposer, progress_plot = "batch", STEPS, "", "the sampler", None

    def __init__(self, run: Run) -> None:
        self.run, self.told = run, Told([])
        self.space = {c: optuna.distributions.FloatDistribution(-2.0, 2.0) for c in run.cluster_ids}
        self.state_format = StateFormat(TPE_FILES, "iteration", (), lambda raw: Told(raw["trials"]), state_json)

    def rngs(self) -> dict:
        return {}

    def start(self) -> None:
        optuna.logging.set_verbosity(optuna.logging.WARNING)

    def own_state(self) -> Told:
        return self.told

    def restore(self, own: Told, t: int) -> None:
        self.start()
        self.told = own

    def step(self, t: int) -> Report:
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=t))
        study.add_trials([optuna.trial.create_trial(params=p, distributions=self.space, value=v)
                          for p, v in self.told.trials])
        asked = [study.ask(self.space) for _ in range(BATCH)]
        evaluations = self.run.evaluate([list(trial.params.values()) for trial in asked], f"batch {t}")
        self.run.admit(t, [NewCandidate(trial.params, "", "tpe", (), t, e, spot=Spot(t + 1, "cand", i))
                           for i, (trial, e) in enumerate(zip(asked, evaluations))])
        for trial, e in zip(asked, evaluations):
            study.tell(trial, e.fitness)
            self.told.trials.append([trial.params, e.fitness])
        best = max(e.fitness for e in evaluations)
        tokens = min(e.mean_tokens for e in evaluations)
        return Report([{"generation": t, "best_fitness": best, "mean_fitness": best, "mean_tokens": tokens,
                        "best_mean_tokens": tokens, "best_ever_fitness": self.run.best.fitness}], f"batch {t}")

    def closing(self, t: int) -> list:
        return []


@pytest.fixture
def tpe_strategy(tmp_path, monkeypatch) -> dict[str, str]:
    """CONFIG_STRATEGY_TPE in a copy of Kconfig, its module registered."""
    kconfig = tmp_path / "Kconfig"
    kconfig.write_text(config_module.KCONFIG_PATH.read_text().replace(
        'config STRATEGY_GA\n\tbool "ga: a DEAP genetic algorithm"\n',
        'config STRATEGY_GA\n\tbool "ga: a DEAP genetic algorithm"\n\nconfig STRATEGY_TPE\n\tbool "tpe"\n'))
    monkeypatch.setattr(config_module, "KCONFIG_PATH", kconfig)
    module = types.ModuleType("compressor_2.strategies.tpe")
    module.estimate = lambda config, n: Cost("batch", 0, BATCH * n, 0)
    module.make, module.FILES = Tpe, TPE_FILES
    monkeypatch.setitem(sys.modules, "compressor_2.strategies.tpe", module)
    return {"STRATEGY_TPE": "y"}


def test_an_outside_ask_tell_optimiser_runs_is_interrupted_and_resumes_through_the_driver(
        tmp_path, shared, tiny_model_dir, monkeypatch, tpe_strategy, capsys):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir()
    cut.mkdir()
    evolve(config_for(whole, shared, tiny_model_dir, **tpe_strategy))
    assert capsys.readouterr().out.splitlines()[-1].startswith("done: all 3 batches ran; best fitness")
    # Ctrl+C while step 1's batch is evaluated; the rerun replays it from the saved trials.
    at = (Run, "evaluate", lambda _self, _genomes, label, *_: label == "batch 1")
    interrupted_then_resumed(cut, shared, tiny_model_dir, tpe_strategy, 1, monkeypatch, at)
    sql = "SELECT id, operator, deltas, generation, fitness FROM candidates ORDER BY id"
    made = query(whole / "out", sql)
    assert len(made) == BATCH * STEPS and made == query(cut / "out", sql)
    assert (whole / "out" / "deltas_best.json").read_bytes() == (cut / "out" / "deltas_best.json").read_bytes()

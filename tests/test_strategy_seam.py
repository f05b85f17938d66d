"""A strategy is a module plus a Kconfig entry, nothing else: this test adds one (a
one-step random probe) to a copy of Kconfig and a module registered under
compressor_2.strategies, and runs it through `evolve` with the shared services and the
run's driver."""

from __future__ import annotations

import sqlite3
import sys
import types

import pytest

import compressor_2.config.kconfig as config_module
from compressor_2.commands.evolve import evolve
from compressor_2.config import load_config
from compressor_2.deltas import to_dict
from compressor_2.resume.state import Member, RunFiles, StateFormat
from compressor_2.run.budget import Cost
from compressor_2.run.driver import Report
from compressor_2.run.services import NewCandidate
from tests.test_evolution_support import shared_dir, write_config

pytestmark = pytest.mark.slow

PROBE_FILES = RunFiles("probe_state.json")


class Probe:
    """Evaluates two fixed genomes on the first example, then one of them on the pool."""

    state_format = StateFormat(PROBE_FILES, "iteration", (), lambda raw: None, lambda own: {})
    step_name, steps, steps_symbol, proposer, progress_plot = "probe", 1, "", "the probe", None

    def __init__(self, run) -> None:  # noqa: ANN001 - the run's services
        self.run = run

    def rngs(self) -> dict:
        return {}

    def start(self) -> None:
        pass

    def restore(self, own: None, t: int) -> None:
        pass

    def own_state(self) -> None:
        return None

    def step(self, t: int) -> Report:
        run = self.run
        genomes = [[0.0] * len(run.cluster_ids), [5.0] + [0.0] * (len(run.cluster_ids) - 1)]
        run.evaluate(genomes, "probe", examples=run.examples[:1])
        made = run.admit(t, [NewCandidate(to_dict(g, run.cluster_ids), "", "probe", (), 0,
                                          status="rejected" if i else "evaluated") for i, g in enumerate(genomes)])
        [whole] = run.evaluate([genomes[0]], "probe pool")
        run.assess([(Member(dict(made[0].deltas), "", made[0].id), whole)])
        return Report([{"generation": t, "best_fitness": whole.fitness, "mean_fitness": whole.fitness,
                        "best_ever_fitness": whole.fitness, "mean_tokens": whole.mean_tokens,
                        "best_mean_tokens": whole.mean_tokens}], "probed")

    def closing(self, t: int) -> list:
        return []


def probe_module() -> types.ModuleType:
    module = types.ModuleType("compressor_2.strategies.probe")

    def estimate(config, n_examples: int) -> Cost:
        return Cost("probe", 0, 2 + n_examples, 0)

    module.estimate, module.make, module.FILES = estimate, Probe, PROBE_FILES
    return module


def test_a_new_strategy_needs_a_module_and_a_kconfig_entry(tmp_path, tmp_path_factory, tiny_model_dir,
                                                           monkeypatch, capsys):
    kconfig = tmp_path / "Kconfig"
    kconfig.write_text(config_module.KCONFIG_PATH.read_text().replace(
        'config STRATEGY_GA\n\tbool "ga: a DEAP genetic algorithm"\n',
        'config STRATEGY_GA\n\tbool "ga: a DEAP genetic algorithm"\n\n'
        'config STRATEGY_PROBE\n\tbool "probe"\n'))
    monkeypatch.setattr(config_module, "KCONFIG_PATH", kconfig)
    monkeypatch.setitem(sys.modules, "compressor_2.strategies.probe", probe_module())

    config = load_config(write_config(tmp_path, shared_dir(tmp_path_factory), tiny_model_dir, STRATEGY_PROBE="y"))
    assert config.strategy == "probe"
    evolve(config)
    assert capsys.readouterr().out.splitlines()[-1].startswith("done: all 1 probes ran; best fitness")
    with sqlite3.connect(config.output_dir / "run.sqlite") as db:
        assert db.execute("SELECT id, operator, strategy, status FROM candidates").fetchall() == [
            (1, "probe", "probe", "evaluated"), (2, "probe", "probe", "rejected")]
        # Two genomes on one example, then the first's two other examples: 4 fresh answers.
        assert db.execute("SELECT count(*) FROM evaluations").fetchone() == (4,)
        assert db.execute("SELECT value FROM meta WHERE key = 'strategy'").fetchone() == ("probe",)
    assert (config.output_dir / "deltas_best.json").exists()

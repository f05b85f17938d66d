"""Persistence and resume: evolution_state.json, its refusal of bad files, and a resumed
run (in process, and after Ctrl+C / SIGTERM to a real `python -m compressor_2 evolve`)
ending in exactly the state of an uninterrupted one."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from compressor_2.commands.evolve import evolve
from compressor_2.common import interrupts
from compressor_2.common.errors import ConfigError
from compressor_2.config import load_config
from compressor_2.reflector.local import LocalProposer
from compressor_2.resume.state import (
    GLOBAL_RNGS,
    Member,
    Saved,
    capture_rngs,
    read_state,
    restore_rngs,
    save_state,
    seed_rng,
)
from compressor_2.strategies.ga.strategy import GaState, ga_format
from tests.conftest import REPO
from tests.test_evolution_support import config_for, query, read_json, write_config

IDS = ["0", "1", "2"]


def member(x: float, pad: str = "", cid: int = 1) -> Member:
    return Member({"0": x, "1": 0.0, "2": -x}, pad, cid)


def sample_state() -> Saved[GaState]:
    seed_rng(5)
    random.random()
    return Saved(3, capture_rngs(GLOBAL_RNGS), 7, GaState((member(1.0, "note"), member(0.5, cid=2)), 2),
                 member(1.0, "note"), 0.75)


def save(directory: Path, state: Saved[GaState]) -> Path:
    save_state(directory, ga_format(directory, IDS, 2), state)
    return directory / "evolution_state.json"


def load(path: Path) -> Saved[GaState] | None:
    return read_state(path, ga_format(path.parent, IDS, 2), IDS, 1.0)


def test_the_state_round_trips_with_exactly_the_seed_keys(tmp_path: Path):
    state = sample_state()
    raw = read_json(save(tmp_path, state))
    assert set(raw) == {"generation", "population", "best_individual", "best_fitness", "rr_idx", "rng",
                        "last_candidate_id"}
    assert raw["population"][0] == {"candidate_id": 1, "deltas": {"0": 1.0, "1": 0.0, "2": -1.0},
                                    "scratchpad": "note"}
    assert load(tmp_path / "evolution_state.json") == state


def test_restoring_the_rng_replays_the_same_draws(tmp_path: Path):
    state = sample_state()
    expected = ([random.random() for _ in range(3)], np.random.rand(3).tolist())
    random.seed(99)
    np.random.seed(99)
    restore_rngs(load(save(tmp_path, state)).rng, GLOBAL_RNGS)
    assert ([random.random() for _ in range(3)], np.random.rand(3).tolist()) == expected


def test_no_state_file_means_a_fresh_run(tmp_path: Path):
    assert load(tmp_path / "evolution_state.json") is None


@pytest.mark.parametrize(("edit", "message"), [
    (lambda raw: raw.pop("rr_idx"), "rr_idx is missing"),
    (lambda raw: raw.update(rr_idx=3), "rr_idx is 3"),
    (lambda raw: raw.update(generation=-1), "generation is -1"),
    (lambda raw: raw["population"][1]["deltas"].pop("2"), "cluster id\\(s\\) 2 missing.*clusters changed"),
    (lambda raw: raw["population"][0].update(scratchpad=None), "population\\[0\\].scratchpad is None, not a string"),
    (lambda raw: raw.update(best_fitness=None), "both be set or both be null"),
    (lambda raw: raw["rng"].update(random=[3, [1, 2], None]), "rng cannot be restored"),
    (lambda raw: raw.update(population=[raw["population"][0]]), "holds 1 individuals but CONFIG_POPULATION_SIZE=2"),
    (lambda raw: raw["population"][0].update(candidate_id="1"), "candidate_id is '1'"),
    (lambda raw: raw.update(last_candidate_id=-1), "last_candidate_id is -1"),
])
def test_a_state_that_cannot_be_used_is_a_clear_error(tmp_path: Path, edit, message):
    path = save(tmp_path, sample_state())
    raw = read_json(path)
    edit(raw)
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=message) as excinfo:
        load(path)
    assert "evolution_state.json" in str(excinfo.value) and "fresh run" in str(excinfo.value)


def test_an_unparsable_state_is_a_clear_error(tmp_path: Path):
    path = tmp_path / "evolution_state.json"
    path.write_bytes(b"\xff\xfe not json")
    with pytest.raises(ConfigError, match="cannot be read"):
        load(path)


# -- resumed runs ---------------------------------------------------------------------------



def prompt_logs(out: Path, generations: range) -> dict[str, str]:
    return {p.name: p.read_text() for g in generations for p in (out / "reflector_prompts").glob(f"gen_{g}_*")}


@pytest.mark.slow
def test_a_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path, shared, tiny_model_dir, uninterrupted):
    evolve(config_for(tmp_path, shared, tiny_model_dir, NGEN="2"))
    halfway = read_json(tmp_path / "out" / "evolution_state.json")
    assert halfway["generation"] == 2
    evolve(config_for(tmp_path, shared, tiny_model_dir, NGEN="4"))  # a new Evaluator: an empty cache

    assert read_json(tmp_path / "out" / "evolution_state.json") == read_json(uninterrupted / "evolution_state.json")
    # rr_idx was restored before mutate: the first mutation after the resume targets the
    # saved index's cluster, and the resumed generations mutated the same targets.
    ids = list(halfway["population"][0]["deltas"])
    first = min((tmp_path / "out" / "reflector_prompts").glob("gen_2_mutation_child*_attempt1.txt"))
    assert f"target_cluster: {ids[halfway['rr_idx']]}\n" in first.read_text()
    assert prompt_logs(tmp_path / "out", range(2, 4)) == prompt_logs(uninterrupted, range(2, 4))
    resumed_history = read_json(tmp_path / "out" / "history.json")
    assert [h["generation"] for h in resumed_history] == [0, 1, 2, 3, 4]
    tree = read_json(tmp_path / "out" / "tree.json")
    assert tree["nodes"] == read_json(uninterrupted / "tree.json")["nodes"]


def start_evolve(config_path: Path) -> subprocess.Popen[str]:
    # As from a terminal: a test run started in the background (`make test &`) inherits
    # an ignored SIGINT, which Python would keep, and Ctrl+C is what is being tested.
    return subprocess.Popen([sys.executable, "-m", "compressor_2", "evolve", "--config", str(config_path)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_stopped(proc: subprocess.Popen[str]) -> None:
    """Until the kernel has stopped the process (SIGSTOP takes effect after kill returns),
    or it has ended."""
    stat = Path(f"/proc/{proc.pid}/stat")
    while stat.exists():
        try:
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state in "TtZX":
            return
        time.sleep(0.001)


def interrupt_after(proc: subprocess.Popen[str], state_path: Path, generation: int, sig: int) -> int:
    """Sends `sig` once the saved state reaches `generation`; returns the generation seen.
    The run is stopped (SIGSTOP) while its state is read and signalled, so however late
    this process is scheduled, the run takes `sig` at the generation seen."""
    deadline = time.monotonic() + 300  # a hang guard, not a speed assertion
    while time.monotonic() < deadline and proc.poll() is None:
        proc.send_signal(signal.SIGSTOP)
        try:
            wait_stopped(proc)
            if state_path.exists() and (seen := read_json(state_path)["generation"]) >= generation:
                proc.send_signal(sig)
                return seen
        finally:
            proc.send_signal(signal.SIGCONT)
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"the run ended (or hung) before generation {generation}: {proc.communicate()}")


@pytest.mark.slow
def test_ctrl_c_then_resume_matches_an_uninterrupted_run(tmp_path, shared, tiny_model_dir, uninterrupted,
                                                         capsys):
    config_path = write_config(tmp_path, shared, tiny_model_dir, NGEN="4")
    state_path = tmp_path / "out" / "evolution_state.json"

    proc = start_evolve(config_path)
    seen = interrupt_after(proc, state_path, 1, signal.SIGINT)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr
    assert "interrupted: state saved to" in stderr
    assert f"rerun the same command: python -m compressor_2 evolve --config {config_path}" in stderr
    saved = read_json(state_path)["generation"]
    assert seen <= saved < 4  # at most the generation in progress was lost

    # The rerun, in this process to spare a second interpreter start-up.
    evolve(load_config(config_path))
    assert f"resuming at generation {saved} ({saved + 1} of 4)" in capsys.readouterr().out
    assert read_json(state_path) == read_json(uninterrupted / "evolution_state.json")


@pytest.mark.slow
def test_sigterm_during_a_reflector_call_then_resume(tmp_path, shared, tiny_model_dir, uninterrupted,
                                                      monkeypatch, capsys):
    """SIGTERM arrives while the main thread waits for a reflector call in the pool."""
    original = LocalProposer.mutation
    once = threading.Lock()  # one signal only: a late one would meet pytest's own SIGTERM handler

    def mutation_then_sigterm(self, request, messages, attempt):
        if request.generation == 2 and once.acquire(blocking=False):
            os.kill(os.getpid(), signal.SIGTERM)
            # This call stays in flight until the main thread has taken the signal, however
            # long the machine makes that take (the deadline only guards against a hang).
            deadline = time.monotonic() + 300
            while not interrupts.stopping() and time.monotonic() < deadline:
                time.sleep(0.01)
        return original(self, request, messages, attempt)

    monkeypatch.setattr(LocalProposer, "mutation", mutation_then_sigterm)
    with pytest.raises(KeyboardInterrupt):
        evolve(config_for(tmp_path, shared, tiny_model_dir, NGEN="4"))
    assert "interrupted: state saved to" in capsys.readouterr().err
    assert read_json(tmp_path / "out" / "evolution_state.json")["generation"] == 2

    monkeypatch.setattr(LocalProposer, "mutation", original)
    evolve(config_for(tmp_path, shared, tiny_model_dir, NGEN="4"))
    assert read_json(tmp_path / "out" / "evolution_state.json") == read_json(uninterrupted / "evolution_state.json")
    # The history too, but for what the replay served from the archive instead of generating.
    counters = ("evaluations_run", "cache_hits", "metric_calls", "seconds")
    resumed, whole = (
        [{k: v for k, v in h.items() if k not in counters} for h in read_json(out / "history.json")]
        for out in (tmp_path / "out", uninterrupted))
    assert resumed == whole


@pytest.mark.slow
def test_a_best_found_in_the_interrupted_generation_leaves_the_history_as_uninterrupted(
        tmp_path, shared, tiny_model_dir, uninterrupted, monkeypatch):
    """Ctrl+C in generation 0 right after its mutated children found a new best: the saved
    best is that one, yet the replayed history must say what the uninterrupted run's said
    (the best so far at each point), counters aside."""
    from compressor_2.archive import RunArchive

    original = RunArchive.admit

    def interrupt_after_the_mutated_children(self, candidates, spots, placements, step):
        # Generation 0 admits its mutated children, then places the next population.
        if step == 0 and not candidates and placements[0].spot.stage == "pop":
            raise KeyboardInterrupt
        return original(self, candidates, spots, placements, step)

    monkeypatch.setattr(RunArchive, "admit", interrupt_after_the_mutated_children)
    with pytest.raises(KeyboardInterrupt):
        evolve(config_for(tmp_path, shared, tiny_model_dir, NGEN="4"))
    monkeypatch.setattr(RunArchive, "admit", original)
    saved = read_json(tmp_path / "out" / "evolution_state.json")
    first = read_json(uninterrupted / "history.json")[0]
    assert saved["generation"] == 0 and saved["best_fitness"] > first["best_ever_fitness"]
    evolve(config_for(tmp_path, shared, tiny_model_dir, NGEN="4"))
    counters = ("evaluations_run", "cache_hits", "metric_calls", "seconds")
    resumed, whole = (
        [{k: v for k, v in h.items() if k not in counters} for h in read_json(out / "history.json")]
        for out in (tmp_path / "out", uninterrupted))
    assert resumed == whole
    assert read_json(tmp_path / "out" / "evolution_state.json") == read_json(uninterrupted / "evolution_state.json")


@pytest.mark.slow
def test_a_resumed_sampling_run_recomputes_the_best_from_its_rescored_population(tmp_path, shared, tiny_model_dir,
                                                                                 capsys):
    """With CONFIG_TEMPERATURE > 0 (the transformers engine samples) a resume
    evaluates the population afresh, and the stored best stays unless a re-scored member
    beats it. The stored best fitness is set to 0, then to the maximum, so that the
    outcome does not depend on the samples; the budget stops each resume right after."""
    sampling = {"TEMPERATURE": '"1.0"'}
    out = tmp_path / "out"
    evolve(config_for(tmp_path, shared, tiny_model_dir, NGEN="1", **sampling))

    def resume_with_stored_best(fitness: float) -> dict:
        state = read_json(out / "evolution_state.json")
        state["best_fitness"] = fitness
        (out / "evolution_state.json").write_text(json.dumps(state))
        calls = query(out, "SELECT count(*) FROM evaluations")[0][0]
        capsys.readouterr()
        evolve(config_for(tmp_path, shared, tiny_model_dir, NGEN="2", MAX_METRIC_CALLS=str(calls), **sampling))
        assert query(out, "SELECT count(*) FROM evaluations")[0][0] > calls  # the population was sampled afresh
        return state

    before = resume_with_stored_best(0.0)  # any re-scored member beats it
    resumed = read_json(out / "evolution_state.json")
    population = {m["candidate_id"]: m["deltas"] for m in before["population"]}
    assert resumed["best_fitness"] > 0.0 and resumed["best_individual"]["candidate_id"] in population
    assert read_json(out / "deltas_best.json") == resumed["best_individual"]["deltas"]
    printed = capsys.readouterr().out
    assert "new best fitness" in printed and f"best fitness {resumed['best_fitness']:.4f}" in printed.splitlines()[-1]

    files = (out / "deltas_best.json").read_bytes()
    resume_with_stored_best(1.0)  # lambda_shortness + lambda_correctness: nothing beats it
    assert read_json(out / "evolution_state.json")["best_fitness"] == 1.0
    assert (out / "deltas_best.json").read_bytes() == files
    assert "best fitness 1.0000" in capsys.readouterr().out.splitlines()[-1]

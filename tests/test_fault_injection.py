"""Fault injection: a real `python -m compressor_2 evolve` killed with SIGKILL at random
moments, then rerun to completion.

SIGKILL gives the run no chance to save anything: whatever it was writing (a
transaction of run.sqlite, history.json, tree.json, evolution_state.json, a plot) is
cut off where it stands. After each kill the run directory must still be sound
(`PRAGMA integrity_check` is "ok", every JSON file parses), and a rerun must end in
exactly the state of the uninterrupted run: evolution_state.json, deltas_best.json,
tree.json's nodes and the archive's candidates with their lineage. The kill moments are
drawn from a seeded `random.Random`, one uniformly in each of TRIALS equal slices of the
measured length of an uninterrupted run, so a failing trial can be replayed from its
seed and index.

"Resume costs nothing": a run killed after its first saved generation and rerun ends
with exactly the uninterrupted run's `evaluations` rows (no answer generated twice, none
missing), its population re-evaluated from the archive (cache hits), and a rerun of the
finished run generates nothing.

The helpers here are shared with benchmarks/fault_injection.py (100 trials).
"""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from compressor_2.clusters.builder import build_clusters
from compressor_2.commands.evolve import evolve
from compressor_2.config import load_config
from tests.conftest import REPO
from tests.test_evolution_support import DEFAULT_NGEN, config_for, default_run, shared_dir, write_config

ARCHIVE = "run.sqlite"
STATE = "evolution_state.json"
JSON_FILES = ("evolution_state.json", "history.json", "tree.json", "deltas_best.json")
SEED = 20_250_601
TRIALS = 10
HANG_GUARD = 600.0  # seconds: a hung run is killed and reported, never waited for


# -- helpers (also used by benchmarks/fault_injection.py) ------------------------------------

def evolve_command(config_path: Path) -> list[str]:
    return [sys.executable, "-m", "compressor_2", "evolve", "--config", str(config_path)]


def run_to_completion(config_path: Path, log: Path) -> tuple[int, float]:
    """`evolve` in a subprocess, output to `log`; (return code, wall seconds)."""
    started = time.monotonic()
    with log.open("w") as handle:
        proc = subprocess.run(evolve_command(config_path), cwd=REPO, stdout=handle, stderr=subprocess.STDOUT,
                              timeout=HANG_GUARD, check=False)
    return proc.returncode, time.monotonic() - started


def kill_at(config_path: Path, delay: float, log: Path) -> tuple[int, float]:
    """Starts `evolve` and sends SIGKILL `delay` seconds later unless it has ended by
    then; (return code: -9 when killed, seconds from start to the kill or the end)."""
    started = time.monotonic()
    with log.open("w") as handle:
        proc = subprocess.Popen(evolve_command(config_path), cwd=REPO, stdout=handle, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode, time.monotonic() - started


def kill_once_saved(config_path: Path, generation: int, log: Path) -> tuple[int, int]:
    """Starts `evolve` and sends SIGKILL as soon as evolution_state.json says
    `generation` or later; (return code, generation seen)."""
    state = config_path.parent / "out" / STATE
    with log.open("w") as handle:
        proc = subprocess.Popen(evolve_command(config_path), cwd=REPO, stdout=handle, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + HANG_GUARD
        seen = -1
        while time.monotonic() < deadline and proc.poll() is None:
            if state.exists() and (seen := json.loads(state.read_text())["generation"]) >= generation:
                break
            time.sleep(0.01)
        proc.kill()
        proc.wait()
    return proc.returncode, seen


def temp_files(out: Path) -> list[Path]:
    """The atomic writer's temp files (`.{name}.{8 characters}.tmp`) in a run directory."""
    return sorted(out.rglob(".*.tmp")) if out.exists() else []


def connect(db: Path) -> sqlite3.Connection:
    """run.sqlite as left behind, read-only: the WAL a killed writer left is read, never
    checkpointed away, so the file is inspected exactly as the rerun will find it."""
    return sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)


def soundness_problems(out: Path) -> list[str]:
    """What is wrong with a run directory right after a kill: the archive's integrity,
    and every JSON file that exists must parse."""
    problems = []
    db = out / ARCHIVE
    if db.exists():
        try:
            with closing(connect(db)) as conn:
                verdict = [row[0] for row in conn.execute("PRAGMA integrity_check")]
        except sqlite3.DatabaseError as exc:
            verdict = [f"cannot be opened: {exc}"]
        if verdict != ["ok"]:
            problems.append(f"{ARCHIVE}: integrity_check says {verdict}")
    for name in JSON_FILES:
        if (out / name).exists():
            try:
                json.loads((out / name).read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as exc:
                problems.append(f"{name} does not parse: {exc}")
    return problems


CANDIDATE_FIELDS = ("id", "operator", "generation", "status", "deltas", "scratchpad", "fitness", "parents")


def candidates(out: Path) -> list[tuple[Any, ...]]:
    """(id, operator, generation, status, deltas, scratchpad, fitness, parents) per
    candidate, in id order; parents from the lineage table in position order."""
    with closing(connect(out / ARCHIVE)) as conn:
        parents: dict[int, list[int]] = {}
        for child, parent in conn.execute("SELECT child, parent FROM lineage ORDER BY child, position"):
            parents.setdefault(child, []).append(parent)
        return [(cid, operator, generation, status, json.loads(deltas), scratchpad, fitness,
                 parents.get(cid, []))
                for cid, operator, generation, status, deltas, scratchpad, fitness in conn.execute(
                    "SELECT id, operator, generation, status, deltas, scratchpad, fitness FROM candidates "
                    "ORDER BY id")]


def evaluations(out: Path) -> dict[tuple[str, str, str], float]:
    """Every stored answer's key (genome, example, context) and when it was written."""
    if not (out / ARCHIVE).exists():
        return {}
    with closing(connect(out / ARCHIVE)) as conn:
        return {(g, e, c): created for g, e, c, created in
                conn.execute("SELECT genome, example, context, created FROM evaluations")}


def cache_hits(out: Path) -> int:
    if not (out / ARCHIVE).exists():
        return 0
    with closing(connect(out / ARCHIVE)) as conn:
        row = conn.execute("SELECT value FROM meta WHERE key = 'cache_hits'").fetchone()
    return int(row[0]) if row else 0


def _read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def _first_difference(ours: Any, theirs: Any, where: str = "") -> str:
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in list(ours) + [k for k in theirs if k not in ours]:
            if key not in ours or key not in theirs:
                return f"{where}.{key} present in only one"
            if ours[key] != theirs[key]:
                return _first_difference(ours[key], theirs[key], f"{where}.{key}")
    if isinstance(ours, list) and isinstance(theirs, list):
        if len(ours) != len(theirs):
            return f"{where}: {len(ours)} items vs {len(theirs)}"
        for i, (a, b) in enumerate(zip(ours, theirs)):
            if a != b:
                return _first_difference(a, b, f"{where}[{i}]")
    return f"{where or 'value'}: {str(ours)[:300]} vs {str(theirs)[:300]}"


def final_state_differences(out: Path, reference: Path) -> list[str]:
    """How a finished run in `out` differs from the uninterrupted `reference` run."""
    problems = []
    for name in (STATE, "deltas_best.json"):
        ours, theirs = _read(out / name), _read(reference / name)
        if ours != theirs:
            problems.append(f"{name} differs at {_first_difference(ours, theirs)}")
    ours_tree, theirs_tree = _read(out / "tree.json"), _read(reference / "tree.json")
    ours_nodes = ours_tree["nodes"] if ours_tree else None
    if ours_nodes != theirs_tree["nodes"]:
        problems.append(f"tree.json nodes differ at {_first_difference(ours_nodes, theirs_tree['nodes'])}")
    ours_c = candidates(out) if (out / ARCHIVE).exists() else []
    theirs_c = candidates(reference)
    if ours_c != theirs_c:
        problems.append(f"candidates differ ({len(ours_c)} rows vs {len(theirs_c)}): " + "; ".join(
            f"candidate {a[0]}: " + ", ".join(f"{field} {x!r:.200} vs {y!r:.200}"
                                                for field, x, y in zip(CANDIDATE_FIELDS, a, b) if x != y)
            for a, b in zip(ours_c, theirs_c) if a != b))
    return problems


@dataclass(frozen=True)
class Reference:
    out: Path  # the uninterrupted run's output dir
    seconds: float  # its wall time as a subprocess, interpreter start included


def kill_delays(seed: int, trials: int, seconds: float) -> list[float]:
    """The kill moments, reproducible from `seed`: the run cut into `trials` equal slices
    and one moment drawn uniformly in each, so they cover the whole run evenly (start-up,
    every generation's evaluations and writes, the final plots) even for a few trials."""
    rng = random.Random(seed)
    return [(i + rng.random()) * seconds / trials for i in range(trials)]


# -- tests ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    return shared_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, shared, tiny_model_dir) -> Reference:
    """One uninterrupted subprocess run of the default config: the state every resumed
    run must reach, and its wall time, the window the kills are spread over. The
    clusters are built first, so the window is that of a run which finds them."""
    work = tmp_path_factory.mktemp("fault_reference")
    build_clusters(config_for(work, shared, tiny_model_dir))
    code, seconds = run_to_completion(write_config(work, shared, tiny_model_dir), work / "evolve.log")
    assert code == 0, (work / "evolve.log").read_text()
    return Reference(work / "out", seconds)


@pytest.mark.slow
def test_the_reference_is_the_shared_in_process_run(tmp_path_factory, shared, tiny_model_dir, reference):
    """The resumes below run in this process; the subprocess reference must be what an
    in-process run makes."""
    assert not final_state_differences(default_run(tmp_path_factory, shared, tiny_model_dir), reference.out)


def rerun_in_process(config_path: Path) -> None:
    evolve(load_config(config_path))


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(TRIALS))
def test_sigkill_at_a_random_moment_then_resume(trial, tmp_path, shared, tiny_model_dir, reference):
    delay = kill_delays(SEED, TRIALS, reference.seconds)[trial]
    config_path = write_config(tmp_path, shared, tiny_model_dir)
    out = tmp_path / "out"
    code, when = kill_at(config_path, delay, tmp_path / "killed.log")
    saved = (_read(out / STATE) or {}).get("generation")
    what = (f"seed {SEED} trial {trial}: SIGKILL at {when:.2f}s of a {reference.seconds:.2f}s run "
            f"(return code {code}, saved generation {saved})")
    print(what)
    assert code in (-9, 0), what  # killed, or it ended before the kill was due

    problems = soundness_problems(out)
    assert not problems, f"{what}: {problems}"

    left = temp_files(out)
    rerun_in_process(config_path)
    problems = final_state_differences(out, reference.out)
    assert not problems, f"{what}: {problems}"
    # The rerun removed the temp files the kill left behind (issue K item 6).
    assert temp_files(out) == [], f"{what}: {len(left)} temp file(s) after the kill, still {temp_files(out)}"


@pytest.mark.slow
def test_resume_costs_nothing(tmp_path, shared, tiny_model_dir, reference):
    config_path = write_config(tmp_path, shared, tiny_model_dir)
    out = tmp_path / "out"
    code, seen = kill_once_saved(config_path, 1, tmp_path / "killed.log")
    assert code == -9 and 1 <= seen < DEFAULT_NGEN, (code, seen, (tmp_path / "killed.log").read_text())
    assert not soundness_problems(out)

    before, hits_before = evaluations(out), cache_hits(out)
    expected = evaluations(reference.out)
    assert 0 < len(before) <= len(expected)
    assert set(before) <= set(expected)  # nothing the uninterrupted run did not answer

    rerun_in_process(config_path)
    after = evaluations(out)
    assert len(after) == len(expected)  # the metric calls of an uninterrupted run, no more
    assert set(after) == set(expected)
    # No (genome, example) pair answered before the kill was generated again (the row
    # would have been replaced, with a new timestamp).
    assert {key: after[key] for key in before} == before
    assert cache_hits(out) > hits_before  # the population came back from the archive
    assert not final_state_differences(out, reference.out)

    # A rerun of the finished run generates nothing.
    hits_done = cache_hits(out)
    rerun_in_process(config_path)
    assert evaluations(out) == after
    assert cache_hits(out) == hits_done
    assert not final_state_differences(out, reference.out)

"""Fault injection: how often does a run survive a SIGKILL at a random moment?

Each trial starts `python -m compressor_2 evolve` (a tiny random GPT-2 built here, the
4-generation GA config of the tests: population 4, 3 training examples), kills it with
SIGKILL at a moment drawn from a seeded `random.Random` (the length of an uninterrupted
run cut into `--trials` equal slices, one moment uniform in each, so the kills cover the
whole run evenly; a trial is replayed from `--seed`, `--trials` and its number), and then:

  1. checks the run directory as the kill left it: `PRAGMA integrity_check` of
     run.sqlite is "ok", and every JSON file that exists parses;
  2. reruns the same command in a fresh interpreter to completion;
  3. compares the result with the uninterrupted run: evolution_state.json,
     deltas_best.json, tree.json's nodes and the archive's candidates (operator,
     generation, deltas, scratchpad, fitness, parents) must be equal.

A trial survives when all three hold. One line per trial (kill moment, the generation
the kill cut short, leftover temp files of cut-off atomic writes, the verdict), then
"survived N of M trials"; exit code 1 if any trial failed (its directory is kept and
named). The uninterrupted run is timed once at the start: it is the window for the kill
moments. About 10 s a trial on 2 cores.

Run: .venv/bin/python benchmarks/fault_injection.py [--trials 100] [--seed 20250601]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from tests.conftest import build_tiny_model  # noqa: E402
from tests.test_evolution_support import DEFAULT_NGEN as NGEN, write_config  # noqa: E402
from tests.test_fault_injection import (  # noqa: E402
    ARCHIVE, SEED, STATE, final_state_differences, kill_at, kill_delays, run_to_completion, soundness_problems,
)


def build_model_quietly(directory: Path) -> None:
    """build_tiny_model, without the blank lines the tokenizer trainer writes to fd 1."""
    sys.stdout.flush()
    saved, devnull = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    try:
        build_tiny_model(directory)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def trial(number: int, delay: float, work: Path, shared: Path, model: Path, reference: Path) -> tuple[bool, str]:
    """One kill and resume in `work`; (survived, the report line)."""
    config_path = write_config(work, shared, model)
    out = work / "out"
    code, when = kill_at(config_path, delay, work / "killed.log")
    saved = json.loads((out / STATE).read_text())["generation"] if (out / STATE).exists() else None
    leftovers = len(list(out.glob(".*.tmp"))) if out.exists() else 0
    how = "killed" if code == -9 else f"ended first (code {code})"
    if not (out / ARCHIVE).exists():
        phase = "before the archive"
    elif saved is None or saved < NGEN:
        phase = f"in generation {saved or 0}"
    else:
        phase = "after the last generation"
    line = f"trial {number:3d}: {how} at {when:5.2f}s, {phase}, {leftovers} temp file(s) left"
    problems = soundness_problems(out)
    if code not in (-9, 0):
        problems.append(f"the killed run exited with code {code}: see {work / 'killed.log'}")
    if not problems:
        code, seconds = run_to_completion(config_path, work / "resumed.log")
        if code != 0:
            problems.append(f"the rerun exited with code {code}: see {work / 'resumed.log'}")
        else:
            problems = final_state_differences(out, reference)
            line += f"; resumed in {seconds:4.1f}s"
    if problems:
        return False, f"{line}: FAILED ({work}): " + "; ".join(problems)
    return True, f"{line}: ok"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--keep", action="store_true", help="keep every trial's directory, not only failed ones")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="fault_injection_"))
    model, shared = root / "model", root / "shared"
    model.mkdir()
    shared.mkdir()
    build_model_quietly(model)
    reference = root / "reference"
    reference.mkdir()
    config_path = write_config(reference, shared, model)
    subprocess.run([sys.executable, "-m", "compressor_2", "build-clusters", "--config", str(config_path)],
                   cwd=REPO, check=True, capture_output=True)
    code, seconds = run_to_completion(config_path, reference / "evolve.log")
    if code != 0:
        print(f"the uninterrupted run failed (code {code}): {reference / 'evolve.log'}")
        return 1
    print(f"uninterrupted run: {seconds:.2f}s (interpreter start included); {args.trials} trials, seed {args.seed}, "
          f"one kill moment uniform in each slice of 0..{seconds:.2f}s; work directory {root}", flush=True)

    survived, failed = 0, []
    for number, delay in enumerate(kill_delays(args.seed, args.trials, seconds)):
        work = root / f"trial_{number:03d}"
        work.mkdir()
        ok, line = trial(number, delay, work, shared, model, reference / "out")
        print(line, flush=True)
        if ok:
            survived += 1
            if not args.keep:
                shutil.rmtree(work)
        else:
            failed.append(number)
    print(f"survived {survived} of {args.trials} trials" + (f" (failed: {failed})" if failed else ""))
    if not failed and not args.keep:
        shutil.rmtree(root)
    return 1 if failed else 0


if __name__ == "__main__":
    started = time.monotonic()
    status = main()
    print(f"total {time.monotonic() - started:.0f}s")
    sys.exit(status)

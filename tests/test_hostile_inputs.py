"""Issue K, items 4 to 7 and 9: every hostile input found so far, run through the real CLI,
each with the exit code and the one line it must give.

The table (`CASES`) runs `compressor_2.cli.main` in this process. A case plants its input
in a fresh directory (`Scene`) and returns the command line to run. A refused input must
end in exactly one line on stderr, before any work: no answer is added to the run
archive and no file of the run directory changes. Inputs that need a run to resume get a
copy of the session's uninterrupted 4-generation run, resumed with CONFIG_NGEN=5, so an
input that slipped through would run a generation. What needs a process of its own (a
directory root may not write, Ctrl+C pressed again and again) or other checks (tree.json,
temp files a kill left) follows the table.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from compressor_2.cli import main
from tests.test_evolution_support import DEFAULT_NGEN, write_config

pytestmark = pytest.mark.slow

RESUMED_NGEN = str(DEFAULT_NGEN + 1)


@dataclass
class Scene:
    """A fresh working directory with a tiny config; `out` is its CONFIG_OUTPUT_DIR."""

    work: Path
    shared: Path
    model: Path
    uninterrupted: Path

    @property
    def out(self) -> Path:
        return self.work / "out"

    def config(self, **symbols: str) -> Path:
        return write_config(self.work, self.shared, self.model, **symbols)

    def command(self, name: str, *args: str, **symbols: str) -> list[str]:
        return [name, "--config", str(self.config(**symbols)), *args]

    def config_text(self, extra: bytes, **symbols: str) -> list[str]:
        """check-config on the tiny config with `extra` appended as raw bytes."""
        path = self.config(**symbols)
        path.write_bytes(path.read_bytes() + extra)
        return ["check-config", "--config", str(path)]

    def sglang_check(self, **symbols: str) -> list[str]:
        """check-config on the tiny config switched to the SGLang engine."""
        path = self.config(ENGINE_SGLANG="y", **symbols)
        path.write_text("".join(line for line in path.read_text().splitlines(keepends=True)
                                if not line.startswith("CONFIG_TRANSFORMERS_DEVICE=")))
        return ["check-config", "--config", str(path)]

    def finished_run(self) -> Path:
        """A copy of the uninterrupted run as this scene's output directory."""
        shutil.copytree(self.uninterrupted, self.out)
        return self.out

    def edit_run_file(self, name: str, edit: Callable[[Any], Any]) -> list[str]:
        """The finished run with `name` replaced by `edit(its JSON)` (or edited in place when
        `edit` returns None), resumed for one more generation."""
        path = self.finished_run() / name
        raw = json.loads(path.read_text(encoding="utf-8"))
        edited = edit(raw)
        path.write_text(json.dumps(raw if edited is None else edited), encoding="utf-8")
        return self.command("evolve", NGEN=RESUMED_NGEN)


@dataclass(frozen=True)
class Case:
    name: str
    plant: Callable[[Scene], list[str]]  # plants the input, returns the command line
    code: int
    pattern: str  # a regex the single error line (or, with code 0, stdout) must match


def answers_stored(out: Path) -> int:
    if not (out / "run.sqlite").exists():
        return 0
    with closing(sqlite3.connect(out / "run.sqlite")) as db:
        return int(db.execute("SELECT count(*) FROM evaluations").fetchone()[0])


def run_files(out: Path) -> dict[str, bytes]:
    """The run directory's files but the archive and the lock (which every start opens)."""
    if not out.is_dir():
        return {}
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and not p.name.startswith(("run.sqlite", "run.lock"))}


MISSPELT_TEMPLATE = "{evidence}\n\n{question}\nAnswer in {foo} words."


def template(scene: Scene, text: str) -> Path:
    path = scene.work / "template.txt"
    path.write_text(text, encoding="utf-8")
    return path


def planted(scene: Scene, data: bytes, name: str = "planted") -> Path:
    path = scene.work / name
    path.write_bytes(data)
    return path


def drop(key: str) -> Callable[[Any], None]:
    def edit(raw: Any) -> None:
        del raw[key]
    return edit


def put(*path: Any, value: Any) -> Callable[[Any], None]:
    """An edit setting the item at `path` (keys and indices) of a JSON document to `value`."""
    def edit(raw: Any) -> None:
        for key in path[:-1]:
            raw = raw[key]
        raw[path[-1]] = value
    return edit


STATE, HISTORY = "evolution_state.json", "history.json"
NAN = float("nan")

CASES = [
    # -- item 4: hand-edited run files -----------------------------------------------------------
    Case("state: a best fitness of NaN", lambda s: s.edit_run_file(STATE, put("best_fitness", value=NAN)),
         2, r"evolution_state\.json': best_fitness is nan, not a finite number in \[0, 1\]"),
    Case("state: a generation of true", lambda s: s.edit_run_file(STATE, put("generation", value=True)),
         2, r"evolution_state\.json': generation is True, not an integer >= 0"),
    Case("state: a best fitness of 99", lambda s: s.edit_run_file(STATE, put("best_fitness", value=99)),
         2, r"evolution_state\.json': best_fitness is 99, not a finite number in \[0, 1\]"),
    Case("state: a best fitness the archive contradicts",
         lambda s: s.edit_run_file(STATE, put("best_fitness", value=0.95)),
         2, r"evolution_state\.json': best_fitness is 0\.95, but '.*run\.sqlite' records 0\.\d+ for the best "
            r"individual \(candidate \d+\)"),
    Case("state: a best fitness as a string", lambda s: s.edit_run_file(STATE, put("best_fitness", value="0.4")),
         2, r"evolution_state\.json': best_fitness is '0\.4', not a finite number"),
    Case("state: no best fitness", lambda s: s.edit_run_file(STATE, drop("best_fitness")),
         2, r"evolution_state\.json': best_fitness is missing"),
    Case("state: a list, not an object", lambda s: s.edit_run_file(STATE, lambda raw: []),
         2, r"evolution_state\.json': holds \[\], not a JSON object"),
    Case("state: a member the archive does not hold",
         lambda s: s.edit_run_file(STATE, put("population", 0, "candidate_id", value=9999)),
         2, r"evolution_state\.json': population\[0\] is candidate 9999, but '.*run\.sqlite' does not hold it"),
    Case("state: a member's delta of NaN",
         lambda s: s.edit_run_file(STATE, put("population", 1, "deltas", "0", value=NAN)),
         2, r"evolution_state\.json': population\[1\]\.deltas\.0 is nan, not a finite number"),
    Case("history: an object, not a list", lambda s: s.edit_run_file(HISTORY, lambda raw: {}),
         2, r"history\.json': holds \{\}, not a list of generation entries"),
    Case("history: a fitness as a string", lambda s: s.edit_run_file(HISTORY, put(2, "best_fitness", value="high")),
         2, r"history\.json': entry 2: best_fitness is 'high', not a finite number"),
    Case("history: a generation of true", lambda s: s.edit_run_file(HISTORY, put(1, "generation", value=True)),
         2, r"history\.json': entry 1: generation is True, not an integer >= 0"),
    Case("history: mean tokens of NaN", lambda s: s.edit_run_file(HISTORY, put(0, "mean_tokens", value=NAN)),
         2, r"history\.json': entry 0: mean_tokens is nan, not a finite number"),
    Case("history: an infinite counter", lambda s: s.edit_run_file(HISTORY, put(0, "seconds", value=float("inf"))),
         2, r"history\.json': entry 0: seconds is inf, not a finite number"),
    Case("history: shorter than the state", lambda s: s.edit_run_file(HISTORY, lambda raw: raw[:2]),
         2, rf"history\.json' ends before generation {DEFAULT_NGEN}, where the run resumes"),
    # -- item 5: config holes ------------------------------------------------------------------
    Case("truncation size with tournament selection", lambda s: s.command("check-config", TRUNCATION_TOP_K="3"),
         2, r"CONFIG_TRUNCATION_TOP_K=3 is set but no selection draws by truncation"),
    Case("tournament size with truncation selection",
         lambda s: s.command("check-config", SELECTION='"truncation"', TRUNCATION_TOP_K="2"),
         2, r"CONFIG_TOURNAMENT_SIZE=2 is set but no selection draws by tournament"),
    Case("a config line twice", lambda s: s.config_text(b"CONFIG_NGEN=4\n", NGEN="4"),
         2, r"test\.config:\d+: CONFIG_NGEN set more than once"),
    Case("a config that is not UTF-8", lambda s: s.config_text(b"# caf\xe9\n"),
         2, r"config file '.*test\.config' line \d+: byte 0xe9 is not UTF-8"),
    Case("a config that is a directory", lambda s: ["check-config", "--config", str(s.work)],
         2, r"config file '.*' is a directory"),
    Case("NGEN with a leading zero is read as kconfiglib reads it", lambda s: s.command("check-config", NGEN="01"),
         0, r"(?m)^ngen += 1$"),
    Case("an unknown placeholder in the prompt template",
         lambda s: s.command("evolve", PROMPT_TEMPLATE_PATH=f'"{template(s, MISSPELT_TEMPLATE)}"'),
         2, r"prompt template '.*' has the unknown placeholder\(s\) \{foo\}"),
    Case("a deltas file that is not UTF-8", lambda s: s.command("evaluate", "--deltas", str(planted(s, b"\xff{}"))),
         2, r"deltas file '.*planted' is not UTF-8"),
    Case("a deltas file that is a directory", lambda s: s.command("evaluate", "--deltas", str(s.work)),
         2, r"deltas file '.*' is a directory"),
    Case("initial deltas that are a directory", lambda s: s.command("evolve", INITIAL_DELTAS_PATH=f'"{s.work}"'),
         2, r"deltas file '.*' is a directory"),
    # -- item 5: outputs that cannot be written, checked before any work ---------------------------
    Case("an output directory that is a file",
         lambda s: s.command("evolve", OUTPUT_DIR=f'"{planted(s, b"", "out")}"'),
         2, r"CONFIG_OUTPUT_DIR='.*out' is not a directory \(a file stands there or above it\)"),
    Case("an output directory under a file",
         lambda s: s.command("evolve", OUTPUT_DIR=f'"{planted(s, b"") / "out"}"'),
         2, r"CONFIG_OUTPUT_DIR='.*planted/out' is not a directory"),
    Case("evaluate --out a directory", lambda s: s.command("evaluate", "--out", str(s.work)),
         2, r"evaluate --out '.*' is a directory: name the JSON file to write"),
    Case("evaluate --out the run's state",
         lambda s: s.command("evaluate", "--out", str(s.finished_run() / STATE)),
         2, r"evaluate --out '.*out/evolution_state\.json' is a file of the run in '.*out'"),
    Case("evaluate --out the run's archive",
         lambda s: s.command("evaluate", "--out", str(s.finished_run() / "run.sqlite")),
         2, r"evaluate --out '.*out/run\.sqlite' is a file of the run in '.*out'"),
    Case("evaluate --out under a file", lambda s: s.command("evaluate", "--out", str(planted(s, b"") / "e.json")),
         2, r"evaluate --out '.*planted/e\.json': its directory is not a directory"),
    # -- item 7: one loopback rule for launched and attached SGLang servers -----------------------
    Case("an attached server on another machine", lambda s: s.sglang_check(SGLANG_URLS='"http://10.0.0.5:30000"'),
         2, r"CONFIG_SGLANG_URLS has http://10\.0\.0\.5:30000, which is not a loopback address .*SSH tunnel"),
    Case("an attached server on another machine, allowed",
         lambda s: s.sglang_check(SGLANG_URLS='"http://10.0.0.5:30000"', SGLANG_ALLOW_REMOTE="y"),
         0, r"(?m)^sglang_urls += http://10\.0\.0\.5:30000$"),
    Case("attached servers on IPv6 and IPv4 loopback addresses",
         lambda s: s.sglang_check(SGLANG_URLS='"http://[::1]:30000,http://127.0.0.2:30001,http://localhost:30002"'),
         0, r"(?m)^sglang_urls += http://\[::1\]:30000,"),
    Case("a launched server exposed on all interfaces",
         lambda s: s.sglang_check(SGLANG_COMMAND='"python -m sglang.launch_server --host 0.0.0.0"'),
         2, r"CONFIG_SGLANG_COMMAND has --host 0\.0\.0\.0, which exposes the server"),
    Case("a launched server on the IPv6 loopback",
         lambda s: s.sglang_check(SGLANG_COMMAND='"python -m sglang.launch_server --host ::1"'),
         0, r"(?m)^sglang_command += python -m sglang\.launch_server --host ::1$"),
    # -- issue M: what would silently stop or misdirect the steering ------------------------------
    Case("a launched server with speculative decoding",
         lambda s: s.sglang_check(SGLANG_COMMAND='"python -m sglang.launch_server --speculative-algorithm=EAGLE"'),
         2, r"CONFIG_SGLANG_COMMAND has --speculative-algorithm: .*every token after an answer's first"),
    Case("a launched server of another model",
         lambda s: s.sglang_check(SGLANG_COMMAND='"python -m sglang.launch_server --model-path /models/other"'),
         2, r"CONFIG_SGLANG_COMMAND has --model-path '/models/other' but CONFIG_MODEL_PATH="),
    Case("a launched server of another model, allowed",
         lambda s: s.sglang_check(SGLANG_COMMAND='"python -m sglang.launch_server --model-path /models/other"',
                                  SGLANG_ALLOW_OTHER_MODEL="y"),
         0, r"(?m)^sglang_allow_other_model += True$"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_hostile_input_gets_one_line_and_its_exit_code(case: Case, tmp_path, shared, tiny_model_dir, uninterrupted,
                                                          capsys):
    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted)
    argv = case.plant(scene)
    files, answers = run_files(scene.out), answers_stored(scene.out)
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    if case.code == 0:
        assert code == 0, captured.err
        assert re.search(case.pattern, captured.out), captured.out
        return
    lines = captured.err.strip().splitlines()
    assert (code, len(lines)) == (case.code, 1), captured.err
    assert re.fullmatch(rf"error: .*{case.pattern}.*", lines[0]), lines[0]
    assert answers_stored(scene.out) == answers and run_files(scene.out) == files


def test_a_hand_edited_tree_is_never_read_but_drawn_again(tmp_path, shared, tiny_model_dir, uninterrupted, capsys):
    """tree.json is a copy for other tools: the tree is drawn from the archive, so an edit
    (here: edges without their kind) cannot reach the run, and the next save replaces it."""
    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted)
    argv = scene.edit_run_file("tree.json", lambda raw: {"nodes": raw["nodes"], "edges": [{"source": "x"}]})
    assert main(argv) == 0, capsys.readouterr().err
    tree = json.loads((scene.out / "tree.json").read_text(encoding="utf-8"))
    assert all("kind" in edge for edge in tree["edges"])
    assert any(node["id"] == f"g{RESUMED_NGEN}_pop0" for node in tree["nodes"])


PR_CAPBSET_DROP = 24  # prctl(2)
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2  # capability(7)


def obeying_permissions() -> None:
    """preexec_fn: the child loses the capabilities that let root write anywhere (its bounding
    set, so the interpreter it execs never has them); for other users a no-op."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)


def test_an_output_directory_that_cannot_be_written_is_refused_before_any_work(tmp_path, shared, tiny_model_dir,
                                                                             uninterrupted):
    """A run directory made read-only: the resumed run would otherwise fail at its first save,
    after a generation's work. A subprocess, so that it runs without root's overrides."""
    import subprocess
    import sys

    from tests.conftest import REPO

    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted)
    argv = scene.command("evolve", NGEN=RESUMED_NGEN)
    out = scene.finished_run()
    files, answers = run_files(out), answers_stored(out)
    out.chmod(0o555)
    try:
        probe = subprocess.run([sys.executable, "-c", "import pathlib, sys; pathlib.Path(sys.argv[1], 'x').touch()",
                                str(out)], capture_output=True, preexec_fn=obeying_permissions, check=False)
        if probe.returncode == 0:
            pytest.skip("this user writes into a read-only directory (root, and its CAP_DAC_OVERRIDE cannot be "
                        "dropped here)")
        result = subprocess.run([sys.executable, "-m", "compressor_2", *argv], cwd=REPO, capture_output=True,
                                text=True, preexec_fn=obeying_permissions, timeout=300, check=False)
    finally:
        out.chmod(0o755)
    assert (result.returncode, result.stderr.strip().splitlines()) == (
        2, [f"error: CONFIG_OUTPUT_DIR='{out}' cannot be written (Permission denied)"]), result.stderr
    assert answers_stored(out) == answers and run_files(out) == files


# -- item 6: interrupt edges -------------------------------------------------------------------

def test_ctrl_c_again_and_again_while_the_state_is_saved(tmp_path, shared, tiny_model_dir, capsys):
    """After the first Ctrl+C every further one is ignored: here 20 of them, 5 ms apart,
    which span the save, the clean-up and the interpreter's exit. Exit 130, no traceback,
    and a state the rerun resumes from."""
    import signal
    import time

    from tests.test_resume import interrupt_after, start_evolve

    config_path = write_config(tmp_path, shared, tiny_model_dir, NGEN="3")
    state_path = tmp_path / "out" / STATE
    proc = start_evolve(config_path)
    interrupt_after(proc, state_path, 1, signal.SIGINT)
    for _ in range(19):
        time.sleep(0.005)  # spacing only: nothing below depends on when a signal lands
        proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert stderr.rstrip().endswith("\ninterrupted")
    assert main(["evolve", "--config", str(config_path)]) == 0, capsys.readouterr().err
    assert json.loads(state_path.read_text(encoding="utf-8"))["generation"] == 3


def test_temp_files_a_killed_run_left_are_removed_and_nothing_else(tmp_path, shared, tiny_model_dir, uninterrupted,
                                                                  capsys):
    """The atomic writer's temp files nobody holds are the rerun's to remove, in the run's
    directories only; a temp file another process is still writing, and anything not named
    like a temp file, stay."""
    import fcntl
    import os

    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted)
    argv = scene.command("evolve")  # the finished run: nothing to evolve
    out = scene.finished_run()
    orphans = [out / ".evolution_state.json.k2x_9q0a.tmp", out / ".fitness_vs_generation.png.abcdefgh.tmp",
               out / "reflector_prompts" / ".gen_0_mutation_child0_attempt1.txt.0a1b2c3d.tmp"]
    kept = [out / "notes.tmp", out / ".notes.tmp", out / ".history.json.ABCDEFGH.tmp", out / ".x.abcdefgh.tmp.bak",
            out / "mine" / ".history.json.abcdefgh.tmp", out / ".evaluation_x.json.inflight.tmp"]
    (out / "mine").mkdir()
    for path in orphans + kept:
        path.write_text("partial")
    (out / ".dir.abcdefgh.tmp").mkdir()
    writer = os.open(out / ".evaluation_x.json.inflight.tmp", os.O_RDONLY)
    try:
        fcntl.flock(writer, fcntl.LOCK_EX)  # as an `evaluate` writing its report there would
        assert main(argv) == 0, capsys.readouterr().err
    finally:
        os.close(writer)
    assert "removed 3 temp file(s) a killed run had left" in capsys.readouterr().out
    assert [p for p in orphans if p.exists()] == []
    assert [p for p in kept if not p.exists()] == [] and (out / ".dir.abcdefgh.tmp").is_dir()

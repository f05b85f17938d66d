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
import os
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
from tests.gguf_helpers import write_tiny_gguf

pytestmark = pytest.mark.slow

RESUMED_NGEN = str(DEFAULT_NGEN + 1)


# A small finished run of each strategy with a state file of its own: the symbols that make
# it, and those that resume it for one more step.
STRATEGY_RUNS = {
    "random": ({"STRATEGY_RANDOM": "y", "RANDOM_BATCH_SIZE": "2", "RANDOM_BATCHES": "1"}, {"RANDOM_BATCHES": "2"}),
    "cmaes": ({"STRATEGY_CMAES": "y", "CMAES_POPULATION": "2", "CMAES_GENERATIONS": "1"}, {"CMAES_GENERATIONS": "2"}),
    "gepa": ({"STRATEGY_GEPA": "y", "MAX_METRIC_CALLS": "8", "GEPA_VALSET_SIZE": "1", "GEPA_MINIBATCH_SIZE": "1"},
             {"MAX_METRIC_CALLS": "16"}),
    "archive": ({"STRATEGY_ARCHIVE": "y", "ARCHIVE_ITERATIONS": "1", "ARCHIVE_PARENTS_PER_ITERATION": "1",
                 "ARCHIVE_GENERATORS": '"cluster"'}, {"ARCHIVE_ITERATIONS": "2"}),
}


@dataclass
class Scene:
    """A fresh working directory with a tiny config; `out` is its CONFIG_OUTPUT_DIR."""

    work: Path
    shared: Path
    model: Path
    uninterrupted: Path
    strategy_run: Callable[[str], Path]  # the finished run of STRATEGY_RUNS' strategy

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
        if not self.out.exists():
            shutil.copytree(self.uninterrupted, self.out)
        return self.out

    def edit_run_file(self, name: str, edit: Callable[[Any], Any], strategy: str = "ga") -> list[str]:
        """The finished run (of `strategy`) with `name` replaced by `edit(its JSON)` (or edited
        in place when `edit` returns None), resumed for one more step."""
        if strategy == "ga":
            out, symbols = self.finished_run(), {"NGEN": RESUMED_NGEN}
        else:
            out = Path(shutil.copytree(self.strategy_run(strategy), self.out))
            symbols = {**STRATEGY_RUNS[strategy][0], **STRATEGY_RUNS[strategy][1]}
        path = out / name
        raw = json.loads(path.read_text(encoding="utf-8"))
        edited = edit(raw)
        path.write_text(json.dumps(raw if edited is None else edited), encoding="utf-8")
        return self.command("evolve", **symbols)

    def edit_archive(self, *statements: str, command: tuple[str, ...] = ("evolve",)) -> list[str]:
        """The finished run with `statements` run on its archive, then `command` on it (the
        run resumed for one more generation by default)."""
        with closing(sqlite3.connect(self.finished_run() / "run.sqlite")) as db, db:
            for statement in statements:
                db.execute(statement)
        return self.command(*command, NGEN=RESUMED_NGEN)

    def clusters_copy(self) -> dict[str, str]:
        """Symbols for a copy of the shared clusters in this scene: what a row may damage."""
        copy = Path(shutil.copytree(self.shared / "clusters", self.work / "clusters"))
        return {"CLUSTER_DIR": f'"{copy}"', "CLUSTER_DESCRIPTIONS_PATH": f'"{copy / "cluster_descriptions.json"}"',
                "INITIAL_DELTAS_PATH": f'"{copy / "initial_deltas.json"}"'}

    def processor(self, out: Path | str, deltas: Path | None = None, **symbols: str) -> list[str]:
        """generate-processor for the finished run's best deltas (or `deltas`) to `out`."""
        best = deltas or self.finished_run() / "deltas_best.json"
        return self.command("generate-processor", "--deltas", str(best), "--out", str(out), **symbols)

    def special(self, kind: str) -> Path:
        """A symbolic link, a FIFO or a device node (a copy of /dev/full, as root only)."""
        import os
        import stat
        import threading

        path = self.work / kind
        if kind == "link":
            path.symlink_to(self.work / "elsewhere.txt")
        elif kind == "fifo":
            os.mkfifo(path)
            # A writer for a reader that should never have opened it: the read then ends at
            # once (and fails its row) instead of waiting for ever. Unused, it waits unseen.
            threading.Thread(target=lambda: path.open("w").close(), daemon=True).start()
        else:
            try:
                os.mknod(path, stat.S_IFCHR | 0o666, os.stat("/dev/full").st_rdev)
            except PermissionError:
                pytest.skip("only root can make a device node")
        return path


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


def option_case(name: str, symbols: dict[str, str], pattern: str) -> Case:
    """An option out of its range, refused when the config loads."""
    return Case(name, lambda s: s.command("check-config", **symbols), 2, pattern)


def own_deltas(scene: Scene) -> Path:
    """A copy of the finished run's best deltas outside the run."""
    path = scene.work / "mine.json"
    if not path.exists():
        shutil.copyfile(scene.uninterrupted / "deltas_best.json", path)
    return path


def artifact_as(scene: Scene, symbol: str, artifact: str) -> dict[str, str]:
    """Symbols for a copy of the shared clusters with `symbol` naming its `artifact`."""
    return {**scene.clusters_copy(), symbol: f'"{scene.work / "clusters" / artifact}"'}


def sidecar_of_5(scene: Scene) -> Path:
    best = scene.finished_run() / "deltas_best.json"
    (scene.out / "deltas_best.clusters.json").write_text('{"cluster_map": 5}')
    return best


def negated_c(raw: Any) -> None:
    """CMA-ES's covariance turned negative definite: no covariance at all."""
    raw["sampler"]["C"] = [[-x for x in row] for row in raw["sampler"]["C"]]


def shortened_mean(raw: Any) -> None:
    raw["sampler"]["centroid"].pop()


def edited_front(scene: Scene) -> list[str]:
    def edit(front: Any) -> None:
        next(iter(front.values()))["score"] = "high"

    argv = scene.edit_run_file("pareto_front.json", edit, "gepa")
    return ["show", *argv[1:]]


def garbled_snapshots(scene: Scene) -> list[str]:
    argv = scene.edit_run_file("archive_state.json", lambda raw: None, "archive")
    with (scene.out / "snapshots.jsonl").open("a", encoding="utf-8") as handle:
        handle.write("not JSON\n")
    return argv


STATE, HISTORY = "evolution_state.json", "history.json"
NAN = float("nan")
HUGE = 10 ** 400  # an integer JSON holds but no float does


# Issue AB item 1: what a reader without an engine says of answers the archive lost.
LOST = (r"run\.sqlite' lost answers its records rest on \({}\): rows of its answer tables were deleted; rerun "
        r"evolve with this config, which answers them again")


def every_answer(column: str, value: str) -> str:
    return f"UPDATE evaluations SET {column} = {value}"


# The evaluations table as a database tool that dropped its NOT NULL constraints would leave it.
WITHOUT_NOT_NULL = (
    "CREATE TABLE loose (genome TEXT, example TEXT, context TEXT, answer TEXT, tokens INTEGER, is_correct INTEGER, "
    "reasoning TEXT, created REAL, PRIMARY KEY (genome, example, context)) WITHOUT ROWID",
    "INSERT INTO loose SELECT * FROM evaluations", "DROP TABLE evaluations", "ALTER TABLE loose RENAME TO evaluations",
)


def best_candidate(scene: Scene) -> str:
    return str(json.loads((scene.uninterrupted / STATE).read_text(encoding="utf-8"))["best_individual"]["candidate_id"])


def reshaped(scene: Scene, name: str, kind: str) -> list[str]:
    """The finished run with `name` replaced by a directory or a file, resumed."""
    path = scene.finished_run() / name
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.mkdir() if kind == "directory" else path.write_text("not a folder")
    return scene.command("evolve", NGEN=RESUMED_NGEN)


def big_delta(scene: Scene) -> Path:
    ids = json.loads((scene.shared / "clusters" / "initial_deltas.json").read_text(encoding="utf-8"))
    return planted(scene, json.dumps({cid: 0.0 for cid in ids}).replace("0.0", str(HUGE), 1).encode(), "big.json")

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
    # -- issue T, item 1: a command that writes never destroys what it should protect ------------------
    Case("generate-processor --out the run's state", lambda s: s.processor(s.finished_run() / STATE),
         2, r"generate-processor --out '.*out/evolution_state\.json' is a file of the run in '.*out': choose another "
            r"name, e\.g\. processor\.py"),
    Case("generate-processor --out its own --deltas", lambda s: s.processor(own_deltas(s), deltas=own_deltas(s)),
         2, r"generate-processor --out '.*mine\.json' is its own input --deltas: choose another name"),
    Case("generate-processor --out the config", lambda s: s.processor(s.work / "test.config"),
         2, r"generate-processor --out '.*test\.config' is the config file \(--config\)"),
    Case("generate-processor --out a symbolic link", lambda s: s.processor(s.special("link")),
         2, r"generate-processor --out '.*link' is a symbolic link, not a regular file: a write would replace it"),
    Case("generate-processor --out a device node", lambda s: s.processor(s.special("device")),
         2, r"generate-processor --out '.*device' is a device, not a regular file"),
    Case("evaluate --out a FIFO", lambda s: s.command("evaluate", "--out", str(s.special("fifo"))),
         2, r"evaluate --out '.*fifo' is a FIFO, not a regular file"),
    # Read, a FIFO waits for a writer for ever; the scene's writer turns that hang into a failure.
    Case("evaluate --deltas a FIFO", lambda s: s.command("evaluate", "--deltas", str(s.special("fifo"))),
         2, r"deltas file '.*fifo' is a FIFO, not a regular file: name the file itself"),
    Case("evaluate --data a FIFO", lambda s: s.command("evaluate", "--data", str(s.special("fifo"))),
         2, r"FinanceBench file '.*fifo' is a FIFO, not a regular file"),
    Case("check-config --config a FIFO", lambda s: ["check-config", "--config", str(s.special("fifo"))],
         2, r"config file '.*fifo' is a FIFO, not a regular file: name the file itself"),
    Case("a prompt template that is a FIFO",
         lambda s: s.command("evaluate", PROMPT_TEMPLATE_PATH=f'"{s.special("fifo")}"'),
         2, r"prompt template '.*fifo' is a FIFO, not a regular file"),
    Case("evaluate --out the run's prompt log",
         lambda s: s.command("evaluate", "--out", str(s.finished_run() / "reflector_prompts" / "notes.txt")),
         2, r"evaluate --out '.*out/reflector_prompts/notes\.txt' is a file of the run in '.*out'"),
    Case("evaluate --out a cluster artifact",
         lambda s: s.command("evaluate", "--out", str(s.work / "clusters" / "token_clusters.npy"), **s.clusters_copy()),
         2, r"evaluate --out '.*token_clusters\.npy' is a cluster artifact in CONFIG_CLUSTER_DIR \(token_clusters\.npy\)"),
    Case("cluster descriptions written over the run's history",
         lambda s: s.command("build-clusters", **{**s.clusters_copy(), "CLUSTER_DESCRIPTIONS_PATH":
                                                  f'"{s.finished_run() / HISTORY}"'}),
         2, r"CONFIG_CLUSTER_DESCRIPTIONS_PATH='.*out/history\.json' is a file of the run in '.*out': a cluster build "
            r"would write over it"),
    # -- issue T, item 4: values accepted, then crashing after work was done -------------------------
    option_case("a fixed archive midpoint of 80 (p80 meant)", {"STRATEGY_ARCHIVE": "y", "ARCHIVE_MIDPOINT": '"80"'},
                r"CONFIG_ARCHIVE_MIDPOINT='80': a fixed midpoint is a fitness in \[0, 1\] \(or write p80"),
    option_case("an archive sharpness of 1e308", {"STRATEGY_ARCHIVE": "y", "ARCHIVE_SHARPNESS": '"1e308"'},
                r"CONFIG_ARCHIVE_SHARPNESS=1e308 must be in \(0, 100\]"),
    option_case("an archive sharpness of 1e-320", {"STRATEGY_ARCHIVE": "y", "ARCHIVE_SHARPNESS": '"1e-320"'},
                r"CONFIG_ARCHIVE_SHARPNESS=1e-320 is too close to 0 to compute with"),
    option_case("a novelty weight of 1e308", {"STRATEGY_ARCHIVE": "y", "ARCHIVE_NOVELTY_WEIGHT": '"1e308"'},
                r"CONFIG_ARCHIVE_NOVELTY_WEIGHT=1e308 must be in \[0, 10\]"),
    option_case("a novelty weight of 1e-320", {"STRATEGY_ARCHIVE": "y", "ARCHIVE_NOVELTY_WEIGHT": '"1e-320"'},
                r"CONFIG_ARCHIVE_NOVELTY_WEIGHT=1e-320 is too close to 0 to compute with: write 0 or"),
    option_case("issue weights whose sum overflows",
                {"STRATEGY_ARCHIVE": "y", "ARCHIVE_ISSUE_WEIGHTS": '"cut_short=1e308,wrong=1e308"'},
                r"CONFIG_ARCHIVE_ISSUE_WEIGHTS has 'cut_short=1e308': .* a weight in \[0, 1e6\]"),
    option_case("a post-check margin of 1e308", {"STRATEGY_ARCHIVE": "y", "ARCHIVE_POSTCHECK_MARGIN": '"1e308"'},
                r"CONFIG_ARCHIVE_POSTCHECK_MARGIN=1e308 must be in \[0, 1e6\]"),
    option_case("a delta limit of 1e308", {"STRATEGY_ARCHIVE": "y", "ARCHIVE_DELTA_LIMIT": '"1e308"'},
                r"CONFIG_ARCHIVE_DELTA_LIMIT=1e308 must be in \(0, 1000\]"),
    option_case("a CMA-ES step size of 1e308", {"STRATEGY_CMAES": "y", "CMAES_SIGMA": '"1e308"'},
                r"CONFIG_CMAES_SIGMA=1e308 must be in \[1e-6, 1000\]"),
    option_case("a CMA-ES step size of 1e-320", {"STRATEGY_CMAES": "y", "CMAES_SIGMA": '"1e-320"'},
                r"CONFIG_CMAES_SIGMA=1e-320 must be in \[1e-6, 1000\]"),
    option_case("a GEPA valset range that runs backwards",
                {"STRATEGY_GEPA": "y", "MAX_METRIC_CALLS": "10", "GEPA_VALSET_INDICES": '"9-3"'},
                r"CONFIG_GEPA_VALSET_INDICES='9-3' has the range 9-3, which runs backwards"),
    option_case("a GEPA merge tolerance of 1e308", {"STRATEGY_GEPA": "y", "MAX_METRIC_CALLS": "10",
                                                    "GEPA_MERGE_EPS": '"1e308"'},
                r"CONFIG_GEPA_MERGE_EPS=1e308 must be in \[0, 1000\]"),
    option_case("a uniform random scale of 1e308",
                {"STRATEGY_RANDOM": "y", "RANDOM_DISTRIBUTION": '"uniform"', "RANDOM_SCALE": '"1e308"'},
                r"CONFIG_RANDOM_SCALE=1e308 must be in \(0, 1000\]"),
    option_case("a local reflector step of 1e308", {"LOCAL_REFLECTOR_STEP": '"1e308"'},
                r"CONFIG_LOCAL_REFLECTOR_STEP=1e308 must be in \[1e-6, 1000\]"),
    option_case("a temperature that overflows the logits", {"TEMPERATURE": '"1e-300"'},
                r"CONFIG_TEMPERATURE=1e-300 must be 0 \(greedy\) or in \[0\.01, 100\]"),
    option_case("a shortness scale of 1e-320", {"SHORTNESS_SCALE": '"1e-320"'},
                r"CONFIG_SHORTNESS_SCALE=1e-320 must be in \[0\.001, 1e9\]"),
    option_case("a wall budget of 1e308 minutes", {"MAX_WALL_MINUTES": '"1e308"'},
                r"CONFIG_MAX_WALL_MINUTES=1e308 must be in \[0, 1e9\]"),
    option_case("a population of a trillion", {"POPULATION_SIZE": str(10**12)},
                r"CONFIG_POPULATION_SIZE=1000000000000 must be in \[2, 100000\]"),
    option_case("a trillion generations", {"NGEN": str(10**12)}, r"CONFIG_NGEN=1000000000000 must be in \[1, 1e6\]"),
    Case("an SGLang poll interval of 1e308", lambda s: s.sglang_check(SGLANG_POLL_INTERVAL='"1e308"'),
         2, r"CONFIG_SGLANG_POLL_INTERVAL=1e308 must be in \[0\.01, 3600\]"),
    Case("random search: a parent the archive does not hold",
         lambda s: s.edit_run_file("random_state.json", put("parents", value=[9999]), "random"),
         2, r"random_state\.json': parents\[0\] is candidate 9999, but '.*run\.sqlite' does not hold it"),
    Case("random search: parents that are not a list",
         lambda s: s.edit_run_file("random_state.json", put("parents", value="x"), "random"),
         2, r"random_state\.json': parents is 'x', not a list of candidate ids"),
    Case("random search: a sampler that is not an object",
         lambda s: s.edit_run_file("random_state.json", put("sampler", value=[]), "random"),
         2, r"random_state\.json': sampler is \[\], not an object"),
    Case("CMA-ES: a covariance with NaN",
         lambda s: s.edit_run_file("cmaes_state.json", put("sampler", "C", 0, 0, value=NAN), "cmaes"),
         2, r"cmaes_state\.json': sampler\.C is .*, not \d+ x \d+ finite numbers"),
    Case("CMA-ES: a mean one delta short",
         lambda s: s.edit_run_file("cmaes_state.json", shortened_mean, "cmaes"),
         2, r"cmaes_state\.json': sampler\.centroid is .*, not \d+ finite numbers"),
    Case("CMA-ES: a step size as a string",
         lambda s: s.edit_run_file("cmaes_state.json", put("sampler", "sigma", value="big"), "cmaes"),
         2, r"cmaes_state\.json': sampler\.sigma is 'big', not a finite number"),
    Case("CMA-ES: a covariance that is no covariance", lambda s: s.edit_run_file("cmaes_state.json", negated_c, "cmaes"),
         2, r"cmaes_state\.json': sampler\.C is not positive definite"),
    Case("GEPA: a pool member the archive does not hold",
         lambda s: s.edit_run_file("gepa_state.json", put("pool", 0, value=9999), "gepa"),
         2, r"gepa_state\.json': pool\[0\] is candidate 9999, but '.*run\.sqlite' does not hold it"),
    Case("GEPA: a valset example not in the pool",
         lambda s: s.edit_run_file("gepa_state.json", put("valset", 0, value="nope"), "gepa"),
         2, r"gepa_state\.json': valset\[0\] is 'nope', not an example of the training pool"),
    Case("GEPA: minibatches of 0", lambda s: s.edit_run_file("gepa_state.json", put("sampler", "size", value=0), "gepa"),
         2, r"gepa_state\.json': sampler\.size is 0, not an integer >= 1"),
    Case("GEPA: a sampler field it does not know",
         lambda s: s.edit_run_file("gepa_state.json", put("sampler", "extra", value=1), "gepa"),
         2, r"gepa_state\.json': sampler has the unknown field\(s\) extra"),
    Case("GEPA: a component past the last cluster",
         lambda s: s.edit_run_file("gepa_state.json", put("next_component", value={"1": 99}), "gepa"),
         2, r"gepa_state\.json': next_component\.1 is 99, not a cluster position in \[0, \d+\)"),
    Case("GEPA: a merge triplet with a string",
         lambda s: s.edit_run_file("gepa_state.json", put("merges_performed", value=[[1, "a", 2]]), "gepa"),
         2, r"gepa_state\.json': merges_performed\[0\] is \[1, 'a', 2\], not 3 candidate ids"),
    Case("GEPA: a flag as a string",
         lambda s: s.edit_run_file("gepa_state.json", put("last_found_new", value="yes"), "gepa"),
         2, r"gepa_state\.json': last_found_new is 'yes', not true or false"),
    Case("archive: a newest candidate the archive does not hold",
         lambda s: s.edit_run_file("archive_state.json", put("last_candidate_id", value=9999), "archive"),
         2, r"archive_state\.json': last_candidate_id is 9999 but the newest candidate of '.*run\.sqlite' is \d+"),
    Case("archive: a snapshot line that is not JSON", lambda s: garbled_snapshots(s),
         2, r"snapshots\.jsonl' line 2: Expecting value"),
    Case("state: a member's delta of 400 digits",
         lambda s: s.edit_run_file(STATE, put("population", 1, "deltas", "0", value=HUGE)),
         2, r"evolution_state\.json': population\[1\]\.deltas\.0 is 10{59}\.\.\., not a finite number"),
    Case("a deltas file with a delta of 400 digits", lambda s: s.command("evaluate", "--deltas", str(big_delta(s))),
         2, r"big\.json: delta of cluster 0 is 10{59}\.\.\., not a finite number"),
    Case("a deltas sidecar whose cluster map is 5", lambda s: s.processor(s.work / "p.py", deltas=sidecar_of_5(s)),
         2, r"deltas_best\.clusters\.json': cluster_map is 5, not the digest of a cluster map; remove it, or pass "
            r"--force"),
    Case("generate-processor --out a directory", lambda s: s.processor(s.work),
         2, r"generate-processor --out '.*' is a directory: name the Python module to write"),
    Case("show a Pareto front edited by hand", lambda s: edited_front(s),
         2, r"pareto_front\.json': .* is \{'score': 'high', .*\}, not \{\"score\": a number"),
    Case("show a candidate id beyond SQLite's integers", lambda s: s.edit_archive(command=("show", str(10**30))),
         2, r"candidate 10{30} is not in '.*run\.sqlite'"),
    # -- issue S, item 4: answers read back from the archive are checked ----------------------------
    Case("an answer of -5 tokens", lambda s: s.edit_archive(every_answer("tokens", "-5")),
         2, r"run\.sqlite' table evaluations, row of example '.*' under the genome of candidate \d+: tokens is -5, not "
            r"an integer >= 0; delete that row to have the answer generated again"),
    Case("a verdict of 5", lambda s: s.edit_archive(every_answer("is_correct", "5")),
         2, r"run\.sqlite' table evaluations, row of example .*: is_correct is 5, not 0 or 1"),
    Case("a token count as a string", lambda s: s.edit_archive(every_answer("tokens", "'many'")),
         2, r"run\.sqlite' table evaluations, row of example .*: tokens is 'many', not an integer >= 0"),
    Case("a token count of NULL", lambda s: s.edit_archive(*WITHOUT_NOT_NULL, every_answer("tokens", "NULL")),
         2, r"run\.sqlite' table evaluations, row of example .*: tokens is None, not an integer >= 0"),
    Case("show a candidate whose verdicts were edited",
         lambda s: s.edit_archive(every_answer("is_correct", "2"), command=("show", best_candidate(s))),
         2, r"run\.sqlite' table evaluations, row of example .*: is_correct is 2, not 0 or 1"),
    Case("a wall time that is not a number",
         lambda s: s.edit_archive("UPDATE meta SET value = 'soon' WHERE key = 'wall_seconds'"),
         2, r"run\.sqlite' table meta, row wall_seconds: 'soon' is not a number >= 0"),
    # -- issue X, items 6, 7 and 9: the probe's cases, each failing on the code before ----------------
    option_case("an int in fullwidth digits", {"NGEN": "\uff14"},
                r"CONFIG_NGEN='\uff14' is not an integer in ASCII digits"),
    option_case("an int in Arabic-Indic digits", {"NGEN": "\u0664"},
                r"CONFIG_NGEN='\u0664' is not an integer in ASCII digits"),
    option_case("an int with an underscore", {"NGEN": "1_0"}, r"CONFIG_NGEN='1_0' is not an integer in ASCII digits"),
    option_case("an int after a space", {"NGEN": " 4"}, r"CONFIG_NGEN=' 4' is not an integer in ASCII digits"),
    option_case("a float between spaces", {"CXPB": '" 0.5 "'}, r"CONFIG_CXPB=' 0\.5 ' is not a number in ASCII digits"),
    option_case("a float in Arabic-Indic digits", {"CXPB": '"\u0660.\u0665"'},
                r"CONFIG_CXPB='\u0660\.\u0665' is not a number in ASCII digits"),
    option_case("pool indices in Arabic-Indic digits", {"FINANCEBENCH_POOL_INDICES": '"\u0661"'},
                r"CONFIG_FINANCEBENCH_POOL_INDICES='\u0661' must be 'all' or indices"),
    Case("a bool read by its first letter", lambda s: s.sglang_check(SGLANG_ALLOW_REMOTE="young"),
         2, r"CONFIG_SGLANG_ALLOW_REMOTE='young' is not y or n"),
    option_case("the meta device", {"TRANSFORMERS_DEVICE": '"meta"'},
                r"CONFIG_TRANSFORMERS_DEVICE='meta' is not a device the transformers engine runs on"),
    Case("cache hits of NaN, once silently reset to 0",
         lambda s: s.edit_archive("UPDATE meta SET value = 'NaN' WHERE key = 'cache_hits'"),
         2, r"run\.sqlite' table meta, row cache_hits: 'NaN' is not an integer >= 0"),
    Case("a candidate's deltas that are no JSON", lambda s: s.edit_archive(
         "UPDATE candidates SET deltas = 'garbage' WHERE id = 3"),
         2, r"run\.sqlite' table candidates, row 3: deltas is 'garbage', not a JSON object of cluster ids"),
    Case("a fitness as text", lambda s: s.edit_archive("UPDATE candidates SET fitness = 'high' WHERE id = 3"),
         2, r"run\.sqlite' table candidates, row 3: fitness is 'high', not a number in \[0, 1\]"),
    Case("a lineage row pointing at a missing parent", lambda s: s.edit_archive(
         f"INSERT INTO lineage (child, parent, position) VALUES ({best_candidate(s)}, 9999, 5)"),
         2, r"run\.sqlite' table lineage, row \(child \d+, position 5\): parent 9999 is not a candidate"),
    Case("show a lineage row pointing at a missing parent", lambda s: s.edit_archive(
         f"INSERT INTO lineage (child, parent, position) VALUES ({best_candidate(s)}, 9999, 5)", command=("show",)),
         2, r"run\.sqlite' table lineage, row \(child \d+, position 5\): parent 9999 is not a candidate"),
    Case("an event's detail that is no JSON", lambda s: s.edit_archive("UPDATE events SET detail = 'garbage'"),
         2, r"run\.sqlite' table events, row 1: detail is 'garbage', not a JSON object"),
    Case("reflector tokens of -1000000 in the archive",
         lambda s: s.edit_archive("UPDATE reflector_calls SET prompt_tokens = -1000000"),
         2, r"run\.sqlite' table reflector_calls, row \d+: prompt_tokens is -1000000, not an integer in \[0, 2\^53\)"),
    Case("run.lock made a directory", lambda s: reshaped(s, "run.lock", "directory"),
         2, r"run\.lock' is a directory, not a regular file: remove it"),
    Case("reflector_prompts/ made a file", lambda s: reshaped(s, "reflector_prompts", "file"),
         2, r"reflector_prompts' is a regular file, not a directory: a run writes it; move it away"),
    Case("history.json made a directory", lambda s: reshaped(s, "history.json", "directory"),
         2, r"history\.json' is a directory, not a regular file: a run writes it; move it away"),
    # -- issue AB, item 5: lists and mappings once bent silently ------------------------------------
    option_case("a question twice in the pool", {"FINANCEBENCH_POOL_INDICES": '"0-5,3"'},
                r"CONFIG_FINANCEBENCH_POOL_INDICES='0-5,3' names index 3 more than once \('0-5' and '3'\): a "
                r"question listed twice would count twice; list each once"),
    Case("evolve with a question twice in the pool",
         lambda s: s.command("evolve", NGEN=RESUMED_NGEN, FINANCEBENCH_POOL_INDICES='"2,0-2"'),
         2, r"CONFIG_FINANCEBENCH_POOL_INDICES='2,0-2' names index 2 more than once \('2' and '0-2'\)"),
    option_case("a held-out question twice", {"HOLDOUT_INDICES": '"7,5-9"'},
                r"CONFIG_HOLDOUT_INDICES='7,5-9' names index 7 more than once \('7' and '5-9'\)"),
    option_case("a valset position three times",
                {**STRATEGY_RUNS["gepa"][0], "GEPA_VALSET_INDICES": '"0,0,0"'},
                r"CONFIG_GEPA_VALSET_INDICES='0,0,0' names position 0 more than once \('0' twice\)"),
    option_case("an issue type weighted twice", {"STRATEGY_ARCHIVE": "y", "ARCHIVE_ISSUE_WEIGHTS": '"wrong=1,wrong=2"'},
                r"CONFIG_ARCHIVE_ISSUE_WEIGHTS names wrong more than once \('wrong=1' and 'wrong=2'\): give each "
                r"issue type one weight"),
    # -- issue AB, item 2: a build's own files named as inputs -------------------------------------
    Case("the cluster map as the descriptions", lambda s: s.command("evolve", NGEN=RESUMED_NGEN, **artifact_as(
         s, "CLUSTER_DESCRIPTIONS_PATH", "token_clusters.npy")),
         2, r"CONFIG_CLUSTER_DESCRIPTIONS_PATH='.*clusters/token_clusters\.npy' is a cluster artifact in "
            r"CONFIG_CLUSTER_DIR \(token_clusters\.npy\), which a cluster build writes: name another file"),
    Case("the cluster record as the initial deltas", lambda s: s.command("check-config", **artifact_as(
         s, "INITIAL_DELTAS_PATH", "fingerprint.json")),
         2, r"CONFIG_INITIAL_DELTAS_PATH='.*clusters/fingerprint\.json' is a cluster artifact in CONFIG_CLUSTER_DIR "
            r"\(fingerprint\.json\)"),
    Case("the initial deltas as the training data", lambda s: s.command("evaluate", **artifact_as(
         s, "FINANCEBENCH_JSONL_PATH", "initial_deltas.json")),
         2, r"CONFIG_FINANCEBENCH_JSONL_PATH='.*clusters/initial_deltas\.json' is the file of "
            r"CONFIG_INITIAL_DELTAS_PATH, which a cluster build writes"),
    Case("the build's ledger as the prompt template", lambda s: s.command("evolve", NGEN=RESUMED_NGEN, **artifact_as(
         s, "PROMPT_TEMPLATE_PATH", "written.json")),
         2, r"CONFIG_PROMPT_TEMPLATE_PATH='.*clusters/written\.json' is a cluster artifact in CONFIG_CLUSTER_DIR "
            r"\(written\.json\)"),
    Case("the descriptions as the held-out data", lambda s: s.command("check-config", **artifact_as(
         s, "HOLDOUT_DATA", "cluster_descriptions.json")),
         2, r"CONFIG_HOLDOUT_DATA='.*clusters/cluster_descriptions\.json' is the file of "
            r"CONFIG_CLUSTER_DESCRIPTIONS_PATH"),
    Case("evaluate --data the embeddings", lambda s: s.command(
         "evaluate", "--data", str(s.work / "clusters" / "embeddings.npy"), **s.clusters_copy()),
         2, r"evaluate --data '.*clusters/embeddings\.npy' is a cluster artifact in CONFIG_CLUSTER_DIR "
            r"\(embeddings\.npy\)"),
    Case("generate-processor --deltas the descriptions", lambda s: s.processor(
         s.work / "p.py", s.work / "clusters" / "cluster_descriptions.json", **s.clusters_copy()),
         2, r"generate-processor --deltas '.*clusters/cluster_descriptions\.json' is the file of "
            r"CONFIG_CLUSTER_DESCRIPTIONS_PATH"),
    # -- issue AB, item 1: answers the archive lost, read where no engine can make them again ------
    Case("show --front after the answers were deleted",
         lambda s: s.edit_archive("DELETE FROM evaluations", command=("show", "--front")), 2, LOST.format(
             r"the unsteered baseline's on the training pool, and \d+ more")),
    Case("report after the answer table was dropped",
         lambda s: s.edit_archive("DROP TABLE evaluations", command=("report",)), 2, LOST.format(
             r"the unsteered baseline's on the training pool, and \d+ more")),
    Case("show the best after its answers were deleted", lambda s: s.edit_archive(
         f"DELETE FROM evaluations WHERE genome = (SELECT genome FROM candidates WHERE id = {best_candidate(s)})",
         command=("show", best_candidate(s))), 2, LOST.format(r"candidate #\d+'s on the training pool")),
]


@pytest.fixture(scope="module")
def strategy_runs(tmp_path_factory, shared, tiny_model_dir) -> Callable[[str], Path]:
    """The finished runs of STRATEGY_RUNS, each made once, when a row first needs it."""
    from compressor_2.commands.evolve import evolve
    from tests.test_evolution_support import config_for

    made: dict[str, Path] = {}

    def run(strategy: str) -> Path:
        if strategy not in made:
            work = tmp_path_factory.mktemp(f"{strategy}_run")
            evolve(config_for(work, shared, tiny_model_dir, **STRATEGY_RUNS[strategy][0]))
            made[strategy] = work / "out"
        return made[strategy]

    return run


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_hostile_input_gets_one_line_and_its_exit_code(case: Case, tmp_path, shared, tiny_model_dir, uninterrupted,
                                                          strategy_runs, capsys):
    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted, strategy_runs)
    argv = case.plant(scene)
    files = left_as_it_was(scene)
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
    changed = {name for name in files.keys() | left_as_it_was(scene).keys()
               if files.get(name) != left_as_it_was(scene).get(name)}
    assert not changed, changed


def left_as_it_was(scene: Scene) -> dict[str, bytes]:
    """What a refusal leaves byte for byte (issue AB): every file of the scene (its run
    directory and archive, its copy of the clusters, its inputs) and of the session's shared
    clusters; but the pid every evolve writes into run.lock, and the -wal and -shm files
    SQLite keeps beside an open archive (its rows are in run.sqlite)."""
    return {str(p): p.read_bytes() for root in (scene.work, scene.shared / "clusters") for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in ("run.lock", "run.sqlite-wal", "run.sqlite-shm")}


# -- issue X items 3 and 6 (driver): refuse before you write; deltas_best.json never trusted -----

def untouched_files(*directories: Path) -> dict[str, bytes]:
    """Every file under `directories` but the lock, whose pid each start writes, and
    SQLite's own -wal and -shm files beside the archive (which a read-only `show` leaves
    and the next close removes: the archive's rows are in run.sqlite)."""
    return {str(p): p.read_bytes() for d in directories for p in sorted(d.rglob("*"))
            if p.is_file() and p.name != "run.lock" and not p.name.endswith(("-wal", "-shm"))}


@pytest.mark.parametrize(("symbol", "value"), [("PCA_COMPONENTS", "6"), ("NUM_CLUSTERS", "2"), ("CLUSTER_SEED", "1")])
def test_a_refused_resume_leaves_every_file_as_it_was_the_clusters_included(symbol, value, tmp_path, shared,
                                                                              tiny_model_dir, uninterrupted,
                                                                              strategy_runs, capsys):
    """A resume with another cluster setting is refused before the clusters are rebuilt or
    anything is written: the run directory and the cluster directory stay byte for byte."""
    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted, strategy_runs)
    out, clusters = scene.finished_run(), scene.clusters_copy()
    before = untouched_files(out, tmp_path / "clusters")
    capsys.readouterr()
    assert main(scene.command("evolve", NGEN=RESUMED_NGEN, **clusters, **{symbol: value})) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "holds a run started with other settings" in err[0] and err[1].startswith(f"  CONFIG_{symbol}: "), err
    assert untouched_files(out, tmp_path / "clusters") == before


def archive_dump(out: Path) -> list[str]:
    """The archive's rows, whatever their order, its meta table included: the identity's
    allowed changes (here the raised NGEN) are recorded once the run files were read
    (issue AB item 3; they were recorded before)."""
    with closing(sqlite3.connect(out / "run.sqlite")) as db:
        return sorted(db.iterdump())


@pytest.mark.parametrize("edit", [
    (HISTORY, lambda raw: {}),
    (STATE, put("population", 0, "candidate_id", value=9999)),
], ids=["history refused", "state refused"])
def test_a_resume_refused_for_a_run_file_adds_nothing_to_the_archive(edit, tmp_path, shared, tiny_model_dir,
                                                                     uninterrupted, strategy_runs, capsys):
    """The run files are read and checked before the archive records the session's start:
    a refused resume leaves no start without its stop (which would make the next run
    forget a step a budget had stopped cleanly)."""
    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted, strategy_runs)
    argv = scene.edit_run_file(*edit)
    before = archive_dump(scene.out)
    capsys.readouterr()
    assert main(argv) == 2
    assert archive_dump(scene.out) == before


@pytest.mark.parametrize("planted", [b'{"0": 1.5, "1"', b'{"0": NaN, "1": NaN, "2": NaN, "3": NaN, "4": NaN}',
                                     b'{"0": 9.0, "1": 0.0, "2": 0.0, "3": 0.0, "4": 0.0}'],
                         ids=["truncated", "all NaN", "hand-edited"])
@pytest.mark.parametrize("ngen", [str(DEFAULT_NGEN), RESUMED_NGEN], ids=["finished", "resumed"])
def test_a_resume_writes_deltas_best_from_the_run_again(planted, ngen, tmp_path, shared, tiny_model_dir,
                                                        uninterrupted, strategy_runs):
    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted, strategy_runs)
    out = scene.finished_run()
    (out / "deltas_best.json").write_bytes(planted)
    assert main(scene.command("evolve", NGEN=ngen)) == 0
    state = json.loads((out / "evolution_state.json").read_text(encoding="utf-8"))
    assert json.loads((out / "deltas_best.json").read_text(encoding="utf-8")) == state["best_individual"]["deltas"]


def test_the_atomic_writer_never_renames_over_anything_but_a_regular_file(tmp_path):
    """The last line of defence behind every command's guard: a symbolic link (not what it
    points to), a FIFO and a directory stay as they are, and no temp file is left."""
    import os

    from compressor_2.common.atomic import atomic_write_json
    from compressor_2.common.errors import ConfigError

    target = tmp_path / "target.json"
    target.write_text("{}")
    (tmp_path / "link.json").symlink_to(target)
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "dir.json").mkdir()
    for name, kind in (("link.json", "a symbolic link"), ("fifo.json", "a FIFO"),
                       ("dir.json", "a directory")):
        with pytest.raises(ConfigError, match=f"is {kind}, not a regular file: it is not written over"):
            atomic_write_json(tmp_path / name, {"x": 1})
    assert (tmp_path / "link.json").is_symlink() and target.read_text() == "{}"
    assert (tmp_path / "fifo.json").is_fifo() and (tmp_path / "dir.json").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.json", "fifo.json", "link.json", "target.json"]


def test_a_genome_with_an_infinite_delta_never_reaches_deltas_best(tmp_path, capsys):
    """Whatever drew it (a sampler's overflow, a crossover of huge deltas), Infinity would
    make deltas_best.json a file every rerun refuses."""
    from compressor_2.fitness import Evaluation
    from compressor_2.resume.state import Member
    from compressor_2.run.best import BestEver

    written = []
    best = BestEver(tmp_path, lambda deltas, out: written.append(out))

    def evaluation(fitness: float) -> Evaluation:
        return Evaluation((0.0, 0.0), (), 1.0, 1.0, 0.5, fitness, ())

    assert not best.consider([(Member({"0": float("inf"), "1": 0.0}, "", 1), evaluation(0.9))])
    assert not (tmp_path / "deltas_best.json").exists() and written == []
    assert "candidate 1 has a delta that is not a finite number" in capsys.readouterr().out
    assert best.consider([(Member({"0": 1.0, "1": 0.0}, "", 2), evaluation(0.5))])
    assert json.loads((tmp_path / "deltas_best.json").read_text()) == {"0": 1.0, "1": 0.0}


def test_a_hand_edited_tree_is_never_read_but_drawn_again(tmp_path, shared, tiny_model_dir, uninterrupted, capsys):
    """tree.json is a copy for other tools: the tree is drawn from the archive, so an edit
    (here: edges without their kind) cannot reach the run, and the next save replaces it."""
    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted, lambda strategy: uninterrupted)
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

    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted, lambda strategy: uninterrupted)
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

    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted, lambda strategy: uninterrupted)
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


# == Issue T, items 2, 3, 5, 6 and 7: what a reflector's replies may do to a run ================
#
# `REPLIES` is a table of hostile reflectors: a fake OpenAI-compatible server gives each row's
# answer to every request of a one-generation GA run, and the row says what must hold after
# it: the exit code, the last line printed, and a check on the run directory and everything
# printed. Ctrl+C with a call in flight and the run lock follow as named tests: each needs a
# run in a process of its own, held in a reflector call that never returns.

REPLY_KEY = "sk-replies-SECRET-5151"
REPLY_KEY_ENV = "C2_REPLIES_KEY"


@dataclass(frozen=True)
class ReplyCase:
    name: str
    answer: Callable[[dict[str, Any], dict[str, str]], tuple[int, Any]]  # (body, headers) -> (status, body)
    symbols: dict[str, str]
    code: int
    last: str  # a regex the last line printed (stdout, then stderr) matches in full
    check: Callable[[Path, str], None]  # (the run directory, everything printed)


def reply_kind(body: dict[str, Any]) -> str:
    return body["response_format"]["json_schema"]["name"].removeprefix("reflector_")


def replying(mutation: str, merge: str) -> Callable[[dict[str, Any], dict[str, str]], tuple[int, Any]]:
    """Every mutation call answered with the text `mutation`, every merge with `merge`."""
    from tests.fakes.openai_server import chat_completion

    def answer(body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Any]:
        del headers
        return 200, chat_completion(mutation if reply_kind(body) == "mutation" else merge)
    return answer


def echoing_the_key(body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Any]:
    """The Authorization header inside the scratchpad, as sent and JSON-escaped."""
    from tests.fakes.openai_server import chat_completion

    auth = next(v for k, v in headers.items() if k.lower() == "authorization")
    escaped = "".join(f"\\u{ord(c):04x}" for c in auth)
    pad = f'"you sent {auth}; escaped, {escaped}"'
    reply = f'{{"delta": 1.5, "scratchpad": {pad}}}' if reply_kind(body) == "mutation" else f'{{"scratchpad": {pad}}}'
    return 200, chat_completion(reply)


def no_key_anywhere(out: Path, printed: str) -> None:
    assert REPLY_KEY not in printed
    assert [p for p in out.rglob("*") if p.is_file() and REPLY_KEY.encode() in p.read_bytes()] == []
    pads = [pad for (pad,) in archive_rows(out, "SELECT scratchpad FROM candidates WHERE scratchpad != ''")]
    assert pads and all(pad.count("Bearer ***") == 2 for pad in pads)  # the echo was kept, masked


NEWEST_NOTE = "g0: the newest note"


def huge(body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Any]:
    """A 10 MB scratchpad of old notes that ends with the newest one."""
    from tests.fakes.openai_server import chat_completion

    del headers
    pad = "g0: an old note that repeats\n" * 360_000 + NEWEST_NOTE
    reply = {"delta": 1.5, "scratchpad": pad} if reply_kind(body) == "mutation" else {"scratchpad": pad}
    return 200, chat_completion(json.dumps(reply))


def small_and_recent(out: Path, printed: str) -> None:
    from compressor_2.reflector.limits import SCRATCHPAD_MAX_CHARS

    del printed
    pads = [pad for (pad,) in archive_rows(out, "SELECT scratchpad FROM candidates WHERE scratchpad != ''")]
    assert pads and all(len(pad) <= SCRATCHPAD_MAX_CHARS and pad.endswith(NEWEST_NOTE) for pad in pads)
    assert all(len(m["scratchpad"]) <= SCRATCHPAD_MAX_CHARS
               for m in json.loads((out / STATE).read_text(encoding="utf-8"))["population"])
    assert sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) < 3_000_000  # was 251 MB in 7 calls


def failed_with_its_reason(out: Path, printed: str) -> None:
    del printed
    assert [kind for (kind,) in archive_rows(out, "SELECT kind FROM events ORDER BY id")][-2:] == ["stop", "failed"]
    assert json.loads((out / HISTORY).read_text(encoding="utf-8"))[-1]["stop_reason"] == "all 1 generations ran"


def warned(line: str) -> Callable[[Path, str], None]:
    def check(out: Path, printed: str) -> None:
        assert re.search(line, printed, re.M), printed
    return check


GATEWAY_PAGE = "<!doctype html><html><body><h1>Sign in to the gateway</h1></body></html>"


def with_usage(prompt_tokens: Any) -> Callable[[dict[str, Any], dict[str, str]], tuple[int, Any]]:
    """Valid replies whose usage reports `prompt_tokens`."""
    answer = replying('{"delta": 1.5, "scratchpad": "s"}', '{"scratchpad": "merged"}')

    def reply(body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Any]:
        status, completion = answer(body, headers)
        return status, json.dumps({**completion, "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 7}})
    return reply


def with_long_usage(digits: int) -> Callable[[dict[str, Any], dict[str, str]], tuple[int, Any]]:
    """Valid replies whose usage.prompt_tokens has `digits` digits, more than Python reads
    (json.dumps cannot write it either, so it goes into the text)."""
    answer = with_usage("DIGITS")

    def reply(body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Any]:
        status, text = answer(body, headers)
        return status, text.replace('"DIGITS"', "9" * digits)
    return reply


NESTED_TOO_DEEPLY = "[" * 100_000  # a RecursionError in json.loads, which no `except ValueError` catches


def no_tokens_counted(out: Path, printed: str) -> None:
    """Failed calls stop the run, its state saved, and nothing of them reaches the budget."""
    assert "stopped: state saved to" in printed
    assert [kind for (kind,) in archive_rows(out, "SELECT kind FROM events ORDER BY id")][-1] == "failed"
    assert archive_rows(out, "SELECT sum(prompt_tokens), sum(completion_tokens), min(prompt_tokens) "
                             "FROM reflector_calls") == [(0, 0, 0)]


FAILED_CALLS = (r"error: the reflector at http://127\.0\.0\.1:\d+/v1 failed \d+ calls in a row "
                r"\(CONFIG_REFLECTOR_MAX_CONSECUTIVE_FAILURES\); the last error: {}")
NOTHING_VALID = r"error: none of the reflector's \d+ replies in this run was valid \(the last: {}\), so it evolved nothing.*"
DONE = r"done: all 1 generations ran; best fitness .*"

EVERY_CALL = {"CXPB": '"1"', "MUTPB": '"1"'}  # every child a crossover (a merge call), then mutated

REPLIES = [
    ReplyCase("the key echoed in a scratchpad (item 2)", echoing_the_key, EVERY_CALL, 0, DONE, no_key_anywhere),
    ReplyCase("a 10 MB scratchpad (item 3)", huge, EVERY_CALL, 0, DONE, small_and_recent),
    ReplyCase("every reply garbage (item 5)", replying("I would raise it a little.", "Merged, more or less."),
              EVERY_CALL, 1, NOTHING_VALID.format("the reply is not JSON"), failed_with_its_reason),
    ReplyCase("every reply against the schema (item 5)",
              replying('{"delta": "up", "scratchpad": "s"}', '{"notes": "merged"}'), EVERY_CALL,
              1, NOTHING_VALID.format("delta is 'up', not a finite number"), failed_with_its_reason),
    ReplyCase("most replies of a step against the schema (item 5)",
              replying('{"delta": "up", "scratchpad": "s"}', '{"scratchpad": "merged"}'), EVERY_CALL, 0, DONE,
              warned(r"^warning: 6 of 9 reflector replies of the last step were invalid \(the last: delta is 'up', "
                     r"not a finite number\); the replies are in .*reflector_prompts$")),
    # -- issue X, item 4: what came back, said in one line; usage counts checked ---------------------
    ReplyCase("an HTML page with status 200", lambda body, headers: (200, GATEWAY_PAGE), EVERY_CALL, 1,
              FAILED_CALLS.format(r"the reply is not JSON \(HTTP 200, application/json\): '<!doctype html>.*"),
              no_tokens_counted),
    ReplyCase("a reply without choices", lambda body, headers: (200, {"result": "ok"}), EVERY_CALL, 1,
              FAILED_CALLS.format(r"the reply is not a chat completion \(no list of choices\): \{'result': 'ok'\}"),
              no_tokens_counted),
    *(ReplyCase(f"usage.prompt_tokens of {shown_count}", with_usage(count), EVERY_CALL, 1, FAILED_CALLS.format(
        rf"the reply's usage\.prompt_tokens is {re.escape(shown_count)}, not an integer in \[0, 2\^53\)"),
        no_tokens_counted) for count, shown_count in ((2**70, str(2**70)), ("many", "'many'"), (NAN, "nan"),
                                                      (-1_000_000, "-1000000"))),
    ReplyCase("a reply nested too deeply to read", lambda body, headers: (200, NESTED_TOO_DEEPLY), EVERY_CALL, 1,
              FAILED_CALLS.format(r"the reply is JSON nested too deeply to read \(HTTP 200, application/json\): "
                                  r"'\[\[\[.*"), no_tokens_counted),
    ReplyCase("usage.prompt_tokens of 5,000 digits", with_long_usage(5_000), EVERY_CALL, 1,
              FAILED_CALLS.format(r"the reply is JSON with a number too long to read \(HTTP 200, application/json\): "
                                  r"'\{\"id\": \"chatcmpl-fake\".*"), no_tokens_counted),
]


@pytest.mark.parametrize("case", REPLIES, ids=[c.name for c in REPLIES])
def test_a_hostile_reflector_reply(case: ReplyCase, tmp_path, shared, tiny_model_dir, monkeypatch, capsys):
    from tests.fakes.openai_server import FakeOpenAIServer

    monkeypatch.setenv(REPLY_KEY_ENV, REPLY_KEY)
    with FakeOpenAIServer(case.answer, with_headers=True) as server:
        config = write_config(tmp_path, shared, tiny_model_dir, NGEN="1", **reply_symbols(server), **case.symbols)
        code = main(["evolve", "--config", str(config)])
    captured = capsys.readouterr()
    printed = captured.out + captured.err
    assert code == case.code, printed[-3000:]
    last = (captured.out if code == 0 else captured.err).strip().splitlines()[-1]
    assert re.fullmatch(case.last, last), last
    case.check(tmp_path / "out", printed)


def reply_symbols(server: Any, **extra: str) -> dict[str, str]:
    return {"REFLECTOR_OPENAI": "y", "REFLECTOR_BASE_URL": f'"{server.base_url}"',
            "REFLECTOR_API_KEY_ENV": f'"{REPLY_KEY_ENV}"', "REFLECTOR_MAX_RETRIES": "0", **extra}


def archive_rows(out: Path, sql: str) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(out / "run.sqlite")) as db:
        return db.execute(sql).fetchall()


def wait_for_a_call(server: Any, proc: Any) -> None:
    """Until the run in `proc` has a reflector call in flight (a hang guard of 300 s)."""
    import time

    deadline = time.monotonic() + 300
    while not server.requests:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the run ended (or hung) before its first reflector call: {proc.communicate()}")
        time.sleep(0.05)


def test_ctrl_c_with_a_reflector_call_in_flight_saves_and_exits_at_once(tmp_path, shared, tiny_model_dir,
                                                                        monkeypatch):
    """Item 6: the reflector accepts the call and never answers (CONFIG_REFLECTOR_TIMEOUT at
    10 minutes). Ctrl+C saves the state and exits with 130 at once, abandoning the call: the
    generation replays on resume. The process used to wait out the HTTP timeout (97 s with
    the defaults); the 60 s limit guards a hang, it is not a speed target."""
    import signal

    from tests.fakes.openai_server import HANG, FakeOpenAIServer
    from tests.test_resume import start_evolve

    monkeypatch.setenv(REPLY_KEY_ENV, REPLY_KEY)
    with FakeOpenAIServer(lambda body: HANG) as server:
        config = write_config(tmp_path, shared, tiny_model_dir, **reply_symbols(server, REFLECTOR_TIMEOUT="600"))
        proc = start_evolve(config)
        try:
            wait_for_a_call(server, proc)
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=60)
        finally:
            proc.kill()  # when it hung: a no-op once it has exited
    assert proc.returncode == 130, stderr
    assert "interrupted: state saved to" in stderr and stderr.rstrip().endswith("\ninterrupted"), stderr
    assert "Traceback" not in stderr
    assert json.loads((tmp_path / "out" / STATE).read_text(encoding="utf-8"))["generation"] == 0


def test_a_removed_lock_file_lets_no_second_evolve_in(tmp_path, shared, tiny_model_dir, monkeypatch, capsys):
    """Item 7: the lock is held on the run directory itself, so `rm run.lock` during a run
    changes nothing: a second evolve is refused with the busy directory's line and exit 1."""
    import signal

    from tests.fakes.openai_server import HANG, FakeOpenAIServer
    from tests.test_resume import start_evolve

    monkeypatch.setenv(REPLY_KEY_ENV, REPLY_KEY)
    out = tmp_path / "out"
    with FakeOpenAIServer(lambda body: HANG) as server:
        config = write_config(tmp_path, shared, tiny_model_dir, **reply_symbols(
            server, REFLECTOR_TIMEOUT="60", REFLECTOR_MAX_CONSECUTIVE_FAILURES="1"))
        first = start_evolve(config)
        try:
            wait_for_a_call(server, first)  # it holds the lock, in generation 0, and writes nothing
            (out / "run.lock").unlink()
            files, answers = run_files(out), answers_stored(out)
            code = main(["evolve", "--config", str(config)])
            untouched = (run_files(out), answers_stored(out)) == (files, answers)
            still_running = first.poll() is None
        finally:
            first.send_signal(signal.SIGINT)
            try:
                first.communicate(timeout=60)
            finally:
                first.kill()
    assert still_running, "the first run ended before the second started: the test proved nothing"
    assert (code, capsys.readouterr().err.strip().splitlines()) == (1, [
        f"error: '{out}' is in use by another evolve (pid unknown: run.lock was removed): wait for it to finish or "
        "stop it, or choose another CONFIG_OUTPUT_DIR"])
    assert untouched


# == Issue X, items 2, 4, 5, 7 and 8: the third round's probe ======================================
#
# `WRITES`: a command pointed at a file it does not own: the training data, a tokenizer file,
# the initial deltas, another run's files once its run.lock was removed. Each row is refused in
# one line, exit 2, and leaves every file of its scene byte-identical (`Site`: copies of the
# data, the model and the clusters, and another finished run without its lock). Each failed on
# the code before: the file was written over (the descriptions JSON in train.jsonl), or made
# through a symbolic link.

@dataclass(frozen=True)
class Site:
    data: Path
    model: Path
    other: Path  # another finished run, its run.lock removed
    symbols: dict[str, str]  # the scene's config on the copies of the data and the clusters

    def config(self, **symbols: str) -> dict[str, str]:
        return {**self.symbols, **symbols}


def site_of(scene: Scene) -> Site:
    data = scene.work / "data.jsonl"
    shutil.copyfile(scene.shared / "train.jsonl", data)
    model = Path(shutil.copytree(scene.model, scene.work / "model"))
    other = Path(shutil.copytree(scene.uninterrupted, scene.work / "other_run"))
    (other / "run.lock").unlink()
    return Site(data, model, other, {**scene.clusters_copy(), "FINANCEBENCH_JSONL_PATH": f'"{data}"'})


def every_file(root: Path) -> dict[str, bytes]:
    """Every file under `root` (a symbolic link as where it points), by relative path; but
    the index and log SQLite keeps beside an archive a command reads (`export` its own)."""
    return {str(p.relative_to(root)): (f"-> {os.readlink(p)}".encode() if p.is_symlink() else p.read_bytes())
            for p in sorted(root.rglob("*"))
            if (p.is_symlink() or p.is_file()) and p.name not in ("run.sqlite-shm", "run.sqlite-wal")}


def linked(scene: Scene, target: Path, name: str = "link.json") -> Path:
    (scene.work / name).symlink_to(target)
    return scene.work / name


@dataclass(frozen=True)
class Write:
    name: str
    plant: Callable[[Scene, Site], list[str]]
    pattern: str  # the one error line, after "error: "


def descriptions_at(path: Callable[[Scene, Site], Path]) -> Callable[[Scene, Site], list[str]]:
    return lambda s, t: s.command("build-clusters", **t.config(CLUSTER_DESCRIPTIONS_PATH=f'"{path(s, t)}"'))


NOT_WRITTEN_HERE = (r"CONFIG_CLUSTER_DESCRIPTIONS_PATH='.*{}' holds a file no build of "
                    r"CONFIG_CLUSTER_DIR='.*clusters' wrote")
OTHER_RUNS = r"'.*other_run/{}' is a file of the run in '.*other_run'"

WRITES = [
    Write("descriptions over the training data", descriptions_at(lambda s, t: t.data),
          r"CONFIG_CLUSTER_DESCRIPTIONS_PATH='.*data\.jsonl' is the input CONFIG_FINANCEBENCH_JSONL_PATH: a cluster "
          r"build would write over it"),
    Write("descriptions over the model's tokenizer", descriptions_at(lambda s, t: t.model / "tokenizer.json"),
          NOT_WRITTEN_HERE.format(r"model/tokenizer\.json")),
    Write("descriptions through a symbolic link to the data", descriptions_at(lambda s, t: linked(s, t.data)),
          r"CONFIG_CLUSTER_DESCRIPTIONS_PATH='.*link\.json' is a symbolic link: a cluster build never writes "
          r"through one"),
    Write("descriptions through a dangling symbolic link",
          descriptions_at(lambda s, t: linked(s, s.work / "made_through_the_link.json")),
          r"CONFIG_CLUSTER_DESCRIPTIONS_PATH='.*link\.json' is a symbolic link"),
    Write("descriptions over the initial deltas",
          descriptions_at(lambda s, t: s.work / "clusters" / "initial_deltas.json"),
          r"CONFIG_CLUSTER_DESCRIPTIONS_PATH='.*initial_deltas\.json' is the input CONFIG_INITIAL_DELTAS_PATH"),
    Write("descriptions over another run's archive, its lock removed",
          descriptions_at(lambda s, t: t.other / "run.sqlite"),
          r"CONFIG_CLUSTER_DESCRIPTIONS_PATH=" + OTHER_RUNS.format(r"run\.sqlite")),
    Write("descriptions over another run's history, its lock removed",
          descriptions_at(lambda s, t: t.other / "history.json"),
          r"CONFIG_CLUSTER_DESCRIPTIONS_PATH=" + OTHER_RUNS.format(r"history\.json")),
    Write("initial deltas through a dangling symbolic link", lambda s, t: s.command("build-clusters", **t.config(
          INITIAL_DELTAS_PATH=f'"{linked(s, s.work / "made_through_the_link.json", "initial.json")}"')),
          r"CONFIG_INITIAL_DELTAS_PATH='.*initial\.json' is a symbolic link"),
    Write("the initial deltas' sidecar over a file of the user's", lambda s, t: s.command("build-clusters", **t.config(
          INITIAL_DELTAS_PATH=f'"{planted(s, b"{}", "mine.clusters.json").with_name("mine.json")}"')),
          r"the sidecar of CONFIG_INITIAL_DELTAS_PATH='.*mine\.clusters\.json' holds a file no build"),
    Write("evaluate --out another run's archive, its lock removed",
          lambda s, t: s.command("evaluate", "--out", str(t.other / "run.sqlite"), **t.symbols),
          r"evaluate --out " + OTHER_RUNS.format(r"run\.sqlite")),
    Write("generate-processor --out another run's history, its lock removed", lambda s, t: s.command(
          "generate-processor", "--deltas", str(t.other / "deltas_best.json"), "--out", str(t.other / "history.json"),
          **t.symbols), r"generate-processor --out " + OTHER_RUNS.format(r"history\.json")),
    Write("export --out another run's archive, its lock removed", lambda s, t: s.finished_run() and s.command(
          "export", "--candidate", best_candidate(s), "--out", str(t.other / "run.sqlite"), **t.symbols),
          r"export --out " + OTHER_RUNS.format(r"run\.sqlite")),
]


@pytest.mark.parametrize("case", WRITES, ids=[c.name for c in WRITES])
def test_a_command_never_writes_where_it_does_not_own(case: Write, tmp_path, shared, tiny_model_dir, uninterrupted,
                                                       capsys):
    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted, lambda strategy: uninterrupted)
    argv = case.plant(scene, site_of(scene))
    before = every_file(tmp_path)
    capsys.readouterr()
    code = main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert (code, len(lines)) == (2, 1), lines
    assert re.fullmatch(rf"error: {case.pattern}.*", lines[0]), lines[0]
    assert every_file(tmp_path) == before


def cli_process(argv: list[str], preexec_fn: Callable[[], None] | None = None) -> Any:
    """`python -m compressor_2 ARGV` to its end, with a hang guard of 300 s (not a speed target)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    return subprocess.run([sys.executable, "-m", "compressor_2", *argv], cwd=REPO, capture_output=True, text=True,
                          preexec_fn=preexec_fn, timeout=300, check=False)


def test_a_fifo_for_run_lock_is_refused_without_blocking(tmp_path, shared, tiny_model_dir, uninterrupted):
    """Item 7: opening a FIFO to write the pid waited for a reader for ever. A process of its
    own, so that the code before could only hang up to the guard."""
    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted, lambda strategy: uninterrupted)
    argv = scene.command("evolve", NGEN=RESUMED_NGEN)
    out = scene.finished_run()
    (out / "run.lock").unlink()
    os.mkfifo(out / "run.lock")
    files, answers = run_files(out), answers_stored(out)
    result = cli_process(argv)
    assert (result.returncode, result.stderr.strip().splitlines()) == (2, [
        f"error: '{out / 'run.lock'}' is a FIFO, not a regular file: remove it (it only names the pid of the evolve "
        "holding the run directory, whose lock is on the directory itself)"]), result.stderr
    assert (out / "run.lock").is_fifo() and run_files(out) == files and answers_stored(out) == answers


def test_a_full_disk_is_one_line_naming_the_file(tmp_path, shared, tiny_model_dir):
    """Item 9: a write that fails for want of room names its file (it said `OSError: [Errno
    28] No space left on device`). The room runs out by the file-size limit of a process of
    its own (EFBIG, SIGXFSZ ignored), as a full disk would fail the same writes."""
    import resource
    import signal

    def little_room() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    config = str(write_config(tmp_path, shared, tiny_model_dir))
    assert main(["build-clusters", "--config", config]) == 0  # the session's clusters, with room to build them
    result = cli_process(["evolve", "--config", config], little_room)
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and len(lines) == 1, result.stderr[-2000:]
    out = re.escape(str(tmp_path / "out"))
    assert re.fullmatch(rf"error: '{out}/[^']+' cannot be written: \S.*", lines[0]), lines[0]
    # The atomic writer, which every other file goes through, alike (and leaves no temp file).
    import subprocess
    import sys

    from tests.conftest import REPO

    target = tmp_path / "big.json"
    written = subprocess.run([sys.executable, "-c", "import sys; from compressor_2.common.atomic import atomic_write_bytes; "
                              "atomic_write_bytes(sys.argv[1], bytes(1 << 20))", str(target)], cwd=REPO,
                             capture_output=True, text=True, preexec_fn=little_room, timeout=300, check=False)
    assert written.stderr.strip().splitlines()[-1] == (
        f"compressor_2.common.errors.RunError: '{target}' cannot be written: File too large"), written.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".big")) == [] and not target.exists()


def test_the_model_is_compared_by_its_files_and_cached_by_size_and_mtime(tmp_path, tiny_model_dir, monkeypatch):
    """Item 5: a file's digest is read from the cache while its size and mtime are the same
    (a 70B is not hashed again), and hashed again when either changed."""
    from compressor_2.model import model_digest

    monkeypatch.setenv("COMPRESSOR_2_CACHE", str(tmp_path / "cache"))
    model = Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))
    weights = model / "model.safetensors"
    first = model_digest(model)
    assert first is not None and (tmp_path / "cache" / "model_digests.json").is_file()
    assert model_digest(shutil.copytree(model, tmp_path / "moved")) == first  # the same files elsewhere
    (model / "README.md").write_text("notes that change no answer")
    assert model_digest(model) == first
    stamp = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # the same size and mtime: the cache answers
    assert model_digest(model) == first
    os.utime(weights, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1))
    assert model_digest(model) != first
    assert model_digest("org/some-hub-model") is None


def test_a_model_whose_weights_changed_in_place_is_refused_on_resume(tmp_path, shared, tiny_model_dir, capsys):
    """Item 5: the run recorded its model by content; the same path with other weights is
    another model, and its answers would mix with the cached ones."""
    model = Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))
    assert main(["evolve", "--config", str(write_config(tmp_path, shared, model, NGEN="1"))]) == 0
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    out = tmp_path / "out"
    files, answers = run_files(out), answers_stored(out)
    capsys.readouterr()
    assert main(["evolve", "--config", str(write_config(tmp_path, shared, model, NGEN="2"))]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert re.fullmatch(r"  the model \(a digest of its weights and tokenizer files\): (\d+) files, sha256 "
                        r"[0-9a-f]{16} when the run started, \1 files, sha256 [0-9a-f]{16} now", lines[1]), lines
    assert run_files(out) == files and answers_stored(out) == answers


JUDGE_KEY, JUDGE_KEY_ENV = "sk-judge-SECRET-2424", "C2_JUDGE_KEY"


def judge_symbols(server: Any, **extra: str) -> dict[str, str]:
    return {"JUDGE_LLM": "y", "JUDGE_BASE_URL": f'"{server.base_url}"', "JUDGE_API_KEY_ENV": f'"{JUDGE_KEY_ENV}"',
            **extra}


def test_a_judge_echoing_the_key_leaves_it_in_no_file(tmp_path, shared, tiny_model_dir, monkeypatch, capsys):
    """Item 4: the judge's reasoning is stored with every answer (54 rows held the whole key);
    it is masked as a reflector's text is, raw and JSON-escaped alike."""
    from tests.fakes.openai_server import FakeOpenAIServer, chat_completion

    def echo(body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Any]:
        del body
        auth = next(v for k, v in headers.items() if k.lower() == "authorization")
        escaped = "".join(f"\\u{ord(c):04x}" for c in auth)
        return 200, chat_completion(f'{{"is_correct": false, "reasoning": "you sent {auth}; escaped, {escaped}"}}')

    monkeypatch.setenv(JUDGE_KEY_ENV, JUDGE_KEY)
    with FakeOpenAIServer(echo, with_headers=True) as server:
        config = write_config(tmp_path, shared, tiny_model_dir, NGEN="1", **judge_symbols(server))
        assert main(["evolve", "--config", str(config)]) == 0, capsys.readouterr().err
    out = tmp_path / "out"
    assert [p for p in out.rglob("*") if p.is_file() and JUDGE_KEY.encode() in p.read_bytes()] == []
    reasons = [r for (r,) in archive_rows(out, "SELECT reasoning FROM evaluations")]
    assert reasons and all(r.count("Bearer ***") == 2 for r in reasons)


def test_a_judge_that_never_answers_stops_the_run_within_its_bound(tmp_path, shared, tiny_model_dir, monkeypatch):
    """Items 8 and the hangs: a judge call was 120 s x 6 attempts, with nothing to bound a run.
    Now one call gets CONFIG_JUDGE_TIMEOUT, its retries included, and the run stops after
    CONFIG_JUDGE_MAX_CONSECUTIVE_FAILURES failed calls in a row. A process of its own, under
    the hang guard."""
    from tests.fakes.openai_server import HANG, FakeOpenAIServer

    monkeypatch.setenv(JUDGE_KEY_ENV, JUDGE_KEY)
    with FakeOpenAIServer(lambda body: HANG) as server:
        config = write_config(tmp_path, shared, tiny_model_dir, NGEN="1", **judge_symbols(
            server, JUDGE_TIMEOUT="2", JUDGE_MAX_CONSECUTIVE_FAILURES="2"))
        result = cli_process(["evolve", "--config", str(config)])
        requests = len(server.requests)
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: the judge at {server.base_url} failed 2 calls in a row (CONFIG_JUDGE_MAX_CONSECUTIVE_FAILURES=2); "
        "the last: no verdict within 2 s (CONFIG_JUDGE_TIMEOUT)")
    assert 2 <= requests <= 2 * 8  # each call one request (the timeout covers its retries), 8 in flight at most


def judge_reply_with_long_usage(digits: int) -> str:
    from tests.fakes.openai_server import chat_completion

    completion = chat_completion('{"is_correct": true, "reasoning": "same figure"}')
    return json.dumps({**completion, "usage": {"prompt_tokens": "DIGITS"}}).replace('"DIGITS"', "9" * digits)


def judge_content(content: str) -> dict[str, Any]:
    from tests.fakes.openai_server import chat_completion

    return chat_completion(content)


@pytest.mark.parametrize("reply, said", [
    (GATEWAY_PAGE, r": the reply is not JSON \(HTTP 200, application/json\): '<!doctype html>.*"),
    ({"result": "ok"}, r": the reply is not a chat completion \(no list of choices\): \{'result': 'ok'\}"),
    (NESTED_TOO_DEEPLY, r": the reply is JSON nested too deeply to read \(HTTP 200, application/json\): '\[\[\[.*"),
    (judge_reply_with_long_usage(5_000),
     r": the reply is JSON with a number too long to read \(HTTP 200, application/json\): '\{\"id\".*"),
    (judge_content("not a verdict"), r" did not return the verdict schema: 'not a verdict'"),
    (judge_content(NESTED_TOO_DEEPLY),
     r" did not return the verdict schema \(its content is JSON nested too deeply to read\): '\[\[\[.*"),
    (judge_content('{"is_correct": true, "reasoning": "same", "score": ' + "9" * 5_000 + "}"),
     r" did not return the verdict schema \(its content is JSON with a number too long to read\): "
     r"'\{\"is_correct\".*"),
], ids=["an HTML page with status 200", "a reply without choices", "a reply nested too deeply",
        "usage of 5,000 digits", "content off the schema", "content nested too deeply", "content with 5,000 digits"])
def test_a_judge_reply_that_is_no_chat_completion_is_a_failed_call_saying_what_came_back(reply, said):
    """Item 4: the judge read the SDK's unvalidated object (JSONDecodeError, AttributeError);
    JSON too deep for Python's parser (RecursionError) killed the run, and a number too long
    for it was reported as no JSON at all."""
    from compressor_2.common.errors import RunError
    from compressor_2.judges.base import JudgeItem
    from compressor_2.judges.llm import LLMJudge
    from tests.fakes.openai_server import FakeOpenAIServer

    with FakeOpenAIServer(lambda body: (200, reply)) as server:
        judge = LLMJudge("m", server.base_url, JUDGE_KEY, max_retries=0, max_failures=2)
        with pytest.raises(RunError) as failed:
            judge.judge([JudgeItem("q", "a", "g")])
        requests = len(server.requests)
    assert re.fullmatch(rf"the judge at {re.escape(server.base_url)} failed 2 calls in a row "
                        rf"\(CONFIG_JUDGE_MAX_CONSECUTIVE_FAILURES=2\); the last: the judge model m at "
                        rf"{re.escape(server.base_url)}{said}", str(failed.value)), str(failed.value)
    assert requests == 2


def test_a_rebuild_interrupted_after_withdrawing_the_set_still_owns_its_descriptions(tmp_path, shared, tiny_model_dir,
                                                                                     uninterrupted, capsys):
    """Item 2's other side: a rebuild removes fingerprint.json first, so a build that failed
    part way (here: k beyond the vocabulary) leaves descriptions no record vouches for; the
    ledger does, even for a set built before it existed (claimed then from the record)."""
    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted, lambda strategy: uninterrupted)
    symbols = scene.clusters_copy()
    (tmp_path / "clusters" / "written.json").unlink(missing_ok=True)  # as a build before the ledger left it
    assert main(scene.command("build-clusters", **symbols, NUM_CLUSTERS="5000")) == 2
    assert not (tmp_path / "clusters" / "fingerprint.json").exists()
    capsys.readouterr()
    assert main(scene.command("build-clusters", **symbols)) == 0, capsys.readouterr().err
    assert (tmp_path / "clusters" / "fingerprint.json").is_file()


def test_the_issue_weights_say_what_a_type_left_out_gets(tmp_path, shared, tiny_model_dir):
    """Issue AB, item 5: "cut_short=2" is accepted, and the help says what it means for the
    other three types."""
    import kconfiglib

    from compressor_2.config import KCONFIG_PATH, load_config

    config = load_config(write_config(tmp_path, shared, tiny_model_dir, STRATEGY_ARCHIVE="y",
                                      ARCHIVE_ISSUE_WEIGHTS='"cut_short=2"'))
    assert config.archive is not None and config.archive.issue_weights == (("cut_short", 2.0),)
    help_text = kconfiglib.Kconfig(str(KCONFIG_PATH), warn_to_stderr=False).syms["ARCHIVE_ISSUE_WEIGHTS"].nodes[0].help
    assert "a type left out gets 0" in " ".join(help_text.split())


# == Issue AB, items 3 and 4: compare first, write after; clusters keyed by the vocabulary =====

def meta_of(out: Path, key: str) -> str:
    with closing(sqlite3.connect(out / "run.sqlite")) as db:
        return str(db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()[0])


def test_a_resume_refused_for_its_initial_deltas_writes_nothing_first(tmp_path, shared, tiny_model_dir, uninterrupted,
                                                                       capsys):
    """Item 3: a run started from deltas of its own, resumed with CONFIG_INITIAL_DELTAS_PATH
    naming a file not there yet: the cluster build wrote all-zero deltas there, their sidecar
    and its record before the run compared them with its own and refused. Now every file of
    the run and of the clusters is as it was, byte for byte."""
    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted, lambda strategy: uninterrupted)
    clusters = scene.clusters_copy()
    ids = json.loads((tmp_path / "clusters" / "initial_deltas.json").read_text(encoding="utf-8"))
    mine = planted(scene, json.dumps({cid: 0.5 for cid in ids}).encode(), "mine.json")
    assert main(scene.command("evolve", NGEN="1", **{**clusters, "INITIAL_DELTAS_PATH": f'"{mine}"'})) == 0
    new = tmp_path / "clusters" / "new.json"
    argv = scene.command("evolve", NGEN="2", **{**clusters, "INITIAL_DELTAS_PATH": f'"{new}"'})
    before = left_as_it_was(scene)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "holds a run started with other settings" in err[0], err
    assert err[1].startswith('  the initial deltas (what CONFIG_INITIAL_DELTAS_PATH holds): {"0": 0.5'), err
    assert left_as_it_was(scene) == before


def test_a_resume_refused_with_a_copied_model_writes_nothing_first(tmp_path, shared, tiny_model_dir, uninterrupted,
                                                                    capsys):
    """Items 3 and 4: the model copied with a note beside it (its tokenizer files then differ
    from the ones the clusters recorded, its vocabulary does not) and the initial deltas
    edited: the build rebuilt the clusters for the new path (and would refresh its record),
    then the resume was refused. Now the clusters are the same and nothing is written."""
    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted, lambda strategy: uninterrupted)
    clusters = scene.clusters_copy()
    scene.finished_run()
    model = Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))
    (model / "README.md").write_text("a copy, with notes")
    initial = tmp_path / "clusters" / "initial_deltas.json"
    initial.write_text(json.dumps({cid: 0.5 for cid in json.loads(initial.read_text(encoding="utf-8"))}))
    argv = scene.command("evolve", NGEN=RESUMED_NGEN, MODEL_PATH=f'"{model}"', **clusters)
    before = left_as_it_was(scene)
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "clusters up to date" in captured.out, captured.out
    assert captured.err.strip().splitlines()[1].startswith("  the initial deltas"), captured.err
    assert left_as_it_was(scene) == before


def test_a_copied_model_resumes_the_run_on_its_clusters_and_answers(tmp_path, shared, tiny_model_dir, uninterrupted,
                                                                     capsys):
    """Item 4: the same model in another directory is the same model: the resumed run
    reuses the clusters without a rebuild (fingerprint.json byte for byte: a processor
    steering by reference holds its build digest) and the answers cached under the context
    the run recorded."""
    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted, lambda strategy: uninterrupted)
    clusters = scene.clusters_copy()
    out = scene.finished_run()
    model = Path(shutil.copytree(tiny_model_dir, tmp_path / "elsewhere" / "model"))
    record = (tmp_path / "clusters" / "fingerprint.json").read_bytes()
    context, hits = meta_of(out, "context"), int(meta_of(out, "cache_hits"))
    capsys.readouterr()
    assert main(scene.command("evolve", NGEN=RESUMED_NGEN, MODEL_PATH=f'"{model}"', **clusters)) == 0
    printed = capsys.readouterr().out
    assert "clusters up to date" in printed and not re.search(r"^built \d+ clusters", printed, re.M), printed
    assert (tmp_path / "clusters" / "fingerprint.json").read_bytes() == record
    assert meta_of(out, "context") == context and int(meta_of(out, "cache_hits")) > hits
    assert json.loads((out / STATE).read_text(encoding="utf-8"))["generation"] == int(RESUMED_NGEN)


def test_a_set_recorded_with_the_model_path_keeps_its_build_digest(tmp_path, shared, tiny_model_dir, uninterrupted,
                                                                  capsys):
    """Item 4, for the clusters users have: a set built when the model's path was an input
    (its record names the path, its build digest hashed it) is taken as it is, wherever the
    model lies now: no rebuild, and the build digest deployed processors hold is kept."""
    from compressor_2.clusters.builder import build_clusters
    from tests.test_evolution_support import config_for

    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted, lambda strategy: uninterrupted)
    clusters = scene.clusters_copy()
    path = tmp_path / "clusters" / "fingerprint.json"
    record = json.loads(path.read_text(encoding="utf-8"))
    record["inputs"]["model_path"], record["fingerprint"] = "/where/the/model/was", "f" * 64
    path.write_text(json.dumps(record))
    model = Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))
    capsys.readouterr()
    assert build_clusters(config_for(tmp_path, shared, model, **clusters)).build_digest == "f" * 64
    assert "clusters up to date" in capsys.readouterr().out
    assert json.loads(path.read_text(encoding="utf-8")) == record


def test_clusters_of_another_vocabulary_are_refused_by_what_reads_them(tmp_path, shared, tiny_model_dir, uninterrupted,
                                                                      capsys):
    """Item 4's other side: without the path in the key, the vocabulary tells the clusters
    of one model from another's, for what reads them without building (generate-processor)."""
    from tests.conftest import build_tiny_model

    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted, lambda strategy: uninterrupted)
    other = build_tiny_model(tmp_path / "other_model", vocab_size=280)
    argv = scene.processor(tmp_path / "p.py", MODEL_PATH=f'"{other}"', **scene.clusters_copy())
    before = left_as_it_was(scene)
    capsys.readouterr()
    assert main(argv) == 2
    assert re.fullmatch(r"error: CONFIG_MODEL_PATH='.*other_model' has another vocabulary than the clusters were "
                        r"built from: run `python -m compressor_2 build-clusters.*", capsys.readouterr().err.strip())
    assert left_as_it_was(scene) == before


# One table of inputs (AE item 1) ===============================================================
#
# Every input the config names, as the target of every writing command's output: refused in
# one line naming the option and the input, exit 2, before any work, and every file of the
# scene stays byte-identical. Each row plants the input (`Input.put`) where the output
# would go, on a copy of the clusters. `report` writes only CONFIG_OUTPUT_DIR/report.html, so
# there the input is planted at that name (a sidecar is always named *.clusters.json: none),
# as for `evolve`, which writes it among the run's files;
# build-clusters writes the descriptions at CONFIG_CLUSTER_DESCRIPTIONS_PATH, named the input.
# `evaluate --indices 0-1 --out` the held-out questions wrote its records over them before
# there was one table.

@dataclass(frozen=True)
class Input:
    name: str
    put: Callable[[Scene, Path | None], tuple[Path, dict[str, str]]]  # where (None: its own place) -> path, symbols
    what: str  # how the refusal names it
    report: bool = True  # can be planted at report.html


def copied(data: Callable[[Scene], bytes], symbol: str, default: str) -> Callable[[Scene, Path | None],
                                                                          tuple[Path, dict[str, str]]]:
    """An input holding `data` at `where` (else at `default` in the scene), named by `symbol`."""
    def put(scene: Scene, where: Path | None) -> tuple[Path, dict[str, str]]:
        path = where or scene.work / default
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data(scene))
        return path, {symbol: f'"{path}"'}
    return put


def held_out(scene: Scene) -> bytes:
    """Held-out questions: the training questions, asked otherwise."""
    rows = [json.loads(line) for line in (scene.shared / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    return "".join(json.dumps({**row, "financebench_id": f"held-{row['financebench_id']}",
                               "question": f"Held out: {row['question']}"}) + "\n" for row in rows).encode()


def in_clusters(name: str, symbol: str) -> Callable[[Scene, Path | None], tuple[Path, dict[str, str]]]:
    """A file of the scene's copy of the clusters; at `where`, a copy of it named by `symbol`."""
    def put(scene: Scene, where: Path | None) -> tuple[Path, dict[str, str]]:
        return (scene.work / "clusters" / name, {}) if where is None else copied(
            lambda s: (s.work / "clusters" / name).read_bytes(), symbol, name)(scene, where)
    return put


def model_file(scene: Scene, where: Path | None) -> tuple[Path, dict[str, str]]:
    """A file of a copy of the model's directory (CONFIG_MODEL_PATH)."""
    del where
    model = Path(shutil.copytree(scene.model, scene.work / "model"))
    return model / "tokenizer.json", {"MODEL_PATH": f'"{model}"'}


def gguf_model(scene: Scene, where: Path | None) -> tuple[Path, dict[str, str]]:
    """A GGUF file as CONFIG_MODEL_PATH (a tiny one whose header parses: every row is refused
    before it loads)."""
    path = where or scene.work / "model.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_tiny_gguf(path)
    return path, {"MODEL_PATH": f'"{path}"'}


INPUTS = [
    Input("the training data", copied(lambda s: (s.shared / "train.jsonl").read_bytes(), "FINANCEBENCH_JSONL_PATH",
                                      "data.jsonl"), "the input CONFIG_FINANCEBENCH_JSONL_PATH"),
    Input("the held-out data", copied(held_out, "HOLDOUT_DATA", "heldout.jsonl"), "the input CONFIG_HOLDOUT_DATA"),
    Input("the prompt template", copied(lambda s: b"{question}\n{evidence}\n", "PROMPT_TEMPLATE_PATH", "template.txt"),
          "the input CONFIG_PROMPT_TEMPLATE_PATH"),
    Input("a GGUF model", gguf_model, "the input CONFIG_MODEL_PATH"),
    Input("a file of the model's directory", model_file, r"a file of the input CONFIG_MODEL_PATH \(tokenizer\.json\)",
          report=False),
    Input("the cluster descriptions", in_clusters("cluster_descriptions.json", "CLUSTER_DESCRIPTIONS_PATH"),
          "the input CONFIG_CLUSTER_DESCRIPTIONS_PATH"),
    Input("the initial deltas", in_clusters("initial_deltas.json", "INITIAL_DELTAS_PATH"),
          "the input CONFIG_INITIAL_DELTAS_PATH"),
    Input("the initial deltas' sidecar", in_clusters("initial_deltas.clusters.json", "INITIAL_DELTAS_PATH"),
          "the cluster-map sidecar of CONFIG_INITIAL_DELTAS_PATH", report=False),
    Input("the config", lambda s, where: (where or s.work / "test.config", {}), r"the config file \(--config\)"),
]


def output_at(command: str, scene: Scene, given: Input) -> tuple[list[str], str]:
    """The command line writing over `given`, planted for `command`, and the refusal's start."""
    clusters = scene.clusters_copy()
    if command in ("export", "report"):
        scene.finished_run()
    path, symbols = given.put(scene, scene.out / "report.html" if command in ("report", "evolve") else None)
    symbols = {**clusters, **symbols}
    shown = re.escape(str(path))
    if command == "build-clusters":
        argv = scene.command(command, **{**symbols, "CLUSTER_DESCRIPTIONS_PATH": f'"{path}"'})
        start = f"CONFIG_CLUSTER_DESCRIPTIONS_PATH='{shown}'"
    elif command in ("report", "evolve"):
        argv = scene.command(command, **symbols)
        start = f"report's page '{shown}'" if command == "report" else f"CONFIG_OUTPUT_DIR's report.html '{shown}'"
    else:
        args = {"evaluate": ["--indices", "0-1"], "generate-processor": ["--deltas", str(planted(scene, b"{}"))],
                "export": ["--candidate", best_candidate(scene)]}[command]
        argv, start = scene.command(command, *args, "--out", str(path), **symbols), f"{command} --out '{shown}'"
    if given.name == "the config":
        # The config is the input: it names itself (written last, where the input is).
        config = Path(argv[2])
        if path != config:
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(config, path)
        argv[2] = str(path)
    return argv, start


ONE_TABLE = [(command, given) for command in ("evaluate", "generate-processor", "export", "report", "build-clusters",
                                              "evolve") for given in INPUTS
             if (command not in ("report", "evolve") or given.report)
             and not (command == "build-clusters" and given.name == "the cluster descriptions")]


@pytest.mark.parametrize(("command", "given"), ONE_TABLE, ids=[f"{c} over {i.name}" for c, i in ONE_TABLE])
def test_no_writing_command_writes_over_an_input_the_config_names(command: str, given: Input, tmp_path, shared,
                                                                   tiny_model_dir, uninterrupted, capsys):
    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted, lambda strategy: uninterrupted)
    argv, start = output_at(command, scene, given)
    before = every_file(tmp_path)
    capsys.readouterr()
    code = main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert (code, len(lines)) == (2, 1), lines
    assert re.fullmatch(rf"error: {start} is {given.what}: .*", lines[0]), lines[0]
    assert every_file(tmp_path) == before


def test_evaluate_reads_the_initial_deltas_a_build_wrote_and_leaves_them_as_they_were(tmp_path, shared,
                                                                                     tiny_model_dir, capsys):
    """A deltas option may name the initial deltas, which a build of the same directory may
    write: they are an input of the build's own, not a file another input takes."""
    scene = Scene(tmp_path, shared, tiny_model_dir, tmp_path, lambda strategy: tmp_path)
    clusters = scene.clusters_copy()
    initial = tmp_path / "clusters" / "initial_deltas.json"
    before = every_file(tmp_path / "clusters")
    argv = scene.command("evaluate", "--deltas", str(initial), "--indices", "0", "--out", str(tmp_path / "e.json"),
                         **clusters)
    assert main(argv) == 0, capsys.readouterr().err
    assert every_file(tmp_path / "clusters") == before and (tmp_path / "e.json").is_file()


# == Issue AB, item 1: an emptied answer cache is a cache: evolve makes the answers again =========

# A run with a held-out question and the simpler tools (their cap reads the baseline's answers).
WITH_TOOLS = {"FINANCEBENCH_POOL_INDICES": '"0-1"', "HOLDOUT_INDICES": '"2"', "NGEN": "2", "COMPARE_SIMPLE": "y",
              "COMPARE_INSTRUCTION": '"Answer with the figure only."'}


@pytest.fixture(scope="module")
def with_tools(tmp_path_factory, shared, tiny_model_dir, uninterrupted) -> Path:
    """The finished run of WITH_TOOLS (its work directory)."""
    from compressor_2.commands.evolve import evolve
    from tests.test_evolution_support import config_for

    del uninterrupted  # built the shared clusters
    work = tmp_path_factory.mktemp("with_tools")
    evolve(config_for(work, shared, tiny_model_dir, **WITH_TOOLS))
    return work


def claims_printed(printed: str) -> list[str]:
    """The run's claims: the held-out line and the simpler tools' (the accounting line
    before them counts the answers made, which a lost cache changes)."""
    return [line for line in printed.splitlines() if line.startswith(("held-out (", "simpler tools "))]


@pytest.mark.parametrize("damage", [("DELETE FROM evaluations",), ("DROP TABLE evaluations",),
                                    ("DELETE FROM check_answers",),
                                    ("DELETE FROM evaluations", "DELETE FROM check_answers")],
                         ids=["evaluations deleted", "evaluations dropped", "check answers deleted", "both deleted"])
def test_an_emptied_answer_cache_is_answered_again_and_the_run_ends_as_it_would(damage, tmp_path, with_tools, shared,
                                                                                 tiny_model_dir, capsys):
    """The finished run resumed with one more generation: with its answers deleted it ended
    in `ZeroDivisionError` (the cap divided by the baseline answers it found), after the
    state and the plots were written. Now the answers the outputs read are made again
    before the first step, and the run ends with the claims of the same run undamaged;
    `show` and `report` read it again."""
    intact, damaged = (Path(shutil.copytree(with_tools, tmp_path / name)) for name in ("intact", "damaged"))
    with closing(sqlite3.connect(damaged / "out" / "run.sqlite")) as db, db:
        for statement in damage:
            db.execute(statement)
    ends = []
    for work in (intact, damaged):
        config = write_config(work, shared, tiny_model_dir, **{**WITH_TOOLS, "NGEN": "3"})
        capsys.readouterr()
        assert main(["evolve", "--config", str(config)]) == 0, capsys.readouterr().err
        ends.append(claims_printed(capsys.readouterr().out))
    assert len(ends[0]) == 2 and ends[1] == ends[0]
    for command in (["show", "--front"], ["report"]):
        assert main([command[0], "--config", str(damaged / "test.config"), *command[1:]]) == 0, capsys.readouterr().err


def test_export_refuses_a_held_out_check_whose_answers_were_deleted(tmp_path, with_tools, shared, tiny_model_dir,
                                                                    capsys):
    """export chooses by the held-out check's answers; with them deleted it chose on the
    training front instead, as if no check had run ("Unvalidated"). Refused now, in one
    line naming run.sqlite, and nothing written."""
    work = Path(shutil.copytree(with_tools, tmp_path / "run"))
    with closing(sqlite3.connect(work / "out" / "run.sqlite")) as db, db:
        db.execute("DELETE FROM check_answers")
    config = write_config(work, shared, tiny_model_dir, **WITH_TOOLS)
    before = every_file(work)
    capsys.readouterr()
    assert main(["export", "--config", str(config), "--max-correctness-drop", "0.5"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(r"error: '.*run\.sqlite' lost answers its records rest on \(.*'s on the "
                                            r"held-out questions(, and \d+ more)?\): rows of its answer tables were "
                                            r"deleted \(or the held-out questions changed since the last check\); "
                                            r"rerun evolve with this config, which answers them again", lines[0]), lines
    assert every_file(work) == before


def test_the_best_with_the_instruction_lost_is_refused_by_show_and_made_again_by_evolve(tmp_path, with_tools, shared,
                                                                                        tiny_model_dir, capsys):
    """The six arms read the best's held-out answers with the instruction added: with those
    rows deleted, `show --front` refuses in one line naming run.sqlite (was: read on as if
    the arm held fewer questions), and `evolve` measures them again and ends as before."""
    work = Path(shutil.copytree(with_tools, tmp_path / "run"))
    with closing(sqlite3.connect(work / "out" / "run.sqlite")) as db, db:
        best = db.execute("SELECT genome FROM candidates ORDER BY fitness DESC, id LIMIT 1").fetchone()[0]
        deleted = db.execute("DELETE FROM check_answers WHERE genome = ? AND example LIKE '%+instruction%'",
                             (best,)).rowcount
    assert deleted > 0
    config = write_config(work, shared, tiny_model_dir, **WITH_TOOLS)
    before = every_file(work)
    capsys.readouterr()
    assert main(["show", "--config", str(config), "--front"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(
        r"error: '.*run\.sqlite' lost answers its records rest on \(the best on the instruction's other side's on "
        r"the held-out questions\): .*rerun evolve with this config, which answers them again", lines[0]), lines
    assert every_file(work) == before
    assert main(["evolve", "--config", str(config)]) == 0, capsys.readouterr().err
    assert main(["show", "--config", str(config), "--front"]) == 0, capsys.readouterr().err


# Fifth round (AF) =================================================================================
#
# Issue AF: a model that would load half random, refusals that came after the run's files,
# the preset's link where it cannot be made, and smaller holes. A refused command leaves every
# file of its scene byte for byte and makes no run directory (not even its lock file); each
# row failed on the tree before the issue.

def damaged_folder(scene: Scene, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of the tiny model with `edit` made to its weights (a tensor deleted, added or
    reshaped), saved as safetensors again."""
    from safetensors.torch import load_file, save_file

    model = Path(shutil.copytree(scene.model, scene.work / "damaged_model"))
    weights = load_file(model / "model.safetensors")
    edit(weights)
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    return model


def damaged_gguf(scene: Scene, **kwargs: Any) -> Path:
    """The tiny GGUF written with `kwargs` (tensors left out, another architecture in its header)."""


    (scene.work / "models").mkdir(exist_ok=True)
    return write_tiny_gguf(scene.work / "models" / "damaged.gguf", **kwargs)


def refused_before_any_write(scene: Scene, argv: list[str], pattern: str, capsys: Any) -> None:
    """`argv` ends in one line matching `pattern` with exit 2, every file of the scene as it
    was and no run directory made."""
    before = left_as_it_was(scene)
    capsys.readouterr()
    code = main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert (code, len(lines)) == (2, 1), lines
    assert re.fullmatch(rf"error: {pattern}", lines[0]), lines[0]
    assert left_as_it_was(scene) == before and not scene.out.exists()


def without_tensor(name: str) -> Callable[[dict[str, Any]], None]:
    def edit(weights: dict[str, Any]) -> None:
        del weights[name]
    return edit


def zeros_as(name: str, *shape: int) -> Callable[[dict[str, Any]], None]:
    import torch

    return lambda weights: weights.update({name: torch.zeros(*shape)})


UNFIT = r"CONFIG_MODEL_PATH='.*{}': its weights do not fit {} \({}\): transformers would fill them with random .*"
GGUF_DOWN = "blk.1.ffn_down.weight"
FOLDER_DOWN = "transformer.h.1.mlp.c_proj.weight"

MODELS = [
    ("a GGUF without one tensor", lambda s: damaged_gguf(s, without=(GGUF_DOWN,)),
     UNFIT.format(r"damaged\.gguf", "its header's architecture 'llama'",
                  r"1 tensor\(s\) missing: blk\.1\.ffn_down\.weight")),
    ("a GGUF without attn_q in every layer",
     lambda s: damaged_gguf(s, without=("blk.0.attn_q.weight", "blk.1.attn_q.weight")),
     UNFIT.format(r"damaged\.gguf", "its header's architecture 'llama'",
                  r"2 tensor\(s\) missing: blk\.0\.attn_q\.weight, blk\.1\.attn_q\.weight")),
    ("a GGUF whose header says mamba over llama tensors", lambda s: damaged_gguf(s, architecture="mamba"),
     UNFIT.format(r"damaged\.gguf", "its header's architecture 'mamba'",
                  r"18 tensor\(s\) missing: blk\.0\.ssm_a, .* and 15 more")),
    ("a GGUF whose header says gpt2 over llama tensors", lambda s: damaged_gguf(s, architecture="gpt2"),
     UNFIT.format(r"damaged\.gguf", "its header's architecture 'gpt2'",
                  r"16 tensor\(s\) missing: blk\.0\.attn_norm\.bias, .*")),
    ("a folder without one tensor", lambda s: damaged_folder(s, without_tensor(FOLDER_DOWN)),
     UNFIT.format("damaged_model", "its architecture 'gpt2'",
                  r"1 tensor\(s\) missing: transformer\.h\.1\.mlp\.c_proj\.weight")),
    ("a folder with a tensor of no gpt2", lambda s: damaged_folder(s, zeros_as("transformer.h.0.extra.weight", 3)),
     UNFIT.format("damaged_model", "its architecture 'gpt2'",
                  r"1 tensor\(s\) unexpected \(not its architecture's\): transformer\.h\.0\.extra\.weight")),
    ("a folder with a tensor of another shape",
     lambda s: damaged_folder(s, zeros_as("transformer.h.0.mlp.c_fc.weight", 3, 5)),
     UNFIT.format("damaged_model", "its architecture 'gpt2'",
                  r"1 tensor\(s\) of another shape than its architecture's: transformer\.h\.0\.mlp\.c_fc\.weight")),
]


@pytest.mark.parametrize("command", ["evaluate", "evolve"])
@pytest.mark.parametrize(("name", "damaged", "pattern"), MODELS, ids=[m[0] for m in MODELS])
def test_a_model_whose_weights_do_not_fit_is_refused_before_any_write(command, name, damaged, pattern, tmp_path, shared,
                                                                    tiny_model_dir, uninterrupted, capsys):
    """Item 1: each process loaded such a model with other random weights where the file
    had none (exit 0, transformers' table on stderr the only sign); a header of another
    architecture than the tensors ended in a RuntimeError after the run's files."""
    del name
    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted, lambda strategy: uninterrupted)
    argv = scene.command(command, MODEL_PATH=f'"{damaged(scene)}"', NGEN="1", **scene.clusters_copy())
    refused_before_any_write(scene, argv, pattern, capsys)


def test_tied_embeddings_are_no_missing_tensor_and_a_load_checks_the_weights_too(tmp_path, tiny_model_dir):
    """lm_head tied to the embeddings is in no file (the tiny GGUF has no output.weight, the
    tiny GPT-2 saves no lm_head): not missing. What the header check cannot see, the load
    refuses in the same line."""
    from compressor_2.common import ConfigError
    from compressor_2.model import load_causal_lm, model_context
    from tests.gguf_helpers import CONTEXT

    assert model_context(str(write_tiny_gguf(tmp_path / "tiny.gguf"))) == CONTEXT
    assert model_context(str(tiny_model_dir)) == 256
    scene = Scene(tmp_path, tmp_path, tiny_model_dir, tmp_path, lambda strategy: tmp_path)
    damaged = damaged_folder(scene, without_tensor(FOLDER_DOWN))
    refusal = UNFIT.format("damaged_model", "its architecture 'gpt2'",
                           r"1 tensor\(s\) missing: transformer\.h\.1\.mlp\.c_proj\.weight")
    with pytest.raises(ConfigError, match=refusal):
        load_causal_lm(str(damaged), gpu=False)


INSTRUCTION = ("Answer in as few words as you can. " * 57).strip()  # 1,994 characters: within the 2,000 allowed
TOO_LONG = (r"example \S+ \(prompt ending .*\): a prompt of \d+ tokens{}, plus CONFIG_MAX_NEW_TOKENS={}, exceeds the "
            r"context of {} tokens of CONFIG_MODEL_PATH='.*'; {}lower CONFIG_EVIDENCE_MAX_CHARS or "
            r"CONFIG_MAX_NEW_TOKENS")
CARRIED = r", CONFIG_COMPARE_INSTRUCTION \(1994 characters\) included, as {} it \(CONFIG_INSTRUCTION_IN_SEARCH={}\)"

CONTEXTS = [
    ("the tiny model with 250 new tokens", lambda s: {"MAX_NEW_TOKENS": "250"}, TOO_LONG.format("", 250, 256, "")),
    ("a GGUF of a 32-token context", lambda s: {"MODEL_PATH": f'"{damaged_gguf(s, context=32)}"'},
     TOO_LONG.format("", 8, 32, "")),
    ("the longest instruction, for the instruction tool only",
     lambda s: {"COMPARE_SIMPLE": "y", "COMPARE_INSTRUCTION": json.dumps(INSTRUCTION)},
     TOO_LONG.format(CARRIED.format("the instruction tool's prompts carry", "n"), 8, 256,
                     "shorten CONFIG_COMPARE_INSTRUCTION, or ")),
    ("the longest instruction, in every prompt of the search",
     lambda s: {"COMPARE_SIMPLE": "y", "COMPARE_INSTRUCTION": json.dumps(INSTRUCTION), "INSTRUCTION_IN_SEARCH": "y"},
     TOO_LONG.format(CARRIED.format("every prompt of the search carries", "y"), 8, 256,
                     "shorten CONFIG_COMPARE_INSTRUCTION, or ")),
]


@pytest.mark.parametrize(("name", "symbols", "pattern"), CONTEXTS, ids=[c[0] for c in CONTEXTS])
def test_a_prompt_past_the_context_is_refused_before_the_run_files(name, symbols, pattern, tmp_path, shared,
                                                                  tiny_model_dir, uninterrupted, capsys):
    """Item 2: the refusal came after run.sqlite and evolution_state.json were written (the
    corrected config was then refused as "a run started with other settings"), or, for the
    instruction tool's prompts, only at the end of the whole search; neither line named the
    instruction. Now before the lock file, naming it; and the corrected config then runs."""
    del name
    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted, lambda strategy: uninterrupted)
    clusters = scene.clusters_copy()
    refused_before_any_write(scene, scene.command("evolve", NGEN="1", **clusters, **symbols(scene)), pattern, capsys)
    assert main(scene.command("evolve", NGEN="1", **clusters)) == 0, capsys.readouterr().err


# -- item 3: the preset's link where it cannot be made ----------------------------------------------

def linked_preset(tmp_path: Path, models: Path, setup: str = "") -> Any:
    """`python -m compressor_2.demo.smollm2 --config` on the preset with its model in `models`,
    a stand-in package installed; `setup`: shell commands run first in a mount namespace of
    its own (a read-only file system there), skipped where this user may not make one."""
    import subprocess
    import sys

    from tests.conftest import REPO
    from tests.test_real_model import fake_package, preset_with_models_in

    site = tmp_path / "site"
    fake_package(site)
    config = preset_with_models_in(models, tmp_path / "real.config")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "compressor_2.demo.smollm2", "--config", str(config)]
    if setup:
        if shutil.which("unshare") is None or subprocess.run(
                ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o ro tmpfs '{tmp_path}'"], capture_output=True,
                check=False).returncode != 0:
            pytest.skip("this user may not mount a read-only file system in a mount namespace of its own")
        command = ["unshare", "-m", "sh", "-c", f"{setup} && exec \"$0\" \"$@\"", *command]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)


GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
READ_ONLY = "mount -t tmpfs -o ro tmpfs '{0}'"
DANGLING_THEN_READ_ONLY = ("mount -t tmpfs tmpfs '{0}' && ln -s /nowhere/model.gguf '{0}/" + GGUF_NAME + "' && "
                           "mount -o remount,ro '{0}'")


@pytest.mark.parametrize(("setup", "reason"), [
    (READ_ONLY, r"its folder '{}' is on a read-only file system"),
    (DANGLING_THEN_READ_ONLY, r"its folder '{}' is on a read-only file system"),
], ids=["an empty read-only folder", "a read-only folder holding a dangling link"])
def test_the_presets_link_on_a_read_only_disk_is_one_line(setup, reason, tmp_path):
    """Item 3: `OSError: [Errno 30] Read-only file system` in a traceback, exit 1. The
    read-only disk is a tmpfs mounted read only (root writes through chmod)."""
    models = tmp_path / "models"
    models.mkdir()
    result = linked_preset(tmp_path, models, setup.format(models))
    lines = result.stderr.strip().splitlines()
    assert (result.returncode, len(lines)) == (2, 1), result.stderr
    assert re.fullmatch(rf"error: CONFIG_MODEL_PATH='{re.escape(str(models / GGUF_NAME))}' cannot be made the link "
                        rf"to .*: {reason.format(re.escape(str(models)))}: point CONFIG_MODEL_PATH at a writable place",
                        lines[0]), lines[0]


@pytest.mark.parametrize("kind", ["a regular file", "a symbolic-link loop"])
def test_the_presets_link_under_a_file_or_a_loop_is_one_line(kind, tmp_path):
    """Item 3: `FileExistsError` in a traceback, exit 1, when the models folder is a file,
    or a link to itself; nothing of the user's is changed."""
    models = tmp_path / "models"
    if kind == "a regular file":
        models.write_text("the user's own file")
        reason = rf"'{re.escape(str(models))}' is not a folder: move it away"
    else:
        models.symlink_to(models)
        reason = rf"'{re.escape(str(models))}' is a symbolic link that loops or leads nowhere: remove it"
    result = linked_preset(tmp_path, models)
    lines = result.stderr.strip().splitlines()
    assert (result.returncode, len(lines)) == (2, 1), result.stderr
    assert re.fullmatch(rf"error: CONFIG_MODEL_PATH='{re.escape(str(models / GGUF_NAME))}' cannot be made the link "
                        rf"to .*: {reason}, or point CONFIG_MODEL_PATH elsewhere", lines[0]), lines[0]
    assert models.is_symlink() or models.read_text() == "the user's own file"


# -- item 4: check-config reads the model's header; C1 controls; show after deleted rows -----------

def loop(scene: Scene) -> Path:
    (scene.work / "loop.gguf").symlink_to(scene.work / "loop.gguf")
    return scene.work / "loop.gguf"


def bare_folder(scene: Scene) -> Path:
    (scene.work / "empty_model").mkdir()
    (scene.work / "empty_model" / "README.md").write_text("weights to come")
    return scene.work / "empty_model"


MODEL_PATHS = [
    ("a zero-byte GGUF", lambda s: planted(s, b"", "zero.gguf"),
     r"CONFIG_MODEL_PATH='.*zero\.gguf': the gguf package cannot read it as a GGUF file \(.*\)"),
    ("a GGUF of garbage", lambda s: planted(s, b"GGUF" + bytes(range(256)) * 4, "garbage.gguf"),
     r"CONFIG_MODEL_PATH='.*garbage\.gguf': the gguf package cannot read it as a GGUF file \(.*\)"),
    ("a truncated GGUF", lambda s: planted(s, damaged_gguf(s).read_bytes()[:5000], "truncated.gguf"),
     r"CONFIG_MODEL_PATH='.*truncated\.gguf': the gguf package cannot read it as a GGUF file \(.*\)"),
    ("a file that is no GGUF", lambda s: planted(s, b"weights", "model.bin"),
     r"CONFIG_MODEL_PATH='.*model\.bin' is a file but no GGUF \(not named \*\.gguf, no GGUF magic\): .*"),
    ("a folder without a model", bare_folder,
     r"CONFIG_MODEL_PATH='.*empty_model' is a folder without a model: it holds none of config\.json, .*"),
    ("a dangling link", lambda s: linked(s, s.work / "gone.gguf", "model.gguf"),
     r"CONFIG_MODEL_PATH='.*model\.gguf' is a symbolic link to '.*gone\.gguf', where nothing stands"),
    ("a symbolic-link loop", loop, r"CONFIG_MODEL_PATH='.*loop\.gguf' is a symbolic-link loop: .*"),
]


@pytest.mark.parametrize(("name", "model", "pattern"), MODEL_PATHS, ids=[m[0] for m in MODEL_PATHS])
def test_check_config_reads_the_models_header(name, model, pattern, tmp_path, shared, tiny_model_dir, uninterrupted,
                                              capsys):
    """Item 4: check-config accepted each (build-clusters refused them later; the loop ended
    in `error: RuntimeError: Symlink loop`, exit 1)."""
    del name
    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted, lambda strategy: uninterrupted)
    refused_before_any_write(scene, scene.command("check-config", MODEL_PATH=f'"{model(scene)}"'), pattern, capsys)


def test_a_c1_control_character_in_the_instruction_is_refused(tmp_path, shared, tiny_model_dir, uninterrupted, capsys):
    """Item 4: U+0080 to U+009F passed the instruction's control-character check."""
    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted, lambda strategy: uninterrupted)
    for control in ("\u0085", "\u0080", "\u009f"):
        argv = scene.command("check-config", COMPARE_SIMPLE="y", COMPARE_INSTRUCTION=f'"Answer{control} briefly."')
        refused_before_any_write(scene, argv, r"CONFIG_COMPARE_INSTRUCTION must be at most 2000 characters, with no "
                                              r"control character", capsys)


def test_show_counts_the_runs_spending_after_deleted_answers(tmp_path, shared, tiny_model_dir, uninterrupted, capsys):
    """Item 4: the summary said "metric calls 0 fresh answers" once the answer table's rows
    were deleted; the run spent them all the same."""
    scene = Scene(tmp_path, shared, tiny_model_dir, uninterrupted, lambda strategy: uninterrupted)
    spent = answers_stored(uninterrupted)
    argv = scene.edit_archive("DELETE FROM evaluations", command=("show",))
    capsys.readouterr()
    assert main(argv) == 0, capsys.readouterr().err
    assert re.search(rf"(?m)^metric calls  {spent} fresh answers;", capsys.readouterr().out)
    assert answers_stored(scene.out) == 0 < spent


def test_show_front_says_the_held_out_results_are_gone(tmp_path, with_tools, shared, tiny_model_dir, capsys):
    """Item 4: with the held-out check's results deleted, `show --front` printed the front
    without its held-out columns, as if no check had run."""
    work = Path(shutil.copytree(with_tools, tmp_path / "run"))
    with closing(sqlite3.connect(work / "out" / "run.sqlite")) as db, db:
        assert db.execute("DELETE FROM check_results WHERE split = 'heldout'").rowcount > 0
    config = write_config(work, shared, tiny_model_dir, **WITH_TOOLS)
    before = every_file(work)
    capsys.readouterr()
    assert main(["show", "--config", str(config), "--front"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(r"error: '.*run\.sqlite' lost the held-out check's results \(its table "
                                            r"check_results holds 0 of the \d+ held-out rows the check recorded\): "
                                            r"rows were deleted; rerun evolve with this config, which checks again "
                                            r"from the answers it holds", lines[0]), lines
    assert every_file(work) == before

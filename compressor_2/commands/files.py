"""Which file plays which role for a command, and who may write it: the one table.

`Files.of(config, options)` is made once per command (the CLI makes it from the config and
the command line, and hands it to the command), and lists every file the command reads or
writes, each with its role and the option that names it (an `Entry`):

- inputs: the config itself (`--config`), the training and held-out data, the prompt
  template, the model's files (a GGUF file, or a directory's weights, tokenizer and
  configs), the cluster descriptions, the initial deltas and their sidecar, and the
  command's own input options (`--deltas`, `--data`);
- cluster artifacts: what a cluster build writes in CONFIG_CLUSTER_DIR under names of its
  own (`artifacts`, the paths the build is handed);
- cluster outputs: what a build writes at paths the config names (the descriptions, the
  all-zero initial deltas and their sidecar), only where clusters/builder/written.py says it may;
- run files: the names `evolve` writes in a run directory (`owned_files`), protected in
  CONFIG_OUTPUT_DIR and in any directory that holds a run;
- a command's outputs (`evaluate --out`, `generate-processor --out`, export's files,
  report.html), each passed through `check_output` before it is written.

Making the table refuses an input that is a file a cluster build writes in another role (the
cluster map named as the descriptions was read as JSON, and a build would have written
the descriptions over it). After that, every write passes one of its checks
(`check_output_dir`, `check_output`, `check_cluster_outputs`), which refuse, in one line
naming the option and the file, a write over an input, a run's file or a cluster artifact,
before any work: `evaluate --out` once wrote its records over the held-out questions.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from compressor_2.clusters.clusterset import ArtifactPaths
from compressor_2.clusters.builder import builds, why_not_writable, written_here
from compressor_2.common import ConfigError, file_identity, file_kind, why_unwritable
from compressor_2.config import Config
from compressor_2.deltas import sidecar_path
from compressor_2.model import model_files

SIDECAR = "the sidecar of CONFIG_INITIAL_DELTAS_PATH"


class FileRole(Enum):
    INPUT = "input"
    CLUSTER_ARTIFACT = "cluster artifact"
    CLUSTER_OUTPUT = "cluster output"
    RUN_FILE = "run file"


@dataclass(frozen=True)
class Entry:
    option: str  # what names it: "CONFIG_HOLDOUT_DATA", "--config", "evaluate --deltas"
    path: Path
    role: FileRole
    what: str  # how a refusal names it
    command_line: bool = False  # a command's own option (`--deltas`, `--data`), not the config

    @property
    def shown(self) -> str:
        """The option with the path, as a refusal names them."""
        return f"{self.option}='{self.path}'" if self.option.startswith("CONFIG_") else f"{self.option} '{self.path}'"


@dataclass(frozen=True)
class Files:
    """The table of one command (see the module's docstring)."""

    config: Config
    artifacts: ArtifactPaths  # the paths the cluster build is handed
    entries: tuple[Entry, ...]  # the inputs and the cluster artifacts, whatever is on disk

    @classmethod
    def of(cls, config: Config, options: Mapping[str, Path | None] | None = None) -> Files:
        """The table for `config` and the command's input `options` (by how the user named
        them, e.g. "evaluate --deltas"); refuses an input a cluster build writes in another
        role."""
        artifacts = ArtifactPaths.from_config(config)
        own = tuple(Entry("CONFIG_CLUSTER_DIR", p, FileRole.CLUSTER_ARTIFACT,
                          f"a cluster artifact in CONFIG_CLUSTER_DIR ({p.name})") for p in artifacts.own_files())
        files = cls(config, artifacts, (*_inputs(config, options or {}), *own))
        files._refuse_build_outputs_as_inputs()
        return files

    def of_role(self, role: FileRole) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if e.role is role)

    @property
    def cluster_outputs(self) -> tuple[Entry, ...]:
        """What a build writes at the paths the config names, while each is new or what a
        build wrote (a file of the user's there is an input the build leaves alone)."""
        initial = self.config.initial_deltas_path
        return tuple(Entry(option, path, FileRole.CLUSTER_OUTPUT, what) for option, path, what, sidecar in (
            ("CONFIG_CLUSTER_DESCRIPTIONS_PATH", self.config.cluster_descriptions_path,
             "the file of CONFIG_CLUSTER_DESCRIPTIONS_PATH", False),
            ("CONFIG_INITIAL_DELTAS_PATH", initial, "the file of CONFIG_INITIAL_DELTAS_PATH", False),
            (SIDECAR, sidecar_path(initial), SIDECAR, True)) if builds(self.artifacts, path, sidecar))

    @functools.cached_property
    def run_files(self) -> tuple[Entry, ...]:
        """What a run writes in CONFIG_OUTPUT_DIR (asked only by the commands that write)."""
        out = self.config.output_dir
        return tuple(Entry("CONFIG_OUTPUT_DIR", out / name, FileRole.RUN_FILE, f"a file of the run in '{out}'")
                     for name in sorted(owned_files()))

    def protected(self, out: Path, option: str, command_line: bool = True) -> Entry | None:
        """The input or cluster artifact (other than the one `option` names itself) that a
        write to `out` would replace, the command's own input options among them when
        `command_line`; None for a symbolic link, which a write replaces rather than writes
        through (and which `check_output` refuses)."""
        if out.is_symlink():
            return None
        target = file_identity(out)
        return next((e for e in self.entries if e.option != option and (command_line or not e.command_line)
                     and file_identity(e.path) == target), None)

    def check_output(self, out: Path, option: str, kind: str = "file", example: str = "", run_file: bool = False,
                     command_line: bool = True) -> None:
        """Refuses, in one line naming `option` (how the user named `out`, e.g. `evaluate
        --out`), a file a command is about to write when the write would destroy something:
        anything that is neither a new path nor a regular file (a directory, a symbolic link,
        a FIFO, a device), an input, a cluster artifact, or a file a run owns (unless
        `run_file`: the command writes that run file itself). `example`: a name to suggest;
        `command_line`: the command's own input options are inputs here too."""
        where = f"{option} '{out}'"
        try:
            mode = os.lstat(out).st_mode
        except (FileNotFoundError, NotADirectoryError):
            mode = None  # a new path (or one under a file, which `why_unwritable` names below)
        except OSError as exc:
            raise ConfigError(f"{where} cannot be examined ({exc.strerror})") from None
        if mode is not None and stat.S_ISDIR(mode):
            raise ConfigError(f"{where} is a directory: name the {kind} to write")
        if mode is not None and not stat.S_ISREG(mode):
            raise ConfigError(f"{where} is {file_kind(mode)}, not a regular file: a write would replace it; name a new "
                              f"{kind} or a regular one")
        if (entry := self.protected(out, option, command_line)) is not None:
            raise ConfigError(f"{where} is {entry.what}: choose another name")
        if not run_file and (run := self.run_owning(out)):
            raise ConfigError(f"{where} is a file of the run in '{run}': choose another name"
                              f"{', e.g. ' + example if example else ''}")
        if reason := why_unwritable(out.parent):
            raise ConfigError(f"{where}: its directory {reason}")

    def check_output_dir(self, run: bool = False) -> None:
        """CONFIG_OUTPUT_DIR must be a directory this process can write, holding each file a
        run writes there as the kind it writes (a regular file; `reflector_prompts/` a
        directory), and that is found out here, before any work: the first save would
        otherwise fail after a generation's, and a FIFO for run.lock held `evolve` for ever.
        `run`: the command is the run, which writes every one of those files: none may be an
        input (another command may read the run's deltas_best.json, say, as its input)."""
        from compressor_2.reflector import PROMPT_DIR
        from compressor_2.resume import RUN_LOCK_FILE, check_lock_file

        out = self.config.output_dir
        if reason := why_unwritable(out):
            raise ConfigError(f"CONFIG_OUTPUT_DIR='{out}' {reason}")
        check_lock_file(out / RUN_LOCK_FILE)
        for path in [e.path for e in self.run_files if e.path.name != RUN_LOCK_FILE] + [out / PROMPT_DIR]:
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                continue
            directory = path.name == PROMPT_DIR
            if not (stat.S_ISDIR(mode) if directory else stat.S_ISREG(mode)):
                kind = "a directory" if directory else "a regular file"
                raise ConfigError(f"'{path}' is {file_kind(mode)}, not {kind}: a run writes it; move it away")
            if run and (entry := self.protected(path, "CONFIG_OUTPUT_DIR")) is not None:
                raise ConfigError(f"CONFIG_OUTPUT_DIR's {path.name} '{path}' is {entry.what}: a run writes it; choose "
                                  "another CONFIG_OUTPUT_DIR, or move the input away")

    def check_cluster_outputs(self) -> None:
        """What a cluster build may write outside CONFIG_CLUSTER_DIR's own artifacts, checked
        by every command that builds clusters before it does: the descriptions (rewritten by
        every rebuild) and the all-zero initial deltas with their sidecar (written when
        absent, or over the file a build wrote). Each never over an input in another role or
        a run's file, and only at a new path or over what a build of the same cluster
        directory wrote there (clusters/builder/written.py), never through a symbolic link."""
        paths, initial = self.artifacts, self.config.initial_deltas_path
        descriptions = self.config.cluster_descriptions_path
        if run := self.run_owning(paths.descriptions):
            raise ConfigError(f"CONFIG_CLUSTER_DESCRIPTIONS_PATH='{descriptions}' is a file of the run in '{run}': a "
                              "cluster build would write over it; choose another path")
        written = [("CONFIG_CLUSTER_DESCRIPTIONS_PATH", descriptions, False)]
        if not initial.exists() or written_here(paths, paths.initial_deltas):
            # Written when absent (a dangling link included) or the build's own; a file the user
            # wrote there, or links to, is an input the build leaves alone.
            written += [("CONFIG_INITIAL_DELTAS_PATH", initial, False), (SIDECAR, sidecar_path(initial), True)]
        for option, path, sidecar in written:
            # A deltas option may name the initial deltas (an option naming what a build writes
            # in another role was refused when the table was made).
            if (entry := self.protected(path, option, command_line=False)) is not None:
                raise ConfigError(f"{option}='{path}' is {entry.what}: a cluster build would write over it; choose "
                                  "another path")
            if reason := why_not_writable(paths, path, sidecar):
                raise ConfigError(f"{option}='{path}' {reason}")
            self.check_output(path, option, kind="JSON file", command_line=False)

    def run_owning(self, out: Path) -> Path | None:
        """The run directory `out` is a file of (its own files and its prompt log), or None."""
        from compressor_2.reflector import PROMPT_DIR

        if out.name in owned_files() and self.is_run_directory(out.parent):
            return out.parent
        if out.parent.name == PROMPT_DIR and self.is_run_directory(out.parent.parent):
            return out.parent.parent
        return None

    def is_run_directory(self, directory: Path) -> bool:
        """CONFIG_OUTPUT_DIR, or any directory that holds a run: once its run.lock was
        removed, another run's archive was written over by `evaluate --out`. What marks one,
        whether or not its lock is still there: its lock file, its archive, or the state file
        of a run from before the archive."""
        from compressor_2.archive import ARCHIVE_FILE
        from compressor_2.resume import RUN_LOCK_FILE

        return directory.resolve() == self.config.output_dir.resolve() or any(
            os.path.lexists(directory / name) for name in (RUN_LOCK_FILE, ARCHIVE_FILE, "evolution_state.json"))

    def _refuse_build_outputs_as_inputs(self) -> None:
        """Refuses, in one line naming the option and the file, an input that is a file a
        cluster build writes in another role: its own artifacts in CONFIG_CLUSTER_DIR, and
        the descriptions, the initial deltas and their sidecar while they are new or what a
        build wrote (a file of the user's at one of those paths is what `why_not_writable`
        names). The descriptions and the initial deltas are the build's in their own role
        only; a deltas option may name the initial deltas."""
        own, outputs = self.of_role(FileRole.CLUSTER_ARTIFACT), self.cluster_outputs
        descriptions = tuple(e for e in outputs if e.option == "CONFIG_CLUSTER_DESCRIPTIONS_PATH")
        for entry in self.of_role(FileRole.INPUT):
            if entry.option in ("CONFIG_CLUSTER_DESCRIPTIONS_PATH", "CONFIG_INITIAL_DELTAS_PATH"):
                refused = own
            elif entry.option == SIDECAR:
                continue
            else:
                refused = (*own, *descriptions, *(() if entry.option.endswith("--deltas") else outputs))
            target = file_identity(entry.path)
            if (role := next((e for e in refused if file_identity(e.path) == target), None)) is not None:
                raise ConfigError(f"{entry.shown} is {role.what}, which a cluster build writes: name another file")


def _inputs(config: Config, options: Mapping[str, Path | None]) -> tuple[Entry, ...]:
    """The files the config and the command's `options` name as inputs, by what names them."""
    named: list[tuple[str, Path | None, str]] = [
        ("--config", config.source, "the config file (--config)"),
        ("CONFIG_FINANCEBENCH_JSONL_PATH", config.financebench_jsonl_path, ""),
        ("CONFIG_HOLDOUT_DATA", config.holdout_data, ""),
        ("CONFIG_PROMPT_TEMPLATE_PATH", config.prompt_template_path, ""),
        ("CONFIG_MODEL_PATH", Path(config.model_path), ""),
        ("CONFIG_CLUSTER_DESCRIPTIONS_PATH", config.cluster_descriptions_path, ""),
        ("CONFIG_INITIAL_DELTAS_PATH", config.initial_deltas_path, ""),
        (SIDECAR, sidecar_path(config.initial_deltas_path),
         "the cluster-map sidecar of CONFIG_INITIAL_DELTAS_PATH"),
        # A GGUF file is named by the path itself (above); a directory's files one by one.
        *(("CONFIG_MODEL_PATH", path, f"a file of the input CONFIG_MODEL_PATH ({path.name})")
          for path in model_files(config.model_path)),
    ]
    return (*(Entry(option, path, FileRole.INPUT, what or f"the input {option}") for option, path, what in named
              if path is not None),
            *(Entry(option, path, FileRole.INPUT, f"its own input {option.split()[-1]}", command_line=True)
              for option, path in options.items() if path is not None))


def owned_files() -> frozenset[str]:
    """The names `evolve` writes in its output directory, whatever the strategy: other
    commands must not write over them. A strategy declares its own once (`FILES`, which its
    state format is made with), so a new one cannot be forgotten here."""
    from compressor_2.archive import ARCHIVE_FILE
    from compressor_2.engines import LOG_NAME
    from compressor_2.outputs import FITNESS_PLOT, FRONT_PLOT, LENGTHS_PLOT, REPORT_FILE, TREE_FILE, TREE_PLOT
    from compressor_2.resume import HISTORY_FILE, RUN_LOCK_FILE
    from compressor_2.run import DELTAS_BEST, PROCESSOR_BEST
    from compressor_2.strategies import load_strategy, strategy_names

    shared = {
        ARCHIVE_FILE, f"{ARCHIVE_FILE}-wal", f"{ARCHIVE_FILE}-shm", f"{ARCHIVE_FILE}-journal", RUN_LOCK_FILE,
        HISTORY_FILE, TREE_FILE, TREE_PLOT, FITNESS_PLOT, LENGTHS_PLOT, FRONT_PLOT, REPORT_FILE, DELTAS_BEST,
        PROCESSOR_BEST, sidecar_path(Path(DELTAS_BEST)).name, LOG_NAME,
    }
    return frozenset(shared.union(*(load_strategy(name).FILES.names() for name in strategy_names())))

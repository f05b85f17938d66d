"""What a run directory holds, and where commands may write: the files `evolve` owns (the
shared services' and every strategy's declared `OUTPUT_FILES`, and the reflector's prompt
log), the check that CONFIG_OUTPUT_DIR can be written before any work, and
`check_output_file`, the one guard every command passes a file it is about to write
through."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from compressor_2.archive import ARCHIVE_FILE
from compressor_2.clusters.clusterset import ArtifactPaths
from compressor_2.clusters.written import check_inputs, why_not_writable, written_here
from compressor_2.common import ConfigError, file_identity, file_kind, why_unwritable
from compressor_2.config import Config
from compressor_2.deltas import fingerprint_path
from compressor_2.engines import LOG_NAME
from compressor_2.outputs import FITNESS_PLOT, FRONT_PLOT, LENGTHS_PLOT, REPORT_FILE, TREE_FILE, TREE_PLOT
from compressor_2.reflector import PROMPT_DIR
from compressor_2.resume import HISTORY_FILE, LOCK_FILE, check_lock_file
from compressor_2.run import DELTAS_BEST, PROCESSOR_BEST
from compressor_2.strategies import load_strategy, strategy_names


def check_output_dir(out: Path) -> None:
    """CONFIG_OUTPUT_DIR must be a directory this process can write, holding each file a run
    writes there as the kind it writes (a regular file; `reflector_prompts/` a directory),
    and that is found out here, before any work: the first save would otherwise fail after
    a generation's, and a FIFO for run.lock held `evolve` for ever."""
    if reason := why_unwritable(out):
        raise ConfigError(f"CONFIG_OUTPUT_DIR='{out}' {reason}")
    check_lock_file(out / LOCK_FILE)
    for name in sorted(owned_files() - {LOCK_FILE}) + [PROMPT_DIR]:
        try:
            mode = os.lstat(out / name).st_mode
        except FileNotFoundError:
            continue
        kind = "a directory" if name == PROMPT_DIR else "a regular file"
        if not (stat.S_ISDIR(mode) if name == PROMPT_DIR else stat.S_ISREG(mode)):
            raise ConfigError(f"'{out / name}' is {file_kind(mode)}, not {kind}: a run writes it; move it away")


def owned_files() -> frozenset[str]:
    """The names `evolve` writes in its output directory, whatever the strategy: other
    commands must not write over them. A strategy declares its own (`OUTPUT_FILES`), so a
    new one cannot be forgotten here."""
    shared = {
        ARCHIVE_FILE, f"{ARCHIVE_FILE}-wal", f"{ARCHIVE_FILE}-shm", f"{ARCHIVE_FILE}-journal", LOCK_FILE,
        HISTORY_FILE, TREE_FILE, TREE_PLOT, FITNESS_PLOT, LENGTHS_PLOT, FRONT_PLOT, REPORT_FILE, DELTAS_BEST,
        PROCESSOR_BEST, fingerprint_path(Path(DELTAS_BEST)).name, LOG_NAME,
    }
    return frozenset(shared.union(*(load_strategy(name).OUTPUT_FILES for name in strategy_names())))


# What marks a directory as a run's, whether or not its lock is still there: its lock file,
# its archive, or the state file of a run from before the archive.
RUN_MARKERS = (LOCK_FILE, ARCHIVE_FILE, "evolution_state.json")


def is_run_directory(directory: Path, config: Config) -> bool:
    """CONFIG_OUTPUT_DIR, or any directory that holds a run: once its run.lock was removed,
    another run's archive was written over by `evaluate --out`."""
    return directory.resolve() == config.output_dir.resolve() or any(
        os.path.lexists(directory / name) for name in RUN_MARKERS)


def check_output_file(out: Path, option: str, config: Config, inputs: Mapping[str, Path | None] | None = None,
                      kind: str = "file", example: str = "", own: Sequence[Path] = ()) -> None:
    """Refuses, in one line naming `option` (how the user named `out`, e.g. `evaluate --out`),
    a file a command is about to write when the write would destroy something: anything
    that is neither a new path nor a regular file (a directory, a symbolic link, a FIFO, a
    device), a file a run owns, a cluster artifact, or one of the command's `inputs` (by the
    option that names them) or of the config's input files. `own`: files the command itself
    maintains (a cluster build's artifacts), which it may rewrite; `example`: a name to
    suggest instead."""
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
    protected = {**_config_inputs(config), **{f"its own input {name}": path for name, path in (inputs or {}).items()}}
    target, mine = file_identity(out), {file_identity(p) for p in own}
    for what, path in protected.items():
        if path is not None and file_identity(path) == target and target not in mine:
            raise ConfigError(f"{where} is {what}: choose another name")
    if run := _run_owning(out, config):
        raise ConfigError(f"{where} is a file of the run in '{run}': choose another name"
                          f"{', e.g. ' + example if example else ''}")
    if reason := why_unwritable(out.parent):
        raise ConfigError(f"{where}: its directory {reason}")


def check_cluster_outputs(config: Config) -> None:
    """What a cluster build may write outside CONFIG_CLUSTER_DIR's own artifacts, checked by
    every command that builds clusters before it does: the descriptions (rewritten by every
    rebuild) and the all-zero initial deltas with their sidecar (written when absent, or
    over the file a build wrote). Each only at a new path or over what a build of the same
    cluster directory wrote there (clusters/written.py), never through a symbolic link, never
    over a run's file or an input."""
    check_inputs(config)
    paths = ArtifactPaths.from_config(config)
    if run := _run_owning(paths.descriptions, config):
        raise ConfigError(f"CONFIG_CLUSTER_DESCRIPTIONS_PATH='{paths.descriptions}' is a file of the run in '{run}': "
                          "a cluster build would write over it; choose another path")
    initial = config.initial_deltas_path
    if file_identity(config.cluster_descriptions_path) in (file_identity(initial),
                                                           file_identity(fingerprint_path(initial))):
        raise ConfigError(f"CONFIG_CLUSTER_DESCRIPTIONS_PATH='{config.cluster_descriptions_path}' is the file of "
                          "CONFIG_INITIAL_DELTAS_PATH (or its sidecar): a cluster build would write over it; choose "
                          "another path")
    written = [("CONFIG_CLUSTER_DESCRIPTIONS_PATH", config.cluster_descriptions_path, False)]
    if not initial.exists() or written_here(paths, paths.initial_deltas):
        # Written when absent (a dangling link included) or the build's own; a file the user
        # wrote there, or links to, is an input the build leaves alone.
        written += [("CONFIG_INITIAL_DELTAS_PATH", initial, False),
                    ("the sidecar of CONFIG_INITIAL_DELTAS_PATH", fingerprint_path(initial), True)]
    for option, path, sidecar in written:
        if reason := why_not_writable(paths, path, sidecar):
            raise ConfigError(f"{option}='{path}' {reason}")
        # Each may be written over only as itself: the descriptions never over the initial deltas.
        check_output_file(path, option, config, kind="JSON file", own=(path,))


def _run_owning(out: Path, config: Config) -> Path | None:
    """The run directory `out` is a file of (its own files and its prompt log), or None."""
    if out.name in owned_files() and is_run_directory(out.parent, config):
        return out.parent
    if out.parent.name == PROMPT_DIR and is_run_directory(out.parent.parent, config):
        return out.parent.parent
    return None


def _config_inputs(config: Config) -> dict[str, Path | None]:
    """The files the config names as inputs, and the cluster artifacts, by what names them."""
    paths = ArtifactPaths.from_config(config)
    artifacts = {f"a cluster artifact in CONFIG_CLUSTER_DIR ({p.name})": p for p in (*paths.built(), *paths.own_files())}
    return {
        "the config file (--config)": config.source,
        "the input CONFIG_FINANCEBENCH_JSONL_PATH": config.financebench_jsonl_path,
        "the input CONFIG_PROMPT_TEMPLATE_PATH": config.prompt_template_path,
        "the input CONFIG_INITIAL_DELTAS_PATH": config.initial_deltas_path,
        "the fingerprint sidecar of CONFIG_INITIAL_DELTAS_PATH": fingerprint_path(config.initial_deltas_path),
        **artifacts,
    }

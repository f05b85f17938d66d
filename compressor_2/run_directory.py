"""What a run directory holds, and where other commands may not write: the files `evolve`
owns (the shared services' and every strategy's declared `OUTPUT_FILES`), and the check
that CONFIG_OUTPUT_DIR can be written before any work."""

from __future__ import annotations

from pathlib import Path

from compressor_2.archive.database import ARCHIVE_FILE
from compressor_2.atomic import why_unwritable
from compressor_2.config import Config
from compressor_2.engines.sglang_server import LOG_NAME
from compressor_2.errors import ConfigError
from compressor_2.run.best import DELTAS_BEST, PROCESSOR_BEST
from compressor_2.run.history import HISTORY_FILE
from compressor_2.run.lock import LOCK_FILE
from compressor_2.run.plots import FITNESS_PLOT, FRONT_PLOT, LENGTHS_PLOT
from compressor_2.run.report import REPORT_FILE
from compressor_2.run.tree import TREE_FILE
from compressor_2.deltas import fingerprint_path
from compressor_2.strategies import load_strategy, strategy_names


def check_output_dir(out: Path) -> None:
    """CONFIG_OUTPUT_DIR must be a directory this process can write, and that is found out
    here, before any work: the first save would otherwise fail after a generation's."""
    if reason := why_unwritable(out):
        raise ConfigError(f"CONFIG_OUTPUT_DIR='{out}' {reason}")


def owned_files() -> frozenset[str]:
    """The names `evolve` writes in its output directory, whatever the strategy: other
    commands must not write over them. A strategy declares its own (`OUTPUT_FILES`), so a
    new one cannot be forgotten here."""
    shared = {
        ARCHIVE_FILE, f"{ARCHIVE_FILE}-wal", f"{ARCHIVE_FILE}-shm", f"{ARCHIVE_FILE}-journal", LOCK_FILE,
        HISTORY_FILE, TREE_FILE, FITNESS_PLOT, LENGTHS_PLOT, FRONT_PLOT, REPORT_FILE, DELTAS_BEST, PROCESSOR_BEST,
        fingerprint_path(Path(DELTAS_BEST)).name, LOG_NAME,
    }
    return frozenset(shared.union(*(load_strategy(name).OUTPUT_FILES for name in strategy_names())))


def is_run_directory(directory: Path, config: Config) -> bool:
    """CONFIG_OUTPUT_DIR, or any directory an `evolve` has locked."""
    return directory.resolve() == config.output_dir.resolve() or (directory / LOCK_FILE).exists()

"""The outputs every strategy shares, drawn from the run archive: front.png (the
tokens-versus-correctness front) and report.html. `evolve` refreshes them between steps
and when the run ends; `report` writes the page for any run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from compressor_2.archive.database import RunArchive
from compressor_2.data.example import Example
from compressor_2.run.checks import standing
from compressor_2.run.plots import FRONT_PLOT, plot_front
from compressor_2.run.report import write_report


def refresh_outputs(archive: RunArchive, out: Path, pool: Sequence[Example], heldout: Sequence[Example]) -> Path:
    """Draws front.png (once something is assessed) and writes report.html; returns the
    report's path."""
    now = standing(archive)
    if now.points:
        plot_front(now.points, now.baseline, now.best, out / FRONT_PLOT)
    return write_report(archive, out, pool, heldout, now)

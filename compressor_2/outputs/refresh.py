"""What a run shows, drawn from the run archive and its history: the evolution tree
(tree.json, evolution_tree.png), the fitness and lengths plots, a strategy's progress plot,
front.png (the tokens-versus-correctness front) and report.html. `report` writes the page
for any run.

Each drawing reads the whole archive, so its cost grows with the run. During a run they
are drawn on a clock (`Refresh`): at the end of a step once the run has worked
`1 / SHARE - 1` times as long as the last drawing took (FIRST_DRAWING before one was
measured), so drawing takes at most SHARE of the run's wall time whatever the archive's
size; and always when the run stops."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from compressor_2.archive import RunArchive
from compressor_2.data import Example
from compressor_2.outputs.plots import (
    FITNESS_PLOT,
    FRONT_PLOT,
    LENGTHS_PLOT,
    plot_archive,
    plot_fitness,
    plot_front,
    plot_lengths,
)
from compressor_2.outputs.report import write_report
from compressor_2.outputs.tree import TREE_FILE, TREE_PLOT, EvolutionTree
from compressor_2.findings import standing

SHARE = 0.01  # of a run's wall time, at most, spent drawing between steps
FIRST_DRAWING = 1.0  # seconds: a small run's drawing, until one is measured


def refresh_outputs(archive: RunArchive, out: Path, pool: Sequence[Example], heldout: Sequence[Example]) -> Path:
    """Draws front.png (once something is assessed) and writes report.html; returns the
    report's path."""
    now = standing(archive)
    if now.points:
        plot_front(now.points, now.baseline, now.best, out / FRONT_PLOT)
    return write_report(archive, out, pool, heldout, now)


def draw_run(archive: RunArchive, out: Path, history: Sequence[dict[str, Any]], progress_plot: str | None) -> None:
    """The tree from the archive, and the plots of `history` (one entry per step);
    `progress_plot` is the file of a strategy's best and percentiles against metric calls."""
    tree = EvolutionTree.from_archive(archive)
    tree.save(out / TREE_FILE)
    tree.render(out / TREE_PLOT)
    if history:
        plot_fitness(history, out / FITNESS_PLOT)
        plot_lengths(history, out / LENGTHS_PLOT)
        if progress_plot is not None:
            plot_archive(history, out / progress_plot)


class Refresh:
    """Everything a run shows, drawn between steps on a clock and whenever asked."""

    def __init__(self, archive: RunArchive, out: Path, pool: Sequence[Example], heldout: Sequence[Example],
                 progress_plot: str | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.archive, self.out, self.pool, self.heldout = archive, out, pool, heldout
        self.progress_plot = progress_plot
        self.clock = clock
        self.due = clock() + FIRST_DRAWING * (1 / SHARE - 1)
        self.seconds = 0.0  # spent drawing so far

    def after_step(self, history: Sequence[dict[str, Any]]) -> None:
        if self.clock() >= self.due:
            self.draw(history)

    def draw(self, history: Sequence[dict[str, Any]]) -> Path:
        """Draws everything now; returns the report's path."""
        started = self.clock()
        draw_run(self.archive, self.out, history, self.progress_plot)
        report = refresh_outputs(self.archive, self.out, self.pool, self.heldout)
        ended = self.clock()
        self.seconds += ended - started
        self.due = ended + (ended - started) * (1 / SHARE - 1)
        return report

"""The run's figures, rendered headless (Agg) and written atomically."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first

from compressor_2.atomic import atomic_write_bytes  # noqa: E402

FITNESS_PLOT = "fitness_vs_generation.png"
LENGTHS_PLOT = "evolution_lengths.png"


def save_figure(fig: Any, path: Path, dpi: int = 110) -> None:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def plot_fitness(history: Sequence[dict[str, Any]], path: Path) -> None:
    """Best and mean fitness of the population entering each generation, and the best ever."""
    gens = [h["generation"] for h in history]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(gens, [h["best_fitness"] for h in history], "o-", label="best")
    ax.plot(gens, [h["mean_fitness"] for h in history], "s-", label="mean")
    ax.plot(gens, [h["best_ever_fitness"] for h in history], ":", color="grey", label="best ever")
    ax.set_xlabel("generation (last point: the final population)")
    ax.set_ylabel("fitness")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def plot_lengths(history: Sequence[dict[str, Any]], path: Path) -> None:
    """Mean answer tokens of the population, and of its best individual, per generation."""
    gens = [h["generation"] for h in history]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(gens, [h["mean_tokens"] for h in history], "o-", label="population mean")
    ax.plot(gens, [h["best_mean_tokens"] for h in history], "s-", label="best individual")
    ax.set_xlabel("generation (last point: the final population)")
    ax.set_ylabel("mean answer tokens")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def plot_archive(snapshots: Sequence[dict[str, Any]], path: Path) -> None:
    """Seed 003's telemetry: the archive's best fitness and its p10 / p50 / p90 against the
    metric calls spent."""
    calls = [s["metric_calls"] for s in snapshots]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.fill_between(calls, [s["p10"] for s in snapshots], [s["p90"] for s in snapshots], alpha=0.2,
                    label="p10 .. p90")
    ax.plot(calls, [s["p50"] for s in snapshots], "s-", label="p50")
    ax.plot(calls, [s["best_fitness"] for s in snapshots], "o-", label="best")
    ax.set_xlabel("metric calls (fresh answers)")
    ax.set_ylabel("fitness of the archive's members")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)

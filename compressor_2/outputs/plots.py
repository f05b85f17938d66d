"""The run's figures, rendered headless (Agg) and written atomically."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first

from compressor_2.common import atomic_write_bytes  # noqa: E402
from compressor_2.findings import Point, pareto_front  # noqa: E402

FITNESS_PLOT = "fitness_vs_generation.png"
LENGTHS_PLOT = "evolution_lengths.png"
FRONT_PLOT = "front.png"


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
    """The archive strategy's telemetry: the archive's best fitness and its p10 / p50 / p90 against the
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


def plot_front(points: Sequence[Point], baseline: Point | None, best: Point | None, path: Path) -> None:
    """Every candidate's mean answer tokens against its correctness on the training pool,
    the non-dominated front as a line, and the unsteered baseline and the best marked."""
    front = pareto_front(points)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.scatter([p.tokens for p in points], [100 * p.correctness for p in points], s=12, color="#1f77b4",
               alpha=0.25, linewidths=0, label=f"candidates ({len(points)})")
    ax.plot([p.tokens for p in front], [100 * p.correctness for p in front], "o-", color="#1f77b4", markersize=4,
            label=f"front ({len(front)}: fewer tokens, at least as correct)")
    if baseline is not None:
        ax.scatter([baseline.tokens], [100 * baseline.correctness], marker="s", s=70, color="#7f7f7f",
                   edgecolors="black", zorder=3, label=f"unsteered baseline ({baseline.tokens:.1f} tokens)")
    if best is not None:
        ax.scatter([best.tokens], [100 * best.correctness], marker="*", s=220, color="#d62728", edgecolors="black",
                   zorder=4, label=f"best fitness #{best.id} ({best.tokens:.1f} tokens)")
    ax.set_xlabel("mean answer tokens on the training pool")
    ax.set_ylabel("correct answers (%)")
    ax.set_xlim(left=0)
    ax.set_ylim(top=100 * max(p.correctness for p in [*points, *filter(None, (baseline, best))]) + 2.5)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    # Fixed margins rather than tight_layout, which would cost as much as the drawing: the
    # front is redrawn after every step.
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.12, top=0.97)
    save_figure(fig, path)

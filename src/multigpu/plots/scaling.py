"""Scaling figures: the fitted alpha-beta cost model and speed-ups (12)."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
from matplotlib.figure import Figure


def plot_alpha_beta_fit(
    rows_by_world: Mapping[int, list[dict]], fits: Mapping[int, tuple[float, float]]
) -> Figure:
    """Measured all-reduce times (points) and the fitted α-β lines, one colour per
    world size, against the tensor size on log axes (12)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for k, (world_size, rows) in enumerate(sorted(rows_by_world.items())):
        colour = f"C{k}"
        sizes = [row["bytes"] for row in rows]
        ax.loglog(
            sizes,
            [1e3 * row["seconds"] for row in rows],
            "o",
            color=colour,
            label=f"{world_size} ranks, measured",
        )
        alpha, bandwidth = fits[world_size]
        steps = 2 * (world_size - 1)
        grid = [min(sizes) * (max(sizes) / min(sizes)) ** (i / 50) for i in range(51)]
        model = [
            1e3 * (steps * alpha + steps / world_size * size / bandwidth)
            for size in grid
        ]
        ax.loglog(
            grid,
            model,
            "-",
            color=colour,
            label=f"fit: α = {1e6 * alpha:.0f} µs, B = {bandwidth / 1e9:.2f} GB/s",
        )
    ax.set(xlabel="tensor bytes", ylabel="all-reduce ms", title="α-β fit")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_speedups(
    curves: Mapping[str, tuple[list[int], list[float]]], title: str | None = None
) -> Figure:
    """Speed-up against devices, one line per labelled curve, with the ideal
    speed-up (the diagonal) for reference (12)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    largest = max(max(sizes) for sizes, _ in curves.values())
    ax.plot([1, largest], [1, largest], ":", color="grey", label="ideal (N)")
    for label, (sizes, speedups) in curves.items():
        ax.plot(sizes, speedups, "o-", markersize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set(xlabel="devices", ylabel="speed-up over one device", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig

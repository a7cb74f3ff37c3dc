"""The rank grid of a 4-D job, and pipeline plans with their bubbles (19)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from multigpu.gpt4d.grid import Grid

__all__ = ["plot_grid", "plot_pipeline_plans"]

KIND_COLOURS = {"F": "#4c72b0", "B": "#dd8452", "I": "#c44e52", "W": "#55a868"}
IDLE_COLOUR = "#eeeeee"


def plot_grid(grid: Grid) -> Figure:
    """Every rank as a box, laid out by its coordinates: one panel per data-parallel
    replica, pipeline stages as columns, (cp, tp) as rows; the box names its rank
    and tp/cp coordinates (19)."""
    fig, axes = plt.subplots(
        1,
        grid.dp,
        figsize=(2.2 * grid.pp * grid.dp + 0.6, 0.7 * grid.cp * grid.tp + 1.2),
        squeeze=False,
    )
    for d, axis in enumerate(axes[0]):
        for rank in range(grid.world_size):
            c = grid.coords(rank)
            if c["dp"] != d:
                continue
            row = c["cp"] * grid.tp + c["tp"]
            colour = plt.cm.tab10(c["pp"] % 10)
            axis.add_patch(
                plt.Rectangle(
                    (c["pp"] + 0.05, -row - 0.9), 0.9, 0.8, color=colour, alpha=0.35
                )
            )
            axis.text(
                c["pp"] + 0.5,
                -row - 0.5,
                f"rank {rank}\ntp{c['tp']} cp{c['cp']}",
                ha="center",
                va="center",
                fontsize=8,
            )
        axis.set_xlim(0, grid.pp)
        axis.set_ylim(-grid.cp * grid.tp, 0)
        axis.set_xticks([p + 0.5 for p in range(grid.pp)])
        axis.set_xticklabels([f"stage {p}" for p in range(grid.pp)])
        axis.set_yticks([])
        axis.set_title(f"data-parallel replica {d}", fontsize=9)
    fig.suptitle(f"{grid.label()}: {grid.world_size} ranks", fontsize=10)
    fig.tight_layout()
    return fig


def plot_pipeline_plans(
    plans: Mapping[str, Sequence[tuple[int, int, str, int, int, int]]],
    bubbles: Mapping[str, float],
) -> Figure:
    """One rank-by-time chart per schedule from
    :func:`~multigpu.gpt4d.schedules.simulate_plan`'s blocks: F, B, I, W coloured,
    the micro-batch and stage written in each block, idle time grey (19)."""
    fig, axes = plt.subplots(
        len(plans), 1, figsize=(9, 1.1 * len(plans) + 0.6), squeeze=False
    )
    for axis, (name, blocks) in zip(axes[:, 0], plans.items()):
        ranks = sorted({b[0] for b in blocks})
        end = max(b[5] for b in blocks)
        for rank in ranks:
            axis.barh(rank, end, left=0, height=0.8, color=IDLE_COLOUR)
        for rank, stage, kind, mb, start, stop in blocks:
            axis.barh(
                rank,
                stop - start,
                left=start,
                height=0.8,
                color=KIND_COLOURS[kind],
                edgecolor="white",
            )
            axis.text(
                (start + stop) / 2,
                rank,
                f"{kind}{mb}\ns{stage}",
                ha="center",
                va="center",
                color="white",
                fontsize=6,
            )
        axis.set_yticks(ranks)
        axis.set_yticklabels([f"rank {r}" for r in ranks], fontsize=7)
        axis.invert_yaxis()
        axis.set_xlim(0, end)
        axis.set_title(f"{name}: bubble {bubbles[name]:.1%}", fontsize=8, loc="left")
    axes[-1, 0].set_xlabel("time (slots: F = I = W = 1, B = 2)")
    fig.tight_layout()
    return fig

"""FSDP2 in practice: an HSDP mesh, who all-gathers and reduce-scatters with whom,
and who all-reduces (14b)."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle

SHARD_COLOUR = "#e6842a"  # all-gather and reduce-scatter within a shard group
REPLICATE_COLOUR = "#3a923a"  # all-reduce across the replicas


def plot_hsdp_mesh(
    mesh: Sequence[Sequence[int]], names: Sequence[str] = ("replicate", "shard")
) -> Figure:
    """A 2-D mesh of ranks, ``mesh[i][j]`` the rank at replicate index i and shard
    index j (``DeviceMesh.mesh.tolist()``): each row a shard group (orange: its
    ranks all-gather the parameters and reduce-scatter the gradients), each column
    a replicate group (green: its ranks all-reduce the gradient shards); each rank
    holds shard j of every parameter. Patches and lines carry a gid ("rank r",
    "shard group i", "replicate group j") (14b)."""
    rows, columns = len(mesh), len(mesh[0])
    fig, ax = plt.subplots(figsize=(2.3 * columns + 2.6, 1.5 * rows + 1.2))
    for i, row in enumerate(mesh):
        y = -1.5 * i
        group = Rectangle(
            (-0.85, y - 0.55),
            2.2 * (columns - 1) + 1.7,
            1.1,
            fill=False,
            edgecolor=SHARD_COLOUR,
            linestyle="--",
            linewidth=2,
            gid=f"shard group {i}",
        )
        ax.add_patch(group)
        ax.text(
            2.2 * (columns - 1) + 1.0,
            y,
            f"{names[1]} group {list(row)}:\nall-gather,\nreduce-scatter",
            color=SHARD_COLOUR,
            va="center",
            fontsize="small",
        )
        for j, rank in enumerate(row):
            box = FancyBboxPatch(
                (2.2 * j - 0.7, y - 0.4),
                1.4,
                0.8,
                boxstyle="round,pad=0.02",
                facecolor="#f2f2f2",
                edgecolor="#555555",
                gid=f"rank {rank}",
            )
            ax.add_patch(box)
            ax.text(2.2 * j, y + 0.12, f"rank {rank}", ha="center", va="center")
            ax.text(
                2.2 * j,
                y - 0.2,
                f"{names[1]} {j} of each parameter",
                ha="center",
                va="center",
                fontsize="x-small",
            )
    for j in range(columns):
        ranks = [row[j] for row in mesh]
        (line,) = ax.plot(
            [2.2 * j, 2.2 * j],
            [-0.55, -1.5 * (rows - 1) + 0.55],
            color=REPLICATE_COLOUR,
            linewidth=3,
            gid=f"replicate group {j}",
        )
        ax.text(
            2.2 * j,
            -1.5 * (rows - 1) - 0.75,
            f"{names[0]} group {ranks}:\nall-reduce",
            color=REPLICATE_COLOUR,
            ha="center",
            va="top",
            fontsize="small",
        )
        line.set_zorder(0)
    ax.set_xlim(-1.1, 2.2 * (columns - 1) + 2.8)
    ax.set_ylim(-1.5 * (rows - 1) - 1.5, 0.8)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(
        f"HSDP on a {rows} x {columns} mesh ({names[0]} x {names[1]})",
        fontsize="medium",
    )
    fig.tight_layout()
    return fig

"""Pictures of tensor parallelism (15): what each rank holds.

- :func:`plot_column_row_cut`: an MLP's two weight matrices cut by rows and by
  columns, one lane per rank, with Megatron's f and g where the ranks meet;
- :func:`plot_sequence_parallel`: sequence parallelism's transitions around one
  tensor-parallel region (all-gather in, reduce-scatter out);
- :func:`plot_2d_mesh`: a (dp, tp) device mesh, its tensor-parallel rows and
  data-parallel columns.

Every shape a rank holds is a patch whose ``gid`` names it (``"fc1 rank 0"``), so
the tests read the picture's geometry back.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle

RANK_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red")
WHOLE = "0.75"  # grey: the same on every rank
HIDDEN, FFN, TOKENS = 1.0, 2.0, 0.8  # drawing units: widths and heights
LANE = 2.6  # the height of one rank's lane
SP_OPERATORS = {  # what each does in backward, and its names
    "all-gather": "backward:\nreduce-scatter\n\nin f's place;\nKorthikanti\net al.'s g",
    "reduce-scatter": "backward:\nall-gather\n\nin g's place;\nKorthikanti\net al.'s ḡ",
}


def _colour(rank: int) -> str:
    return RANK_COLOURS[rank % len(RANK_COLOURS)]


def _box(ax: Axes, x: float, y: float, w: float, h: float, gid: str, **style) -> None:
    """A rectangle named ``gid``: filled if ``style`` says so, else an outline."""
    style = {"facecolor": "none", "edgecolor": "black", "linewidth": 1.0} | style
    ax.add_patch(Rectangle((x, y), w, h, gid=gid, **style))


def _arrow(ax: Axes, x0: float, x1: float, y: float) -> None:
    ax.annotate("", (x1, y), (x0, y), arrowprops={"arrowstyle": "->", "lw": 1.2})


def _operator(
    ax: Axes, x: float, height: float, name: str, lines: str, width: float = 0.9
) -> None:
    """A box across every lane at ``x``: a collective the ranks run together."""
    ax.add_patch(
        FancyBboxPatch(
            (x - width / 2, 0.15),
            width,
            height - 0.3,
            boxstyle="round,pad=0.05",
            facecolor="lightyellow",
            edgecolor="black",
            gid=f"operator {name}",
        )
    )
    size = 16 if len(name) == 1 else 9
    ax.text(x, height / 2 + 0.25, name, ha="center", va="center", fontsize=size)
    ax.text(x, height / 2 - 0.35, lines, ha="center", va="top", fontsize=8)


def _lanes(ax: Axes, world_size: int, right: float) -> list[float]:
    """The bottom of each rank's lane (rank 0 on top), labelled on the left."""
    bottoms = [(world_size - 1 - rank) * LANE for rank in range(world_size)]
    for rank, bottom in enumerate(bottoms):
        ax.text(-0.3, bottom + LANE / 2, f"rank {rank}", ha="right", va="center")
        if rank:
            ax.axhline(bottom + LANE, color="0.85", lw=0.8, xmax=right, zorder=0)
    return bottoms


def _finish(fig: Figure, ax: Axes, width: float, height: float) -> Figure:
    ax.set_xlim(-1.4, width)
    ax.set_ylim(-0.9, height + 0.9)
    ax.set_axis_off()
    fig.tight_layout()
    return fig


def plot_column_row_cut(world_size: int = 2) -> Figure:
    """One lane per rank: the whole input X, then f, fc1's weight (ffn × hidden) of
    which the rank keeps ffn/n rows (column-parallel), its ffn/n hidden features,
    fc2's weight (hidden × ffn) of which it keeps ffn/n columns (row-parallel), its
    partial sum of the output, then g and the whole output Y (15)."""
    fig, ax = plt.subplots(figsize=(10, 1.6 + 1.5 * world_size))
    height = world_size * LANE
    x_in, x_f, x_fc1, x_h, x_fc2, x_z, x_g, x_out = (
        0,
        1.75,
        2.6,
        4.2,
        5.8,
        8.4,
        10.15,
        11,
    )
    headings = {
        x_in + HIDDEN / 2: "X: whole\non every rank",
        x_fc1 + HIDDEN / 2: "fc1 weight:\nits rows\n(column-parallel)",
        x_h + FFN / world_size / 2: f"GELU output:\nffn/{world_size}\nfeatures",
        x_fc2 + FFN / 2: "fc2 weight:\nits columns\n(row-parallel)",
        x_z + HIDDEN / 2: "its partial\nsum of Y",
        x_out + HIDDEN / 2: "Y: whole\non every rank",
    }
    for x, heading in headings.items():
        ax.text(x, height + 0.1, heading, ha="center", va="bottom", fontsize=9)
    for rank, bottom in enumerate(_lanes(ax, world_size, 0.95)):
        middle, colour = bottom + LANE / 2, _colour(rank)
        _box(ax, x_in, middle - TOKENS / 2, HIDDEN, TOKENS, f"X rank {rank}")
        ax.patches[-1].set_facecolor(WHOLE)
        # fc1's weight: rank r keeps rows [r·ffn/n, (r+1)·ffn/n), counted from the top
        top = middle + FFN / 2
        _box(ax, x_fc1, top - FFN, HIDDEN, FFN, f"fc1 outline rank {rank}")
        rows = FFN / world_size
        _box(ax, x_fc1, top - (rank + 1) * rows, HIDDEN, rows, f"fc1 rank {rank}")
        ax.patches[-1].set_facecolor(colour)
        hidden_width = FFN / world_size
        _box(ax, x_h, middle - TOKENS / 2, hidden_width, TOKENS, f"H rank {rank}")
        ax.patches[-1].set_facecolor(colour)
        # fc2's weight: rank r keeps columns [r·ffn/n, (r+1)·ffn/n)
        _box(ax, x_fc2, middle - HIDDEN / 2, FFN, HIDDEN, f"fc2 outline rank {rank}")
        left = x_fc2 + rank * FFN / world_size
        _box(
            ax, left, middle - HIDDEN / 2, FFN / world_size, HIDDEN, f"fc2 rank {rank}"
        )
        ax.patches[-1].set_facecolor(colour)
        _box(ax, x_z, middle - TOKENS / 2, HIDDEN, TOKENS, f"Z rank {rank}")
        ax.patches[-1].set(hatch="///", edgecolor=colour)
        _box(ax, x_out, middle - TOKENS / 2, HIDDEN, TOKENS, f"Y rank {rank}")
        ax.patches[-1].set_facecolor(WHOLE)
        for x0, x1 in (
            (x_in + HIDDEN, x_f - 0.45),
            (x_f + 0.45, x_fc1),
            (x_fc1 + HIDDEN, x_h),
            (x_h + FFN / world_size, x_fc2),
            (x_fc2 + FFN, x_z),
            (x_z + HIDDEN, x_g - 0.45),
            (x_g + 0.45, x_out),
        ):
            _arrow(ax, x0 + 0.05, x1 - 0.05, middle)
    _operator(ax, x_f, height, "f", "forward:\nidentity\n\nbackward:\nall-reduce")
    _operator(ax, x_g, height, "g", "forward:\nall-reduce\n\nbackward:\nidentity")
    ax.text(
        6.0,
        -0.5,
        "Between f and g the ranks never meet: fc1's rows give each rank its own "
        "hidden features, which are exactly what its columns of fc2 read.",
        ha="center",
        fontsize=9,
    )
    return _finish(fig, ax, 12.2, height)


def plot_sequence_parallel(world_size: int = 2) -> Figure:
    """One lane per rank: the (seq × hidden) activation around one tensor-parallel
    region (attention or MLP) under sequence parallelism: seq/n positions in the
    LayerNorm and dropout regions, the whole sequence after the all-gather (in f's
    place; Korthikanti et al.'s g), a partial sum before the reduce-scatter (in g's
    place; their ḡ), seq/n positions again after it (15)."""
    fig, ax = plt.subplots(figsize=(10, 1.6 + 1.5 * world_size))
    height = world_size * LANE
    seq, hidden = 1.8, 1.0  # the sequence runs down, the hidden features across
    stages = [
        (0.0, "sharded", "LayerNorm\n(sequence-\nsharded)"),
        (3.2, "gathered", "attention or MLP\ninput: whole\nsequence"),
        (5.6, "partial", "row-parallel\noutput: partial\nsums"),
        (8.8, "sharded after", "dropout, residual\n(sequence-\nsharded)"),
    ]
    for x, _, heading in stages:
        ax.text(x + 0.5, height + 0.1, heading, ha="center", va="bottom", fontsize=9)
    for rank, bottom in enumerate(_lanes(ax, world_size, 0.92)):
        middle, colour = bottom + LANE / 2, _colour(rank)
        top = middle + seq / 2
        positions = seq / world_size
        for x, kind, _ in stages:
            _box(ax, x, top - seq, hidden, seq, f"{kind} outline rank {rank}")
            if kind.startswith("sharded"):
                mine = top - (rank + 1) * positions
                _box(ax, x, mine, hidden, positions, f"{kind} rank {rank}")
                ax.patches[-1].set_facecolor(colour)
            elif kind == "gathered":
                _box(ax, x, top - seq, hidden, seq, f"{kind} rank {rank}")
                ax.patches[-1].set_facecolor(WHOLE)
            else:
                _box(ax, x, top - seq, hidden, seq, f"{kind} rank {rank}")
                ax.patches[-1].set(hatch="///", edgecolor=colour)
        for x0, x1 in ((1, 1.45), (2.75, 3.2), (4.2, 5.6), (6.6, 7.05), (8.35, 8.8)):
            _arrow(ax, x0 + 0.05, x1 - 0.05, middle)
        ax.text(4.9, middle + 0.1, "linears", ha="center", va="bottom", fontsize=8)
    _operator(ax, 2.1, height, "all-gather", SP_OPERATORS["all-gather"], width=1.3)
    _operator(
        ax, 7.7, height, "reduce-scatter", SP_OPERATORS["reduce-scatter"], width=1.3
    )
    ax.text(
        4.9,
        -0.5,
        "Each box: a rank's (sequence × hidden) activation, the sequence running "
        "down. The all-gather and the reduce-scatter take the place of f and g\n"
        "and send the same bytes; around them each rank keeps only "
        f"seq/{world_size} positions.",
        ha="center",
        va="top",
        fontsize=9,
    )
    return _finish(fig, ax, 10.2, height)


def plot_2d_mesh(dp: int = 2, tp: int = 2) -> Figure:
    """A (dp, tp) device mesh as ``init_device_mesh`` lays it out (rank = i·tp + j
    at row i, column j): each row a tensor-parallel group that shares one part of
    the batch and splits every layer, each column a data-parallel group that holds
    the same layer shards and takes different parts of the batch (15)."""
    fig, ax = plt.subplots(figsize=(2.4 * tp + 4.2, 1.7 * dp + 1.4))
    cell_w, cell_h, step = 2.0, 1.3, 1.7
    for i in range(dp):
        y = (dp - 1 - i) * step
        for j in range(tp):
            rank, x = i * tp + j, j * 2.4
            _box(ax, x, y, cell_w, cell_h, f"rank {rank}", facecolor=_colour(j))
            ax.patches[-1].set_alpha(0.35)
            label = (
                f"rank {rank}\n(dp {i}, tp {j})\nbatch part {i}\n"
                f"TP shard {j} of each weight,\n1/{dp} of it kept (FSDP)"
            )
            ax.text(
                x + 1.0, y + cell_h / 2, label, ha="center", va="center", fontsize=8
            )
        members = ", ".join(str(i * tp + j) for j in range(tp))
        _box(ax, -0.15, y - 0.12, tp * 2.4 - 0.1, cell_h + 0.24, f"tp group {i}")
        ax.patches[-1].set(linewidth=2.0, edgecolor="black")
        ax.text(
            tp * 2.4 - 0.1,
            y + cell_h / 2,
            f"tp group {i}: ranks {members}\nall-reduce activations\nin every layer",
            va="center",
            fontsize=8,
        )
    for j in range(tp):
        members = ", ".join(str(i * tp + j) for i in range(dp))
        column_height = (dp - 1) * step + cell_h + 0.14
        _box(ax, j * 2.4 - 0.07, -0.07, cell_w + 0.14, column_height, f"dp group {j}")
        ax.patches[-1].set(linestyle="--", edgecolor="0.3")
        ax.text(
            j * 2.4 + 1.0,
            -0.2,
            f"dp group {j}: ranks {members}\nFSDP: gather weights,\n"
            "reduce-scatter gradients",
            ha="center",
            va="top",
            fontsize=8,
        )
    ax.set_xlim(-0.4, tp * 2.4 + 1.9)
    ax.set_ylim(-1.2, dp * step)
    ax.set_axis_off()
    ax.set_title(f"a ({dp}, {tp}) mesh, mesh_dim_names = (dp, tp)", fontsize=10)
    fig.tight_layout()
    return fig

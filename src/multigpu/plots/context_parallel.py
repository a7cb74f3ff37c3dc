"""Ring attention step by step, and the contiguous and zig-zag layouts (17)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Polygon, Rectangle

from multigpu.context_parallel import RingRecord, layout_positions

RANK_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")
SKIP_COLOUR = "#dddddd"


def _draw_block(axis, block, colour: str) -> None:
    """One (queries x keys) block: whole, its lower triangle, or grey if skipped."""
    q0, q1 = block.queries.start, block.queries.stop
    k0, k1 = block.keys.start, block.keys.stop
    if block.kind == "skip":
        patch = Rectangle((k0, q0), k1 - k0, q1 - q0, facecolor=SKIP_COLOUR)
        patch.set_hatch("//")
        axis.add_patch(patch)
    elif block.kind == "full":
        axis.add_patch(Rectangle((k0, q0), k1 - k0, q1 - q0, facecolor=colour))
    else:  # the diagonal: keys up to each query (a staircase, drawn as a triangle)
        corners = [(k0, q0), (k0 + 1, q0), (k1, q1 - 1), (k1, q1), (k0, q1)]
        axis.add_patch(Polygon(corners, closed=True, facecolor=colour))
    outline = Rectangle((k0, q0), k1 - k0, q1 - q0, fill=False, edgecolor="white")
    axis.add_patch(outline)


def plot_ring_steps(records: Sequence[RingRecord], seq_len: int) -> Figure:
    """One panel per step of ring attention: the attention matrix (queries down,
    keys across) with the blocks each rank computes at that step in its colour,
    skipped blocks grey and hatched (17)."""
    world_size = len(records)
    figure, axes = plt.subplots(
        1, world_size, figsize=(2.6 * world_size, 3.3), squeeze=False
    )
    for step, axis in enumerate(axes[0]):
        for record in records:
            colour = RANK_COLOURS[record.rank % len(RANK_COLOURS)]
            for block in record.blocks:
                if block.step == step:
                    _draw_block(axis, block, colour)
        axis.set_xlim(0, seq_len)
        axis.set_ylim(seq_len, 0)
        axis.set_aspect("equal")
        axis.set_title(f"step {step}", fontsize=10)
        axis.set_xlabel("key position")
        axis.set_xticks([0, seq_len])
        axis.set_yticks([0, seq_len])
    axes[0][0].set_ylabel("query position")
    handles = [
        Rectangle((0, 0), 1, 1, facecolor=RANK_COLOURS[r % len(RANK_COLOURS)])
        for r in range(world_size)
    ] + [Rectangle((0, 0), 1, 1, facecolor=SKIP_COLOUR, hatch="//")]
    labels = [f"rank {r}" for r in range(world_size)] + ["skipped"]
    figure.legend(handles, labels, loc="lower center", ncol=world_size + 1)
    figure.tight_layout(rect=(0, 0.12, 1, 1))
    return figure


def plot_layouts(
    seq_len: int, world_size: int, work: Mapping[str, Sequence[int]]
) -> Figure:
    """For each layout of ``work`` ("contiguous", "zigzag"): the causal attention
    matrix with each query row in the colour of the rank that holds it, and below
    it the query-key products each rank computes (``work[layout]``) (17)."""
    layouts = list(work)
    figure, axes = plt.subplots(
        2,
        len(layouts),
        figsize=(3.4 * len(layouts), 5.4),
        gridspec_kw={"height_ratios": [3, 1.3]},
        squeeze=False,
    )
    colours = ListedColormap(["white", *RANK_COLOURS[:world_size]])
    for column, layout in enumerate(layouts):
        owner = [0] * seq_len
        for rank in range(world_size):
            for position in layout_positions(layout, seq_len, world_size, rank):
                owner[int(position)] = rank
        matrix = [
            [owner[q] + 1 if k <= q else 0 for k in range(seq_len)]
            for q in range(seq_len)
        ]
        top, bottom = axes[0][column], axes[1][column]
        top.imshow(matrix, cmap=colours, vmin=0, vmax=world_size, aspect="equal")
        top.set_title(layout, fontsize=10)
        top.set_xlabel("key position")
        top.set_ylabel("query position")
        bars = bottom.bar(
            range(world_size),
            work[layout],
            color=[RANK_COLOURS[r % len(RANK_COLOURS)] for r in range(world_size)],
        )
        bottom.bar_label(bars, fontsize=8)
        bottom.set_xticks(range(world_size), [f"rank {r}" for r in range(world_size)])
        bottom.set_ylabel("q·k computed")
        bottom.set_ylim(0, max(max(w) for w in work.values()) * 1.25)
    figure.tight_layout()
    return figure

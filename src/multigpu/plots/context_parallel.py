"""Ring attention step by step, forward and backward; the contiguous and zig-zag
layouts; Ulysses' tokens and heads before and after its all-to-all (17)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Polygon, Rectangle

from multigpu.context_parallel import RingRecord, layout_positions

RANK_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")
SKIP_COLOUR = "#dddddd"
MASKED = 0.3  # the alpha of products computed, then masked


def _draw_block(axis, block, colour: str) -> None:
    """One (queries x keys) block: whole, grey if skipped, or on the diagonal the
    whole block pale (computed) under its staircase (needed)."""
    q0, q1 = block.queries.start, block.queries.stop
    k0, k1 = block.keys.start, block.keys.stop
    if block.kind == "skip":
        patch = Rectangle((k0, q0), k1 - k0, q1 - q0, facecolor=SKIP_COLOUR)
        patch.set_hatch("//")
        axis.add_patch(patch)
    elif block.kind == "full":
        axis.add_patch(Rectangle((k0, q0), k1 - k0, q1 - q0, facecolor=colour))
    else:  # the diagonal: computed whole, then the keys after each query masked
        axis.add_patch(
            Rectangle((k0, q0), k1 - k0, q1 - q0, facecolor=colour, alpha=MASKED)
        )
        corners = [(k0, q0)]
        for query in range(q0, q1):  # the staircase of keys up to each query
            edge = min(max(query + 1, k0), k1)
            corners += [(edge, query), (edge, query + 1)]
        corners.append((k0, q1))
        axis.add_patch(Polygon(corners, closed=True, facecolor=colour))
    outline = Rectangle((k0, q0), k1 - k0, q1 - q0, fill=False, edgecolor="white")
    axis.add_patch(outline)


def plot_ring_steps(records: Sequence[RingRecord], seq_len: int) -> Figure:
    """One panel per step of ring attention: the attention matrix (queries down,
    keys across) with the blocks each rank computes at that step in its colour,
    the products of a diagonal block that the mask then hides pale, skipped blocks
    grey and hatched (17)."""
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
    ] + [
        Rectangle((0, 0), 1, 1, facecolor="grey", alpha=MASKED),
        Rectangle((0, 0), 1, 1, facecolor=SKIP_COLOUR, hatch="//"),
    ]
    labels = [f"rank {r}" for r in range(world_size)]
    labels += ["computed, then masked", "skipped"]
    figure.legend(handles, labels, loc="lower center", ncol=world_size + 2)
    figure.tight_layout(rect=(0, 0.12, 1, 1))
    return figure


def plot_layouts(
    seq_len: int,
    world_size: int,
    needed: Mapping[str, Sequence[int]],
    computed: Mapping[str, Sequence[int]],
) -> Figure:
    """For each layout of ``needed`` ("contiguous", "zigzag"): the causal attention
    matrix with each query row in the colour of the rank that holds it, and below
    it the query-key products each rank needs (solid) and computes (the pale rest:
    computed, then masked) (17)."""
    layouts = list(needed)
    figure, axes = plt.subplots(
        2,
        len(layouts),
        figsize=(3.4 * len(layouts), 5.6),
        gridspec_kw={"height_ratios": [3, 1.4]},
        squeeze=False,
    )
    colours = ListedColormap(["white", *RANK_COLOURS[:world_size]])
    ranks = range(world_size)
    for column, layout in enumerate(layouts):
        owner = [0] * seq_len
        for rank in ranks:
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
        rank_colours = [RANK_COLOURS[r % len(RANK_COLOURS)] for r in ranks]
        bottom.bar(ranks, needed[layout], color=rank_colours)
        extra = [c - n for c, n in zip(computed[layout], needed[layout])]
        bars = bottom.bar(
            ranks, extra, bottom=needed[layout], color=rank_colours, alpha=MASKED
        )
        labels = [f"{n} / {c}" for n, c in zip(needed[layout], computed[layout])]
        bottom.bar_label(bars, labels=labels, fontsize=8)
        bottom.set_xticks(ranks, [f"rank {r}" for r in ranks])
        bottom.set_ylabel("q·k needed / computed", fontsize=8)
        bottom.set_ylim(0, max(max(c) for c in computed.values()) * 1.3)
    figure.tight_layout()
    return figure


def plot_ring_backward(records: Sequence[RingRecord]) -> Figure:
    """Ring attention's backward, from the blocks its forward met (the backward
    meets the same ones, step by step): one panel per step and a last one when the
    gradients are home. Column j is the gradient of rank j's keys and values,
    travelling with them (above it: the rank that holds it); row r fills in rank
    r's colour once rank r has added its queries' share, full at the step it
    does, grey hatched where the block is skipped (17)."""
    world_size = len(records)
    kinds = {(r.rank, b.step): b.kind for r in records for b in r.blocks}
    figure, axes = plt.subplots(
        1, world_size + 1, figsize=(2.2 * (world_size + 1), 3.2), squeeze=False
    )
    for panel, axis in enumerate(axes[0]):
        home = panel == world_size
        for rank in range(world_size):
            for step in range(min(panel + 1, world_size)):
                owner = (rank - step) % world_size  # whose block rank holds
                skipped = kinds.get((rank, step), "skip") == "skip"
                colour = SKIP_COLOUR if skipped else RANK_COLOURS[rank]
                alpha = 1.0 if step == panel or skipped else 0.45
                cell = Rectangle((owner, rank), 1, 1, facecolor=colour, alpha=alpha)
                cell.set_hatch("//" if skipped else None)
                axis.add_patch(cell)
        holders = [j if home else (j + panel) % world_size for j in range(world_size)]
        top = axis.secondary_xaxis("top")
        top.set_xticks([j + 0.5 for j in range(world_size)], holders, fontsize=8)
        top.set_xlabel("held by rank", fontsize=8)
        axis.set_xlim(0, world_size)
        axis.set_ylim(world_size, 0)
        axis.set_aspect("equal")
        axis.set_xticks([j + 0.5 for j in range(world_size)], range(world_size))
        axis.set_yticks([r + 0.5 for r in range(world_size)], range(world_size))
        axis.set_title("home" if home else f"step {panel}", fontsize=10)
        axis.set_xlabel("dk, dv of rank", fontsize=8)
    axes[0][0].set_ylabel("share added by rank")
    figure.tight_layout()
    return figure


def plot_ulysses_layout(seq_len: int, heads: int, world_size: int) -> Figure:
    """Ulysses' all-to-all on a (tokens x heads) grid: before, each rank holds its
    tokens of every head; after, every token of its heads. Each cell is in the
    colour of the rank that holds it and names the rank that held it before (17)."""
    before = [0] * seq_len
    for rank in range(world_size):
        for position in layout_positions("contiguous", seq_len, world_size, rank):
            before[int(position)] = rank
    group = heads // world_size
    figure, axes = plt.subplots(1, 2, figsize=(6.4, 0.45 * seq_len + 2.2))
    titles = ("before: my tokens, every head", "after: every token, my heads")
    for axis, title in zip(axes, titles):
        after = title.startswith("after")
        for token in range(seq_len):
            for head in range(heads):
                holder = head // group if after else before[token]
                colour = RANK_COLOURS[holder]
                cell = Rectangle(
                    (head, token), 1, 1, facecolor=colour, edgecolor="white"
                )
                axis.add_patch(cell)
                label = f"r{before[token]}"
                axis.text(
                    head + 0.5,
                    token + 0.5,
                    label,
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white",
                )
        axis.set_xlim(0, heads)
        axis.set_ylim(seq_len, 0)
        axis.set_aspect("equal")
        axis.set_xticks([h + 0.5 for h in range(heads)], range(heads))
        axis.set_yticks([t + 0.5 for t in range(seq_len)], range(seq_len))
        axis.set_xlabel("head")
        axis.set_ylabel("token")
        axis.set_title(title, fontsize=10)
    handles = [
        Rectangle((0, 0), 1, 1, facecolor=RANK_COLOURS[r]) for r in range(world_size)
    ]
    labels = [f"held by rank {r}" for r in range(world_size)]
    figure.legend(handles, labels, loc="lower center", ncol=world_size)
    figure.tight_layout(rect=(0, 0.1, 1, 1))
    return figure

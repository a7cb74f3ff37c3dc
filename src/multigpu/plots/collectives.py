"""The ring all-reduce step by step (07)."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from multigpu.collectives import all_gather_send_chunk, reduce_scatter_send_chunk


def ring_states(world_size: int) -> list[dict]:
    """For each step of the ring all-reduce: whose data each (rank, chunk) holds and
    which chunk each rank sends, following the schedule of ``collectives`` (07)."""
    holds = [[{rank} for _ in range(world_size)] for rank in range(world_size)]
    states = []
    phases = (
        ("reduce-scatter", reduce_scatter_send_chunk),
        ("all-gather", all_gather_send_chunk),
    )
    for phase, rule in phases:
        for step in range(world_size - 1):
            sends = [rule(rank, step, world_size) for rank in range(world_size)]
            states.append(
                {
                    "title": f"{phase} step {step + 1}",
                    "holds": [[set(h) for h in row] for row in holds],
                    "sends": sends,
                }
            )
            messages = [set(holds[rank][sends[rank]]) for rank in range(world_size)]
            for rank, chunk in enumerate(sends):
                receiver = holds[(rank + 1) % world_size]
                if phase == "reduce-scatter":
                    receiver[chunk] |= messages[rank]
                else:
                    receiver[chunk] = messages[rank]
    states.append({"title": "done", "holds": holds, "sends": [None] * world_size})
    return states


def plot_ring(world_size: int = 4) -> Figure:
    """One panel per ring step, the reduce-scatter on the top row and the
    all-gather below it, then the result: rows are ranks, columns chunks; the shade
    and the digits say whose data a chunk holds, a red box marks the chunk each
    rank sends to rank + 1. For 4 ranks it is 9 inches wide, so that it can be
    read at a notebook's width; the empty corner holds the key (07)."""
    states = ring_states(world_size)
    steps = world_size - 1
    columns, rows = steps + 1, 2 if steps else 1  # one phase's steps, then "done"
    panel = 2.25  # inches per panel
    figure, axes = plt.subplots(
        rows, columns, figsize=(panel * columns, panel * rows), squeeze=False
    )
    # Top row: reduce-scatter steps; bottom row: all-gather steps, then "done".
    places = [(0, c) for c in range(steps)] + [(1, c) for c in range(steps)]
    places.append((rows - 1, columns - 1))
    for (row, column), state in zip(places, states, strict=True):
        axis = axes[row][column]
        counts = [[len(h) for h in holds] for holds in state["holds"]]
        axis.imshow(counts, cmap="Blues", vmin=0, vmax=world_size + 1)
        for rank, holds in enumerate(state["holds"]):
            for chunk, holders in enumerate(holds):
                axis.text(
                    chunk,
                    rank,
                    "".join(str(r) for r in sorted(holders)),
                    ha="center",
                    va="center",
                    fontsize=9 if world_size <= 4 else 7,
                    color="white" if len(holders) == world_size else "black",
                )
            chunk = state["sends"][rank]
            if chunk is not None:
                corner = (chunk - 0.5, rank - 0.5)
                axis.add_patch(Rectangle(corner, 1, 1, fill=False, lw=2.5, ec="red"))
        axis.set_title(state["title"], fontsize=10)
        axis.set_xticks(range(world_size))
        axis.set_yticks(range(world_size))
        if row == rows - 1:
            axis.set_xlabel("chunk")
        if column == 0:
            axis.set_ylabel("rank")
    figure.tight_layout()
    if rows == 2:  # the top right corner: the key instead of a panel
        key = axes[0][columns - 1]
        box = key.get_position()
        key.remove()
        figure.text(
            box.x0,
            box.y0 + box.height / 2,
            f"digits: whose data a\nchunk holds ({''.join(map(str, range(world_size)))}"
            f" = sum)\nred box: the chunk a\nrank sends to rank + 1\n"
            f"(rank {world_size - 1} sends to rank 0)",
            va="center",
            fontsize=9,
        )
    return figure

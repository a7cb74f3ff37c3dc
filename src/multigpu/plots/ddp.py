"""DDP by hand: backward overlapped with the all-reduce, and gradient buckets
(10)."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure


def plot_overlap(timelines: dict[str, list[list]], title: str | None = None) -> Figure:
    """Backward and all-reduce lanes per rank, one panel per strategy:
    ``timelines[strategy][rank]`` is a list of events with ``lane`` ("backward" or
    "all-reduce"), ``name``, ``start`` and ``end`` in seconds (e.g.
    ``multigpu.miniddp.TimelineEvent``); time in ms since the forward began (10)."""
    strategies = list(timelines)
    ranks = max(len(per_rank) for per_rank in timelines.values())
    fig, axes = plt.subplots(
        len(strategies),
        1,
        figsize=(9, (0.6 * 2 * ranks + 0.9) * len(strategies)),
        sharex=True,
        squeeze=False,
    )
    fixed = {"forward": "#bbbbbb", "sync": "#d62728"}
    for ax, strategy in zip(axes[:, 0], strategies):
        labels = []
        for rank, events in enumerate(timelines[strategy]):
            for offset, lane in enumerate(("backward", "all-reduce")):
                row = 2 * rank + offset
                labels.append(f"rank {rank} {lane}")
                spans = [e for e in events if e.lane == lane]
                for k, e in enumerate(spans):
                    colour = fixed.get(
                        e.name,
                        plt.get_cmap("Blues" if lane == "backward" else "Oranges")(
                            0.45 + 0.4 * (k % 2)
                        ),
                    )
                    width = max(1000 * (e.end - e.start), 1e-3)
                    ax.broken_barh(
                        [(1000 * e.start, width)], (row - 0.35, 0.7), color=colour
                    )
        ax.set_yticks(range(len(labels)), labels)
        ax.invert_yaxis()
        ax.set_title(strategy, loc="left", fontsize="medium")
        ax.grid(axis="x", alpha=0.3)
    handles = [
        plt.Rectangle((0, 0), 1, 1, color=c)
        for c in ("#bbbbbb", plt.get_cmap("Blues")(0.65), "#d62728")
    ] + [plt.Rectangle((0, 0), 1, 1, color=plt.get_cmap("Oranges")(0.65))]
    axes[0, 0].legend(
        handles,
        [
            "forward",
            "backward, layer by layer",
            "end of backward: finish, copy to .grad",
            "all-reduce",
        ],
        loc="lower left",
        bbox_to_anchor=(0.0, 1.08),
        ncol=4,
        fontsize="small",
    )
    axes[-1, 0].set_xlabel("time since the forward began (ms)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_buckets(layout: list[list[str]], sizes: dict[str, int]) -> Figure:
    """Which parameter fell in which bucket: one bar per bucket, split into its
    parameters (width: bytes), in the order they fill it (10)."""
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(layout) + 1.2))
    cmap = plt.get_cmap("tab20")
    k = 0
    for row, names in enumerate(layout):
        left = 0
        for name in names:
            width = sizes[name] / 1024
            ax.barh(row, width, left=left, color=cmap(k % 20), edgecolor="white")
            if width > 0.08 * max(sum(sizes[n] for n in b) for b in layout) / 1024:
                ax.text(
                    left + width / 2, row, name, ha="center", va="center", fontsize=7
                )
            left += width
            k += 1
    ax.set_yticks(range(len(layout)), [f"bucket {i}" for i in range(len(layout))])
    ax.invert_yaxis()
    ax.set(xlabel="KiB", title="buckets, filled left to right")
    fig.tight_layout()
    return fig

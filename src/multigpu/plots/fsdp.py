"""FSDP by hand: what the prefetched all-gathers hide behind compute (14)."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

LANES = ("compute", "communication")
COLLECTIVE_COLOURS = {"all-gather": "Oranges", "reduce-scatter": "Greens"}


def plot_prefetch(timelines: dict[str, list], title: str | None = None) -> Figure:
    """One panel per setting (e.g. "depth 0"), ``timelines[setting]`` one rank's
    events (``lane`` "compute", "all-gather" or "reduce-scatter", ``name``,
    ``start``, ``end`` in seconds, e.g. ``multigpu.miniddp.TimelineEvent``): a
    compute lane (forward grey, backward blue) and a communication lane, time in ms,
    drawn like 10's :func:`~multigpu.plots.plot_overlap` (14)."""
    settings = list(timelines)
    fig, axes = plt.subplots(
        len(settings), 1, figsize=(9, 1.5 * len(settings) + 0.9), sharex=True
    )
    axes = list(axes) if len(settings) > 1 else [axes]
    for ax, setting in zip(axes, settings):
        counts: dict[str, int] = {}
        for e in timelines[setting]:
            row = 0 if e.lane == "compute" else 1
            k = counts[e.lane] = counts.get(e.lane, 0) + 1
            if e.lane == "compute":
                forward = e.name.startswith("forward")
                colour = (
                    "#bbbbbb" if forward else plt.get_cmap("Blues")(0.5 + 0.3 * (k % 2))
                )
            else:
                colour = plt.get_cmap(COLLECTIVE_COLOURS.get(e.lane, "Purples"))(
                    0.45 + 0.4 * (k % 2)
                )
            width = max(1000 * (e.end - e.start), 1e-3)
            ax.broken_barh([(1000 * e.start, width)], (row - 0.35, 0.7), color=colour)
        ax.set_yticks(range(len(LANES)), LANES)
        ax.invert_yaxis()
        ax.set_title(setting, loc="left", fontsize="medium")
        ax.grid(axis="x", alpha=0.3)
    colours = ["#bbbbbb", plt.get_cmap("Blues")(0.65)]
    colours += [plt.get_cmap(c)(0.65) for c in COLLECTIVE_COLOURS.values()]
    axes[0].legend(
        [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours],
        ["forward", "backward", "all-gather", "reduce-scatter"],
        loc="lower left",
        bbox_to_anchor=(0.0, 1.12),
        ncol=4,
        fontsize="small",
    )
    axes[-1].set_xlabel("time since the step began (ms)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig

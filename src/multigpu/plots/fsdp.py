"""FSDP by hand: one unit's life in a step, and what the prefetched all-gathers
hide behind compute (14)."""

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
            if e.lane not in ("compute", *COLLECTIVE_COLOURS):
                continue  # e.g. "gathered": memory, not a lane of this figure
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


UNIT_LIFE_ROWS = ("compute", "parameters", "communication")
UNIT_LIFE_COLOURS = {
    "forward": "#888888",
    "backward": plt.get_cmap("Blues")(0.7),
    "other units": "#e4e4e4",
    "gathered": plt.get_cmap("Oranges")(0.35),
    "all-gather": plt.get_cmap("Oranges")(0.75),
    "reduce-scatter": plt.get_cmap("Greens")(0.7),
}


def unit_life_spans(events: list, unit: str) -> dict[str, list[tuple[float, float]]]:
    """What :func:`plot_unit_life` draws, in ms: ``unit``'s "forward" and
    "backward" compute, the "other units" compute, its "gathered" spans (memory
    there), the "freed" gaps between them, its "all-gather" and "reduce-scatter"
    spans (14)."""
    spans: dict[str, list[tuple[float, float]]] = {k: [] for k in UNIT_LIFE_COLOURS}
    for e in events:
        span = (1000 * e.start, 1000 * e.end)
        if e.lane == "compute":
            what, _, name = e.name.partition(" ")
            spans[what if name == unit else "other units"].append(span)
        elif e.name == unit and e.lane in spans:
            spans[e.lane].append(span)
    gathered = sorted(spans["gathered"])
    spans["freed"] = [(a[1], b[0]) for a, b in zip(gathered, gathered[1:])]
    return spans


def plot_unit_life(events: list, unit: str, title: str | None = None) -> Figure:
    """One FSDP unit's step, read off a recorded timeline (``events`` of one rank,
    e.g. :class:`~multigpu.fsdp.FSDPByHand`'s with ``record=True``): its forward
    and backward among the other units' compute, the spans its parameters are
    gathered (and freed between them), its all-gathers and its gradient's
    reduce-scatter, time in ms (14)."""
    spans = unit_life_spans(events, unit)
    fig, ax = plt.subplots(figsize=(9, 2.6))
    rows = {
        "other units": 0,
        "forward": 0,
        "backward": 0,
        "gathered": 1,
        "all-gather": 2,
        "reduce-scatter": 2,
    }
    for what, row in rows.items():
        bars = [(start, max(end - start, 1e-3)) for start, end in spans[what]]
        colour = UNIT_LIFE_COLOURS[what]
        ax.broken_barh(bars, (row - 0.35, 0.7), color=colour, label=what)
    gathered = sorted(spans["gathered"])
    labels = ["gathered for forward", "gathered again for backward"]
    for (start, end), label in zip(gathered, labels):
        ax.text((start + end) / 2, 1, label, ha="center", va="center", fontsize=8)
    for start, end in spans["freed"]:
        ax.text((start + end) / 2, 1, "freed", ha="center", va="center", fontsize=8)
    for _start, end in spans["reduce-scatter"]:
        ax.annotate(
            "gradient reduce-scattered",
            xy=(end, 2.35),
            xytext=(end, 2.75),
            ha="right",
            va="bottom",
            fontsize=8,
        )
    ax.set_yticks(range(3), ["compute", f"unit {unit} gathered", "communication"])
    ax.set_ylim(3.1, -0.6)
    ax.set_xlabel("time since the step began (ms)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.02), ncol=6, fontsize="small")
    if title:
        ax.set_title(title, loc="left", fontsize="medium", pad=24)
    fig.tight_layout()
    return fig

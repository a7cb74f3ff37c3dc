"""What each rank of a ZeRO stage holds (13)."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

LEDGER_COLOURS = {
    "parameters": "tab:blue",
    "gradients": "tab:orange",
    "optimizer": "tab:green",
    "gathered": "tab:gray",
}


def plot_zero_ledgers(
    panels: Mapping[str, Mapping[str, Mapping[str, float]]],
    ylabel: str = "bytes per parameter",
) -> Figure:
    """Stacked bars of what a rank holds, one panel per title:
    ``{title: {bar label: ledger}}``, each ledger ``{category: amount}`` as
    ``zero.measure_ledger`` and ``costmodel.zero_memory_ledger`` return it (the
    categories in the order of the first ledger, a missing one counting 0); the
    panels share the y axis, labelled ``ylabel`` (13)."""
    categories: list[str] = []
    for bars in panels.values():
        for ledger in bars.values():
            categories += [c for c in ledger if c not in categories]
    palette = iter(plt.rcParams["axes.prop_cycle"].by_key()["color"])
    colours = {c: LEDGER_COLOURS.get(c) or next(palette) for c in categories}
    fig, axes = plt.subplots(
        1, len(panels), figsize=(3.4 * len(panels), 3.4), sharey=True, squeeze=False
    )
    for ax, (title, bars) in zip(axes[0], panels.items()):
        labels = list(bars)
        bottoms = [0.0] * len(labels)
        for category in categories:
            heights = [bars[label].get(category, 0.0) for label in labels]
            ax.bar(
                labels, heights, bottom=bottoms, color=colours[category], label=category
            )
            bottoms = [b + h for b, h in zip(bottoms, heights)]
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=30)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    handles = [Rectangle((0, 0), 1, 1, color=colours[c]) for c in categories]
    axes[0][-1].legend(handles, categories, fontsize="small")
    fig.tight_layout()
    return fig

"""Pipeline schedules as rank-by-time charts, and the bubble against m (16)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from multigpu.pipeline import ScheduleBlock, step_span

OP_COLOURS = {"forward": "#4c72b0", "backward": "#dd8452"}
IDLE_COLOUR = "#eeeeee"


def _draw_schedule(
    axis, blocks: Sequence[ScheduleBlock], num_stages: int, unit: str
) -> None:
    start, end = step_span(blocks)
    for stage in range(num_stages):
        axis.barh(stage, end - start, left=start, height=0.8, color=IDLE_COLOUR)
    for block in blocks:
        width = block.end - block.start
        axis.barh(
            block.stage,
            width,
            left=block.start,
            height=0.8,
            color=OP_COLOURS[block.op],
            edgecolor="white",
        )
        axis.text(
            block.start + width / 2,
            block.stage,
            str(block.microbatch),
            ha="center",
            va="center",
            color="white",
            fontsize=8,
        )
    axis.set_yticks(range(num_stages), [f"rank {s}" for s in range(num_stages)])
    axis.invert_yaxis()
    axis.set_xlabel(unit)


def plot_schedules(
    panels: Mapping[str, Sequence[ScheduleBlock]],
    num_stages: int,
    unit: str = "time slots",
) -> Figure:
    """One chart per schedule, stacked on one time axis (a shorter step ends
    earlier): a row per rank, a box per forward (blue) or backward (orange) with
    its micro-batch's number; grey is idle time."""
    figure, axes = plt.subplots(
        len(panels),
        1,
        figsize=(9, 1.0 + 0.45 * num_stages * len(panels)),
        squeeze=False,
        sharex=True,
    )
    for axis, (title, blocks) in zip(axes[:, 0], panels.items(), strict=True):
        _draw_schedule(axis, blocks, num_stages, unit)
        axis.set_title(title, fontsize=10)
        axis.tick_params(labelbottom=True)  # every chart keeps its time labels
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in OP_COLOURS.values()]
    handles.append(plt.Rectangle((0, 0), 1, 1, color=IDLE_COLOUR))
    axes[0, 0].legend(  # above the first chart, clear of the bars
        handles,
        ["forward", "backward", "idle"],
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
        ncol=3,
        frameon=False,
    )
    figure.tight_layout()
    return figure


def plot_bubble(
    microbatches: Sequence[int],
    measured: Mapping[str, Sequence[float]],
    formula: Sequence[float],
) -> Figure:
    """The idle share of a step against the number of micro-batches m: the
    formula (p - 1)/(m + p - 1) as a line, each measured schedule as points."""
    figure, axis = plt.subplots(figsize=(6, 3.2))
    axis.plot(microbatches, formula, color="black", label="(p-1)/(m+p-1)")
    for (name, values), marker in zip(measured.items(), "os^", strict=False):
        axis.plot(microbatches, values, marker, label=f"{name}, measured")
    axis.set_xscale("log", base=2)
    axis.set_xticks(list(microbatches), [str(m) for m in microbatches])
    axis.set_xlabel("micro-batches m")
    axis.set_ylabel("idle share of the step")
    axis.set_ylim(0, 1)
    axis.legend(fontsize=8)
    figure.tight_layout()
    return figure

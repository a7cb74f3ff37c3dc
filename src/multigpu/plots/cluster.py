"""The planner's configurations: predicted memory per GPU against step time, and
one rank's memory by kind, tool against formula (20)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

PIPELINE_MARKERS = {1: "o", 2: "s", 4: "^", 8: "D"}  # by pp; others "x"


def plot_cluster_plans(
    plans: Sequence, gpu_memory: float, label_best: int = 3
) -> Figure:
    """Each configuration (a :class:`~multigpu.cluster.planner.Plan`) as a point:
    predicted GiB per GPU across, seconds per step up, coloured by tp, marked by
    pp; the GPU's memory as a dashed line; the ``label_best`` fastest named (20)."""
    figure, axis = plt.subplots(figsize=(7, 4))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    tps = sorted({plan.tp for plan in plans})
    for plan in plans:
        axis.scatter(
            plan.memory_total / 2**30,
            plan.step_seconds,
            color=colours[tps.index(plan.tp) % len(colours)],
            marker=PIPELINE_MARKERS.get(plan.pp, "x"),
            facecolors="none" if plan.recompute else None,
        )
    for plan in plans[:label_best]:
        axis.annotate(
            plan.grid,
            (plan.memory_total / 2**30, plan.step_seconds),
            textcoords="offset points",
            xytext=(6, 4),
            fontsize=8,
        )
    axis.axvline(gpu_memory / 2**30, linestyle="--", color="grey")
    for tp in tps:
        axis.scatter(
            [], [], color=colours[tps.index(tp) % len(colours)], label=f"tp {tp}"
        )
    for pp, marker in PIPELINE_MARKERS.items():
        if any(plan.pp == pp for plan in plans):
            axis.scatter([], [], color="black", marker=marker, label=f"pp {pp}")
    axis.legend(fontsize=8, ncol=2)
    axis.set_xlabel("predicted memory per GPU (GiB)")
    axis.set_ylabel("predicted step (s)")
    axis.set_title(f"{len(plans)} configurations that fit")
    figure.tight_layout()
    return figure


def plot_memory_kinds(
    tool: Mapping[str, float], formula: Mapping[str, float], title: str = ""
) -> Figure:
    """Bars of one rank's bytes by kind, the tool's beside the formula's, in MiB
    (20)."""
    kinds = list(tool)
    figure, axis = plt.subplots(figsize=(7, 3))
    positions = range(len(kinds))
    axis.barh([p + 0.2 for p in positions], [tool[k] / 2**20 for k in kinds],
              height=0.4, label="tool")  # fmt: skip
    axis.barh([p - 0.2 for p in positions], [formula.get(k, 0) / 2**20 for k in kinds],
              height=0.4, label="formula")  # fmt: skip
    axis.set_yticks(list(positions), kinds)
    axis.set_xlabel("MiB on one rank")
    axis.set_title(title)
    axis.legend()
    figure.tight_layout()
    return figure

"""Tests for multigpu.plots.cluster: a point per plan with the fastest named, and
the tool's bars beside the formula's."""

import matplotlib.pyplot as plt

from multigpu.cluster.llama import LLAMA3_70B
from multigpu.cluster.planner import plan_configurations
from multigpu.core.sizes import GB
from multigpu.plots.cluster import plot_cluster_plans, plot_memory_kinds


def test_plot_plans_draws_every_plan_and_names_the_fastest():
    plans = plan_configurations(LLAMA3_70B, 80 * GB, 64, 64, 8192)
    figure = plot_cluster_plans(plans, 80 * GB, label_best=2)
    axis = figure.axes[0]
    drawn = sum(len(c.get_offsets()) for c in axis.collections)
    assert drawn == len(plans)  # the legend's handles hold no points
    assert [t.get_text() for t in axis.texts] == [p.grid for p in plans[:2]]
    assert axis.get_title() == f"{len(plans)} configurations that fit"
    plt.close(figure)


def test_plot_memory_kinds_puts_the_two_side_by_side():
    figure = plot_memory_kinds({"a": 2**20, "b": 2**21}, {"a": 2**20, "b": 0})
    widths = [patch.get_width() for patch in figure.axes[0].patches]
    assert widths == [1.0, 2.0, 1.0, 0.0]
    plt.close(figure)

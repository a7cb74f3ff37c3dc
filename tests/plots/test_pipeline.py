"""Tests for multigpu.plots.pipeline: one chart per schedule, a box per block."""

import matplotlib.pyplot as plt

from multigpu.pipeline import schedule_actions, simulate_schedule
from multigpu.plots.pipeline import plot_bubble, plot_schedules


def test_plot_schedules_draws_every_block_and_the_idle_rows():
    panels = {
        name: simulate_schedule(schedule_actions(name, 4, 4)).blocks
        for name in ("gpipe", "1f1b")
    }
    figure = plot_schedules(panels, 4)
    assert len(figure.axes) == 2
    top, bottom = figure.axes
    assert top.get_shared_x_axes().joined(top, bottom)  # one time axis
    for axis in figure.axes:
        bars = axis.patches
        assert len(bars) == 4 + 4 * 4 * 2  # an idle row per rank, then the blocks
        assert [t.get_text() for t in axis.get_yticklabels()] == [
            "rank 0", "rank 1", "rank 2", "rank 3"
        ]  # fmt: skip
    plt.close(figure)


def test_plot_bubble_has_the_formula_and_each_schedule():
    figure = plot_bubble([1, 2, 4], {"gpipe": [0.8, 0.6, 0.4]}, [0.75, 0.6, 3 / 7])
    axis = figure.axes[0]
    assert [line.get_label() for line in axis.lines] == [
        "(p-1)/(m+p-1)", "gpipe, measured"
    ]  # fmt: skip
    plt.close(figure)

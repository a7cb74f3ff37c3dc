"""The figures draw: one box per rank in the grid picture, one bar per computation
in the plans' chart, the bubble in each title."""

import matplotlib

matplotlib.use("Agg")

from matplotlib import pyplot as plt  # noqa: E402

from multigpu.gpt4d.grid import Grid  # noqa: E402
from multigpu.gpt4d.schedules import course_plan, simulate_plan  # noqa: E402
from multigpu.plots.gpt4d import plot_grid, plot_pipeline_plans  # noqa: E402


def test_the_grid_picture_has_a_box_per_rank():
    grid = Grid(dp=2, tp=2, pp=2)
    fig = plot_grid(grid)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert sorted(texts) == sorted(
        f"rank {r}\ntp{grid.coords(r)['tp']} cp0" for r in range(8)
    )
    plt.close(fig)


def test_the_plans_chart_has_a_bar_per_computation():
    blocks, bubble = simulate_plan(course_plan("1f1b", 2, 4), 2)
    fig = plot_pipeline_plans({"1f1b": blocks}, {"1f1b": bubble})
    (axis,) = fig.axes
    assert "bubble 20.0%" in axis.get_title(loc="left")
    assert len(axis.texts) == len(blocks) == 16
    plt.close(fig)

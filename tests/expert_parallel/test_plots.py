"""Tests for multigpu.plots.expert_parallel (here because tests/plots/ belongs to
the figures of every lesson): a line per token, a bar per expert, the dropped
tokens stacked on the computed ones, a curve per run."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from multigpu.plots.expert_parallel import (  # noqa: E402
    DROPPED_COLOUR,
    plot_load_balance,
    plot_send_table,
    plot_token_routing,
)


def test_plot_token_routing_draws_each_token_and_each_experts_load():
    routes = ([0, 3, 3, 2], [], [0, 0, 3], [2, 0])
    kept = [[True, True, False, True], [], [True, False, True], [True, True]]
    figure = plot_token_routing(routes, 4, kept_per_rank=kept)
    left, right = figure.axes
    lines = [line for line in left.lines if len(line.get_xdata()) == 2]
    assert len(lines) == 9  # one per token
    dashed = [line for line in lines if line.get_linestyle() == "--"]
    assert len(dashed) == 2 and all(d.get_color() == DROPPED_COLOUR for d in dashed)
    computed, dropped = right.containers
    assert [bar.get_height() for bar in computed] == [3, 0, 2, 2]
    assert [bar.get_height() for bar in dropped] == [1, 0, 0, 1]
    assert [bar.get_y() for bar in dropped] == [3, 0, 2, 2]  # stacked on top
    assert [t.get_text() for t in right.get_xticklabels()][1] == "1\n(rank 1)"
    assert [t.get_text() for t in right.get_legend().get_texts()] == [
        "dropped: its expert was full"
    ]
    plt.close(figure)
    # nothing dropped: no legend naming what the figure does not show
    figure = plot_token_routing(routes, 4)
    assert figure.axes[1].get_legend() is None
    plt.close(figure)


def test_plot_load_balance_has_a_curve_per_run_and_bars_per_expert():
    runs = {"aux 0": [[6, 2, 0, 0], [8, 0, 0, 0]], "aux 0.1": [[6, 2, 0, 0], [2] * 4]}
    figure = plot_load_balance(runs, ep_size=2)
    left, right = figure.axes
    curves = [line for line in left.lines if line.get_label() in runs]
    assert [list(line.get_ydata()) for line in curves] == [[3.0, 4.0], [3.0, 1.0]]
    by_rank = [line for line in left.lines if line.get_label().endswith("per rank")]
    # ranks hold experts 0-1 and 2-3: [8, 0] and [8, 0], then [8, 0] and [4, 4]
    assert [list(line.get_ydata()) for line in by_rank] == [[2.0, 2.0], [2.0, 1.0]]
    assert all(line.get_linestyle() == "--" for line in by_rank)
    assert [c.get_label() for c in right.containers] == [
        "start", "aux 0, end", "aux 0.1, end"
    ]  # fmt: skip
    assert [bar.get_height() for bar in right.containers[1]] == [8, 0, 0, 0]
    # a run's bars take its curves' colour, so the two panels read alike
    for curve, bars in zip(curves, right.containers[1:], strict=True):
        assert to_hex(bars[0].get_facecolor()) == to_hex(curve.get_color())
    assert to_hex(right.containers[0][0].get_facecolor()) not in {
        to_hex(curve.get_color()) for curve in curves
    }
    plt.close(figure)


def test_plot_send_table_writes_what_each_rank_sends_each_rank():
    sent = [[3, 2], [3, 0]]  # sent[s][r]: rows rank s sends rank r
    figure = plot_send_table(sent)
    (axis,) = figure.axes
    assert axis.images[0].get_array().tolist() == sent
    numbers = {(t.get_position(), t.get_text()) for t in axis.texts}
    assert numbers == {((0, 0), "3"), ((1, 0), "2"), ((0, 1), "3"), ((1, 1), "0")}
    plt.close(figure)

"""Tests of plot_zero_ledgers (13)."""

import matplotlib.pyplot as plt

from multigpu import plots
from tests.plots.helpers import bar_patches


def test_zero_ledgers_stack_each_category_in_one_panel_per_title():
    ledger = {"parameters": 4.0, "gradients": 4.0, "optimizer": 8.0, "gathered": 0.0}
    sharded = {"parameters": 1.0, "gradients": 1.0, "optimizer": 2.0, "gathered": 3.0}
    fig = plots.plot_zero_ledgers(
        {
            "1 rank": {"DDP": ledger},
            "4 ranks": {"DDP": ledger, "ZeRO-3": sharded},
        },
        ylabel="bytes per parameter",
    )
    one, four = fig.axes
    assert [ax.get_title() for ax in fig.axes] == ["1 rank", "4 ranks"]
    assert [t.get_text() for t in four.get_xticklabels()] == ["DDP", "ZeRO-3"]
    bars = bar_patches(four)
    assert bars[("optimizer", 0)].get_height() == 8.0
    assert bars[("optimizer", 0)].get_y() == 8.0  # on parameters and gradients
    assert bars[("gathered", 1)].get_y() == 4.0  # ZeRO-3: 1 + 1 + 2 below it
    assert bars[("gathered", 1)].get_height() == 3.0
    assert one.get_ylabel() == "bytes per parameter"
    assert four.get_shared_y_axes().joined(one, four)  # one scale for all panels
    legend = [t.get_text() for t in four.get_legend().get_texts()]
    assert legend == ["parameters", "gradients", "optimizer", "gathered"]
    plt.close("all")

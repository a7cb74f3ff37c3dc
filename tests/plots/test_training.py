"""Tests of plot_history (01)."""

from multigpu.core.train import History
from multigpu.plots import plot_history


def test_history_plot_has_loss_and_accuracy_panels():
    history = History([2.0, 1.0], [1.5, 0.9], [0.5, 0.8], [0.1, 0.1])
    fig = plot_history(history, title="baseline")
    loss_ax, acc_ax = fig.axes
    assert [line.get_label() for line in loss_ax.lines] == ["train", "test"]
    assert list(acc_ax.lines[0].get_ydata()) == [50.0, 80.0]
    assert fig._suptitle.get_text() == "baseline"


def test_several_runs_are_labelled():
    runs = {
        "1 device": History([1.0], [], [], [0.1]),
        "2 devices": History([0.9], [], [], [0.1]),
    }
    fig = plot_history(runs)
    assert [line.get_label() for line in fig.axes[0].lines] == [
        "1 device train",
        "2 devices train",
    ]
    assert len(fig.axes[1].lines) == 0


def test_the_package_gives_every_figure():
    """``from multigpu.plots import plot_x`` gives every figure of every module."""
    import importlib
    import pkgutil

    import multigpu.plots as plots

    for module in pkgutil.iter_modules(plots.__path__):
        members = vars(importlib.import_module(f"multigpu.plots.{module.name}"))
        for name in (n for n in members if n.startswith("plot_")):
            assert name in plots.__all__ and getattr(plots, name) is members[name], (
                f"multigpu.plots does not give {module.name}.{name}"
            )

"""Learning curves: loss and accuracy per epoch (01)."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from multigpu.core.train import History


def plot_history(
    histories: History | Mapping[str, History], title: str | None = None
) -> Figure:
    """Loss and accuracy per epoch; several runs side by side when given a dict (01)."""
    runs = histories if isinstance(histories, Mapping) else {"": histories}
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(9, 3.2))
    for label, history in runs.items():
        prefix = f"{label} " if label else ""
        epochs = range(1, len(history.train_loss) + 1)
        ax_loss.plot(epochs, history.train_loss, marker="o", label=f"{prefix}train")
        if history.test_loss:
            ax_loss.plot(
                epochs, history.test_loss, marker="s", ls="--", label=f"{prefix}test"
            )
            ax_acc.plot(
                epochs,
                [100 * a for a in history.test_accuracy],
                marker="s",
                label=f"{prefix}test",
            )
    ax_loss.set(xlabel="epoch", ylabel="cross-entropy", title="loss")
    ax_acc.set(xlabel="epoch", ylabel="accuracy (%)", title="test accuracy")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig

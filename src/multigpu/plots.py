"""Figures: learning curves (01), per-device memory and timelines (02-06), the ring
all-reduce step by step (07).

Every plot_ function returns a matplotlib Figure; in a notebook it is shown once.
"""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .collectives import all_gather_send_chunk, reduce_scatter_send_chunk
from .train import History


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


def _byte_unit(largest: float) -> tuple[float, str]:
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if largest >= scale:
            return scale, unit
    return 1, "bytes"


def plot_memory(
    ledger: Mapping[str, Mapping[str, int]], title: str | None = None
) -> Figure:
    """Bytes per device as stacked bars, one colour per category, from a
    ``multigpu.dataparallel.Recorder.ledger`` (device -> category -> bytes). The
    bars sum everything the step created: an upper bound on the peak (03)."""
    devices = list(ledger)
    categories: list[str] = []
    for per_device in ledger.values():
        categories += [c for c in per_device if c not in categories]
    # one fixed colour per category, so two charts of one notebook match
    colours = {c: plt.get_cmap("tab10")(i % 10) for i, c in enumerate(categories)}
    largest = max((sum(c.values()) for c in ledger.values()), default=0)
    scale, unit = _byte_unit(largest)
    fig, ax = plt.subplots(figsize=(1.2 * len(devices) + 3.5, 3.2))
    bottoms = [0.0] * len(devices)
    for category in categories:
        heights = [ledger[d].get(category, 0) / scale for d in devices]
        if not any(heights):
            continue
        ax.bar(
            devices,
            heights,
            bottom=bottoms,
            label=category,
            width=0.6,
            color=colours[category],
        )
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set(
        ylabel=f"created in one step ({unit})",
        title=title or "memory per device (sum over one step)",
    )
    ax.grid(axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()  # top of the stack first
    ax.legend(
        handles[::-1],
        labels[::-1],
        loc="center left",
        bbox_to_anchor=(1.0, 0.5),
        fontsize="small",
    )
    fig.tight_layout()
    return fig


def _device_order(name: str) -> tuple[str, int]:
    """Sort key: "gpu:2" before "gpu:10" (by kind, then by number)."""
    kind, _, number = name.partition(":")
    return kind, int(number) if number.isdigit() else -1


def plot_timeline(events: list, title: str | None = None) -> Figure:
    """One lane per device, one bar per event (``device, name, start, end``; e.g.
    ``Recorder.events``), coloured by event name, time in ms (06)."""
    devices = sorted({e.device for e in events}, key=_device_order)
    names: list[str] = []
    for e in events:
        if e.name not in names:
            names.append(e.name)
    colours = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(names)}
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(devices) + 1.6))
    for lane, device in enumerate(devices):
        for e in events:
            if e.device == device:
                width = max(1000 * (e.end - e.start), 1e-3)
                ax.broken_barh(
                    [(1000 * e.start, width)], (lane - 0.35, 0.7), color=colours[e.name]
                )
    for name in names:
        ax.bar(0, 0, color=colours[name], label=name)  # legend entries only
    ax.set_yticks(range(len(devices)), devices)
    ax.invert_yaxis()
    ax.set(xlabel="time since the step started (ms)", title=title or "timeline")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    fig.tight_layout()
    return fig


def ring_states(world_size: int) -> list[dict]:
    """For each step of the ring all-reduce: whose data each (rank, chunk) holds and
    which chunk each rank sends, following the schedule of ``collectives`` (07)."""
    holds = [[{rank} for _ in range(world_size)] for rank in range(world_size)]
    states = []
    phases = (
        ("reduce-scatter", reduce_scatter_send_chunk),
        ("all-gather", all_gather_send_chunk),
    )
    for phase, rule in phases:
        for step in range(world_size - 1):
            sends = [rule(rank, step, world_size) for rank in range(world_size)]
            states.append(
                {
                    "title": f"{phase} step {step + 1}",
                    "holds": [[set(h) for h in row] for row in holds],
                    "sends": sends,
                }
            )
            messages = [set(holds[rank][sends[rank]]) for rank in range(world_size)]
            for rank, chunk in enumerate(sends):
                receiver = holds[(rank + 1) % world_size]
                if phase == "reduce-scatter":
                    receiver[chunk] |= messages[rank]
                else:
                    receiver[chunk] = messages[rank]
    states.append({"title": "done", "holds": holds, "sends": [None] * world_size})
    return states


def plot_ring(world_size: int = 4) -> Figure:
    """One panel per ring step: rows are ranks, columns chunks; the colour and the
    digits say whose data a chunk holds, a red box marks the chunk sent (07)."""
    states = ring_states(world_size)
    figure, axes = plt.subplots(
        1, len(states), figsize=(2.2 * len(states), 2.6), squeeze=False
    )
    for axis, state in zip(axes[0], states, strict=True):
        counts = [[len(h) for h in row] for row in state["holds"]]
        axis.imshow(counts, cmap="Blues", vmin=0, vmax=world_size + 1)
        for rank, row in enumerate(state["holds"]):
            for chunk, holders in enumerate(row):
                label = "".join(str(r) for r in sorted(holders))
                colour = "white" if len(holders) == world_size else "black"
                axis.text(
                    chunk,
                    rank,
                    label,
                    ha="center",
                    va="center",
                    fontsize=8,
                    color=colour,
                )
            chunk = state["sends"][rank]
            if chunk is not None:
                corner = (chunk - 0.5, rank - 0.5)
                axis.add_patch(Rectangle(corner, 1, 1, fill=False, lw=2, ec="red"))
        axis.set_title(state["title"], fontsize=9)
        axis.set_xticks(range(world_size))
        axis.set_yticks(range(world_size))
        axis.set_xlabel("chunk")
    axes[0][0].set_ylabel("rank (sends to rank + 1)")
    figure.tight_layout()
    return figure

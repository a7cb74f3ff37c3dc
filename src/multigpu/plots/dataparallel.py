"""DataParallel figures: its data flow (02), the memory each device holds and the
timeline of a step (03, 06)."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from multigpu.core.checks import check_positive_int


def _byte_unit(largest: float) -> tuple[float, str]:
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if largest >= scale:
            return scale, unit
    return 1, "bytes"


def _stack(ax, devices, categories, heights, colours, scale) -> None:
    """Stacked bars: ``heights[category][i]`` bytes on ``devices[i]``."""
    bottoms = [0.0] * len(devices)
    for category in categories:
        values = [h / scale for h in heights[category]]
        if not any(values):
            continue
        ax.bar(
            devices,
            values,
            bottom=bottoms,
            label=category,
            width=0.6,
            color=colours[category],
        )
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]


def _peak_marks(ax, devices, peak, scale, label) -> None:
    """A black line across each device's bar at its measured peak."""
    ax.scatter(
        devices,
        [peak.get(d, 0) / scale for d in devices],
        marker="_",
        s=900,
        linewidths=2.5,
        color="black",
        zorder=3,
    )
    ax.plot([], [], color="black", linewidth=2.5, label=label)  # the legend's entry


def plot_memory(
    ledger: Mapping[str, Mapping[str, int]],
    title: str | None = None,
    peak: Mapping[str, int] | None = None,
) -> Figure:
    """What one step creates per device, from a ``Recorder.ledger`` (device ->
    category -> bytes): stacked bars, one colour per category, with ``peak``
    (``Recorder.peak``, the most held at once) as a black line if given (03).

    With two or more devices a second panel shows, per category, what each device
    holds beyond the device holding least of it, on its own scale: the extra of
    the output device and of ``device_ids[0]``, which the first panel dwarfs."""
    devices = list(ledger)
    categories: list[str] = []
    for per_device in ledger.values():
        categories += [c for c in per_device if c not in categories]
    # one fixed colour per category, so two charts of one notebook match
    colours = {c: plt.get_cmap("tab10")(i % 10) for i, c in enumerate(categories)}
    heights = {c: [ledger[d].get(c, 0) for d in devices] for c in categories}
    peak = dict(peak or {})
    largest = max([sum(c.values()) for c in ledger.values()] + [*peak.values(), 0])
    scale, unit = _byte_unit(largest)
    panels = 2 if len(devices) > 1 else 1
    width = 1.2 * len(devices) + 1.5
    fig, axes = plt.subplots(
        1, panels, figsize=(panels * width + 2.5, 3.4), squeeze=False
    )
    ax = axes[0][0]
    _stack(ax, devices, categories, heights, colours, scale)
    if peak:
        _peak_marks(ax, devices, peak, scale, "measured peak")
    ax.set(ylabel=unit, title=title or "created in one step, per device")
    if panels == 2:
        extra_ax = axes[0][1]
        extra = {c: [h - min(hs) for h in hs] for c, hs in heights.items()}
        extra_peak = {d: peak[d] - min(peak.values()) for d in peak}
        largest_extra = max(
            [sum(e[i] for e in extra.values()) for i in range(len(devices))]
            + [*extra_peak.values(), 0]
        )
        extra_scale, extra_unit = _byte_unit(largest_extra)
        _stack(extra_ax, devices, categories, extra, colours, extra_scale)
        if peak:
            _peak_marks(extra_ax, devices, extra_peak, extra_scale, "_peak")
        extra_ax.set(
            ylabel=extra_unit, title="extra: each category minus its smallest bar"
        )
        if not largest_extra:  # every device holds the same: an empty panel
            extra_ax.set_ylim(0, 1)
    legend_ax = axes[0][-1]
    handles, labels = [], []
    for axis in (ax, legend_ax):  # every category drawn in either panel
        for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    order = [c for c in categories[::-1] if c in labels]  # top of the stack first
    order += [label for label in labels if label not in order]
    legend_ax.legend(
        [handles[labels.index(label)] for label in order],
        order,
        loc="center left",
        bbox_to_anchor=(1.0, 0.5),
        fontsize="small",
    )
    for axis in axes[0]:
        axis.grid(axis="y", alpha=0.3)
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


def plot_dataparallel_flow(
    chunk_sizes: list[int], device_names: list[str] | None = None
) -> Figure:
    """One DataParallel training step as a diagram, one lane per device: the batch
    scattered in chunks of ``chunk_sizes`` rows (e.g. ``dp.scatter_sizes(10, 4)``),
    the model replicated from the first device, each replica run on its chunk, the
    outputs gathered on the first device for the loss, and backward (dashed)
    summing every replica's gradients into the model's parameters (02)."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    sizes = list(chunk_sizes)
    how_to_fix = "Pass the sizes scatter makes, e.g. dp.scatter_sizes(10, 4)."
    if not sizes:
        raise ValueError(f"plot_dataparallel_flow got no chunks. {how_to_fix}")
    for index, size in enumerate(sizes):
        check_positive_int(f"chunk_sizes[{index}]", size, how_to_fix)
    names = (
        list(device_names) if device_names else [f"gpu:{i}" for i in range(len(sizes))]
    )
    if len(names) != len(sizes):
        raise ValueError(
            f"plot_dataparallel_flow got {len(sizes)} chunks but {len(names)} device "
            "names. Pass one name per chunk, or none for gpu:0, gpu:1, ..."
        )
    batch, lanes = sum(sizes), len(sizes)
    forward, backward = "#1f77b4", "#d62728"
    fig, ax = plt.subplots(figsize=(10, 0.9 * lanes + 2.0))
    ax.set(xlim=(-0.1, 12.8), ylim=(-lanes + 0.2, 2.1))
    ax.axis("off")
    half_w, half_h = 0.75, 0.3

    def box(x: float, y: float, text: str, colour: str = "#eeeeee") -> None:
        corner = (x - half_w, y - half_h)
        ax.add_patch(
            FancyBboxPatch(
                corner,
                2 * half_w,
                2 * half_h,
                boxstyle="round,pad=0.02",
                fc=colour,
                ec="black",
                lw=0.8,
            )
        )
        ax.text(x, y, text, ha="center", va="center", fontsize=8)

    def arrow(start, end, kind: str, head: bool = True) -> None:
        dashed = kind == "backward"
        patch = FancyArrowPatch(
            start,
            end,
            arrowstyle="-|>" if head else "-",
            mutation_scale=10,
            color=backward if dashed else forward,
            ls="--" if dashed else "-",
            lw=1.2,
            shrinkA=0,
            shrinkB=0,
        )
        patch.set_gid(kind)  # what the arrow shows, for tests
        ax.add_patch(patch)

    batch_x, chunk_x, replica_x, output_x, gathered_x, loss_x = (
        0.8,
        2.9,
        5.6,
        8.1,
        10.1,
        11.9,
    )
    middle, model_y = -(lanes - 1) / 2, 1.45
    left_bus, right_bus = replica_x - half_w - 0.4, replica_x + half_w + 0.4
    box(batch_x, middle, f"batch\n{batch} rows")
    box(replica_x, model_y, f"model on {names[0]}\n(its parameters)", "#ffe9b3")
    for lane, (rows, name) in enumerate(zip(sizes, names)):
        y = -lane
        plural = "" if rows == 1 else "s"
        box(chunk_x, y, f"{name}\n{rows} row{plural}")
        box(replica_x, y, f"replica {lane}\non {name}", "#d8e8f5")
        box(output_x, y, f"{name}\n{rows} output{plural}")
        arrow((batch_x + half_w, middle), (chunk_x - half_w, y), "scatter")
        arrow((chunk_x + half_w, y - 0.1), (replica_x - half_w, y - 0.1), "forward")
        arrow((left_bus, y + 0.15), (replica_x - half_w, y + 0.15), "replicate")
        arrow((replica_x + half_w, y - 0.1), (output_x - half_w, y - 0.1), "forward")
        arrow((replica_x + half_w, y + 0.15), (right_bus, y + 0.15), "backward", False)
        arrow((output_x + half_w, y), (gathered_x - half_w, middle), "gather")
    bottom = -(lanes - 1) + 0.15
    ax.plot(
        [replica_x - half_w, left_bus, left_bus],
        [model_y, model_y, bottom],
        color=forward,
        lw=1.2,
    )
    ax.plot([right_bus, right_bus], [bottom, model_y], color=backward, lw=1.2, ls="--")
    arrow((right_bus, model_y), (replica_x + half_w, model_y), "backward")
    box(gathered_x, middle, f"{names[0]}\n{batch} outputs")
    box(loss_x, middle, f"loss\non {names[0]}", "#f5d8d8")
    arrow((gathered_x + half_w, middle), (loss_x - half_w, middle), "loss")
    label = {"ha": "center", "va": "center", "fontsize": 9, "weight": "bold"}
    top = 1.45
    ax.text((batch_x + chunk_x) / 2, top, "1 scatter", color=forward, **label)
    ax.text(left_bus - 0.9, top + 0.25, "2 replicate", color=forward, **label)
    ax.text((output_x + gathered_x) / 2, top, "4 gather", color=forward, **label)
    ax.text(
        replica_x,
        -lanes + 0.35,
        "3 parallel_apply: one thread per replica",
        color=forward,
        **label,
    )
    ax.text(
        right_bus + 0.2,
        top + 0.25,
        "5 backward: the replicas' gradients\nsummed into the model's .grad",
        color=backward,
        ha="left",
        va="center",
        fontsize=9,
        weight="bold",
    )
    fig.tight_layout()
    return fig

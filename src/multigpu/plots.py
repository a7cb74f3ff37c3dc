"""Figures: learning curves (01), DataParallel's data flow (02), per-device memory
and timelines (03, 06), the ring all-reduce step by step (07), what each rank of a
ZeRO stage holds (13).

Every plot_ function returns a matplotlib Figure; in a notebook it is shown once.
"""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from multigpu.collectives import all_gather_send_chunk, reduce_scatter_send_chunk
from multigpu.core.checks import check_positive_int
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
    """One panel per ring step, the reduce-scatter on the top row and the
    all-gather below it, then the result: rows are ranks, columns chunks; the shade
    and the digits say whose data a chunk holds, a red box marks the chunk each
    rank sends to rank + 1. For 4 ranks it is 9 inches wide, so that it can be
    read at a notebook's width; the empty corner holds the key (07)."""
    states = ring_states(world_size)
    steps = world_size - 1
    columns, rows = steps + 1, 2 if steps else 1  # one phase's steps, then "done"
    panel = 2.25  # inches per panel
    figure, axes = plt.subplots(
        rows, columns, figsize=(panel * columns, panel * rows), squeeze=False
    )
    # Top row: reduce-scatter steps; bottom row: all-gather steps, then "done".
    places = [(0, c) for c in range(steps)] + [(1, c) for c in range(steps)]
    places.append((rows - 1, columns - 1))
    for (row, column), state in zip(places, states, strict=True):
        axis = axes[row][column]
        counts = [[len(h) for h in holds] for holds in state["holds"]]
        axis.imshow(counts, cmap="Blues", vmin=0, vmax=world_size + 1)
        for rank, holds in enumerate(state["holds"]):
            for chunk, holders in enumerate(holds):
                axis.text(
                    chunk,
                    rank,
                    "".join(str(r) for r in sorted(holders)),
                    ha="center",
                    va="center",
                    fontsize=9 if world_size <= 4 else 7,
                    color="white" if len(holders) == world_size else "black",
                )
            chunk = state["sends"][rank]
            if chunk is not None:
                corner = (chunk - 0.5, rank - 0.5)
                axis.add_patch(Rectangle(corner, 1, 1, fill=False, lw=2.5, ec="red"))
        axis.set_title(state["title"], fontsize=10)
        axis.set_xticks(range(world_size))
        axis.set_yticks(range(world_size))
        if row == rows - 1:
            axis.set_xlabel("chunk")
        if column == 0:
            axis.set_ylabel("rank")
    figure.tight_layout()
    if rows == 2:  # the top right corner: the key instead of a panel
        key = axes[0][columns - 1]
        box = key.get_position()
        key.remove()
        figure.text(
            box.x0,
            box.y0 + box.height / 2,
            f"digits: whose data a\nchunk holds ({''.join(map(str, range(world_size)))}"
            f" = sum)\nred box: the chunk a\nrank sends to rank + 1\n"
            f"(rank {world_size - 1} sends to rank 0)",
            va="center",
            fontsize=9,
        )
    return figure


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


def plot_overlap(timelines: dict[str, list[list]], title: str | None = None) -> Figure:
    """Backward and all-reduce lanes per rank, one panel per strategy:
    ``timelines[strategy][rank]`` is a list of events with ``lane`` ("backward" or
    "all-reduce"), ``name``, ``start`` and ``end`` in seconds (e.g.
    ``multigpu.miniddp.Event``); time in ms since the forward began (10)."""
    strategies = list(timelines)
    ranks = max(len(per_rank) for per_rank in timelines.values())
    fig, axes = plt.subplots(
        len(strategies),
        1,
        figsize=(9, (0.6 * 2 * ranks + 0.9) * len(strategies)),
        sharex=True,
        squeeze=False,
    )
    fixed = {"forward": "#bbbbbb", "sync": "#d62728"}
    for ax, strategy in zip(axes[:, 0], strategies):
        labels = []
        for rank, events in enumerate(timelines[strategy]):
            for offset, lane in enumerate(("backward", "all-reduce")):
                row = 2 * rank + offset
                labels.append(f"rank {rank} {lane}")
                spans = [e for e in events if e.lane == lane]
                for k, e in enumerate(spans):
                    colour = fixed.get(
                        e.name,
                        plt.get_cmap("Blues" if lane == "backward" else "Oranges")(
                            0.45 + 0.4 * (k % 2)
                        ),
                    )
                    width = max(1000 * (e.end - e.start), 1e-3)
                    ax.broken_barh(
                        [(1000 * e.start, width)], (row - 0.35, 0.7), color=colour
                    )
        ax.set_yticks(range(len(labels)), labels)
        ax.invert_yaxis()
        ax.set_title(strategy, loc="left", fontsize="medium")
        ax.grid(axis="x", alpha=0.3)
    handles = [
        plt.Rectangle((0, 0), 1, 1, color=c)
        for c in ("#bbbbbb", plt.get_cmap("Blues")(0.65), "#d62728")
    ] + [plt.Rectangle((0, 0), 1, 1, color=plt.get_cmap("Oranges")(0.65))]
    axes[0, 0].legend(
        handles,
        [
            "forward",
            "backward, layer by layer",
            "end of backward: finish, copy to .grad",
            "all-reduce",
        ],
        loc="lower left",
        bbox_to_anchor=(0.0, 1.08),
        ncol=4,
        fontsize="small",
    )
    axes[-1, 0].set_xlabel("time since the forward began (ms)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_buckets(layout: list[list[str]], sizes: dict[str, int]) -> Figure:
    """Which parameter fell in which bucket: one bar per bucket, split into its
    parameters (width: bytes), in the order they fill it (10)."""
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(layout) + 1.2))
    cmap = plt.get_cmap("tab20")
    k = 0
    for row, names in enumerate(layout):
        left = 0
        for name in names:
            width = sizes[name] / 1024
            ax.barh(row, width, left=left, color=cmap(k % 20), edgecolor="white")
            if width > 0.08 * max(sum(sizes[n] for n in b) for b in layout) / 1024:
                ax.text(
                    left + width / 2, row, name, ha="center", va="center", fontsize=7
                )
            left += width
            k += 1
    ax.set_yticks(range(len(layout)), [f"bucket {i}" for i in range(len(layout))])
    ax.invert_yaxis()
    ax.set(xlabel="KiB", title="buckets, filled left to right")
    fig.tight_layout()
    return fig


def plot_alpha_beta_fit(
    rows_by_world: Mapping[int, list[dict]], fits: Mapping[int, tuple[float, float]]
) -> Figure:
    """Measured all-reduce times (points) and the fitted α-β lines, one colour per
    world size, against the tensor size on log axes (12)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for k, (world_size, rows) in enumerate(sorted(rows_by_world.items())):
        colour = f"C{k}"
        sizes = [row["bytes"] for row in rows]
        ax.loglog(
            sizes,
            [1e3 * row["seconds"] for row in rows],
            "o",
            color=colour,
            label=f"{world_size} ranks, measured",
        )
        alpha, bandwidth = fits[world_size]
        steps = 2 * (world_size - 1)
        grid = [min(sizes) * (max(sizes) / min(sizes)) ** (i / 50) for i in range(51)]
        model = [
            1e3 * (steps * alpha + steps / world_size * size / bandwidth)
            for size in grid
        ]
        ax.loglog(
            grid,
            model,
            "-",
            color=colour,
            label=f"fit: α = {1e6 * alpha:.0f} µs, B = {bandwidth / 1e9:.2f} GB/s",
        )
    ax.set(xlabel="tensor bytes", ylabel="all-reduce ms", title="α-β fit")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_speedups(
    curves: Mapping[str, tuple[list[int], list[float]]], title: str | None = None
) -> Figure:
    """Speed-up against devices, one line per labelled curve, with the ideal
    speed-up (the diagonal) for reference (12)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    largest = max(max(sizes) for sizes, _ in curves.values())
    ax.plot([1, largest], [1, largest], ":", color="grey", label="ideal (N)")
    for label, (sizes, speedups) in curves.items():
        ax.plot(sizes, speedups, "o-", markersize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set(xlabel="devices", ylabel="speed-up over one device", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


LEDGER_COLOURS = {
    "parameters": "tab:blue",
    "gradients": "tab:orange",
    "optimizer": "tab:green",
    "gathered": "tab:gray",
}


def plot_zero_ledgers(
    panels: Mapping[str, Mapping[str, Mapping[str, float]]],
    ylabel: str = "bytes per parameter",
) -> Figure:
    """Stacked bars of what a rank holds, one panel per title:
    ``{title: {bar label: ledger}}``, each ledger ``{category: amount}`` as
    ``zero.measure_ledger`` and ``costmodel.zero_memory_ledger`` return it (the
    categories in the order of the first ledger, a missing one counting 0); the
    panels share the y axis, labelled ``ylabel`` (13)."""
    categories: list[str] = []
    for bars in panels.values():
        for ledger in bars.values():
            categories += [c for c in ledger if c not in categories]
    palette = iter(plt.rcParams["axes.prop_cycle"].by_key()["color"])
    colours = {c: LEDGER_COLOURS.get(c) or next(palette) for c in categories}
    fig, axes = plt.subplots(
        1, len(panels), figsize=(3.4 * len(panels), 3.4), sharey=True, squeeze=False
    )
    for ax, (title, bars) in zip(axes[0], panels.items()):
        labels = list(bars)
        bottoms = [0.0] * len(labels)
        for category in categories:
            heights = [bars[label].get(category, 0.0) for label in labels]
            ax.bar(
                labels, heights, bottom=bottoms, color=colours[category], label=category
            )
            bottoms = [b + h for b, h in zip(bottoms, heights)]
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=30)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    handles = [Rectangle((0, 0), 1, 1, color=colours[c]) for c in categories]
    axes[0][-1].legend(handles, categories, fontsize="small")
    fig.tight_layout()
    return fig

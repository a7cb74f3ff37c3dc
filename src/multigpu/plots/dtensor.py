"""DTensor's placements and device meshes, drawn (13; the mesh also in 14b)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle

_PARTIAL_COLOUR = "0.85"  # a partial sum: grey, hatched
_GROUP_COLOURS = ("tab:red", "tab:blue")  # groups along the last dim, the first


def _cell(ax, x: float, y: float, value: float, colour, hatch: str | None = None):
    ax.add_patch(
        Rectangle((x, y), 1, 1, facecolor=colour, edgecolor="black", hatch=hatch)
    )
    ax.text(x + 0.5, y + 0.5, f"{value:g}", ha="center", va="center", fontsize=8)


def _chunk_ranges(numel: int, world_size: int) -> list[range]:
    """The elements each rank holds under Shard(0): ``torch.chunk``'s cut, chunks of
    ceil(numel / world_size), the last ones shorter or empty."""
    size = math.ceil(numel / world_size)
    return [
        range(min(r * size, numel), min((r + 1) * size, numel))
        for r in range(world_size)
    ]


def plot_placements(
    values: Sequence[float],
    world_size: int,
    partials: Sequence[Sequence[float]] | None = None,
) -> Figure:
    """One panel per placement of a 1-D tensor ``values`` on a 1-D mesh of
    ``world_size`` ranks: its top row is the tensor, the rows below what each rank's
    ``to_local()`` holds, each element at its place in the tensor. Shard(0) cuts as
    ``torch.chunk`` does, Replicate() gives every rank all of it; with ``partials``
    (each rank's local tensor, by rank) a third panel shows Partial(): every rank
    holds a whole tensor (hatched) and the tensor is their sum (13)."""
    if world_size < 1 or not values:
        raise ValueError(
            f"plot_placements needs values and world_size >= 1, got {len(values)} "
            f"values and world_size={world_size}."
        )
    if partials is not None and len(partials) != world_size:
        raise ValueError(
            f"partials holds {len(partials)} ranks' tensors for {world_size} ranks. "
            "Pass one local tensor per rank, by rank."
        )
    palette = plt.get_cmap("tab20")
    colours = [palette(i % 20) for i in range(len(values))]
    panels = [
        (
            "Shard(0), printed S(0)",
            values,
            [
                [(i, values[i]) for i in part]
                for part in _chunk_ranges(len(values), world_size)
            ],
        ),
        (
            "Replicate(), printed R",
            values,
            [list(enumerate(values)) for _ in range(world_size)],
        ),
    ]
    if partials is not None:
        total = [sum(column) for column in zip(*partials)]
        panels.append(
            ("Partial(), printed P(sum)", total, [list(enumerate(p)) for p in partials])
        )
    widths = [len(tensor) for _, tensor, _ in panels]
    fig, axes = plt.subplots(
        1,
        len(panels),
        figsize=(0.42 * sum(widths) + 1.2 * len(panels), 0.45 * world_size + 1.3),
        gridspec_kw={"width_ratios": widths},
        squeeze=False,
    )
    for ax, (title, tensor, held) in zip(axes[0], panels):
        partial = title.startswith("Partial")
        for i, value in enumerate(tensor):
            _cell(ax, i, 0, value, "white" if partial else colours[i])
        for rank, pieces in enumerate(held):
            for i, value in pieces:
                colour = _PARTIAL_COLOUR if partial else colours[i]
                _cell(ax, i, rank + 1.5, value, colour, "//" if partial else None)
        ax.set_xlim(-0.2, len(tensor) + 0.2)
        ax.set_ylim(world_size + 1.7, -0.2)
        ax.set_yticks([0.5] + [rank + 2.0 for rank in range(world_size)])
        ax.set_yticklabels(["tensor"] + [f"rank {r}" for r in range(world_size)])
        ax.set_xticks([])
        ax.set_title(title, fontsize=10)
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def plot_mesh(
    shape: Sequence[int],
    dim_names: Sequence[str],
    labels: Sequence[str] | None = None,
    title: str | None = None,
) -> Figure:
    """A 1-D or 2-D device mesh of ``shape`` (ranks numbered row by row, as
    ``init_device_mesh`` numbers them), axes named by ``dim_names``; each box is a
    rank, with ``labels[rank]`` under its number if given. The process groups are
    outlined: along the last dim each row is one group (``mesh[dim_names[-1]]``),
    along the first dim of a 2-D mesh each column (13, 14b)."""
    shape = tuple(int(size) for size in shape)
    if len(shape) not in (1, 2) or min(shape, default=0) < 1:
        raise ValueError(
            f"plot_mesh draws 1-D or 2-D meshes of positive sizes, got {shape}. "
            "Pass e.g. shape=(2, 4)."
        )
    if len(dim_names) != len(shape):
        raise ValueError(
            f"dim_names {tuple(dim_names)} name {len(dim_names)} dims for a mesh of "
            f"{len(shape)}. Pass one name per dim, e.g. ('replicate', 'shard')."
        )
    ranks = math.prod(shape)
    if labels is not None and len(labels) != ranks:
        raise ValueError(
            f"labels holds {len(labels)} strings for {ranks} ranks. Pass one per "
            "rank, by rank, or None."
        )
    rows, columns = (1, shape[0]) if len(shape) == 1 else shape
    fig, ax = plt.subplots(figsize=(1.7 * columns + 1.6, 1.2 * rows + 2.0))
    for rank in range(ranks):
        row, column = divmod(rank, columns)
        ax.add_patch(
            Rectangle(
                (column + 0.12, row + 0.15), 0.76, 0.7, facecolor="white", ec="black"
            )
        )
        text = f"rank {rank}" + (f"\n{labels[rank]}" if labels is not None else "")
        ax.text(column + 0.5, row + 0.5, text, ha="center", va="center", fontsize=9)
    groups = [
        (
            _GROUP_COLOURS[0],
            f"{dim_names[-1]} group: " + ("a row" if len(shape) == 2 else "every rank"),
            [(0.07, row + 0.07, columns - 0.14, 0.86) for row in range(rows)],
        )
    ]
    if len(shape) == 2:
        groups.append(
            (
                _GROUP_COLOURS[1],
                f"{dim_names[0]} group: a column",
                [(c + 0.03, 0.03, 0.94, rows - 0.06) for c in range(columns)],
            )
        )
    for colour, name, boxes in groups:
        for index, (x, y, width, height) in enumerate(boxes):
            ax.add_patch(
                FancyBboxPatch(
                    (x, y),
                    width,
                    height,
                    boxstyle="round,pad=0,rounding_size=0.08",
                    fill=False,
                    edgecolor=colour,
                    linewidth=2,
                    linestyle="-" if colour == _GROUP_COLOURS[0] else "--",
                    label=name if index == 0 else None,
                )
            )
    ax.set_xlim(-0.05, columns + 0.05)
    ax.set_ylim(rows + 0.05, -0.05)
    ax.set_xticks([c + 0.5 for c in range(columns)], [str(c) for c in range(columns)])
    ax.set_xlabel(f"{dim_names[-1]} (dim {len(shape) - 1})")
    if len(shape) == 2:
        ax.set_yticks([r + 0.5 for r in range(rows)], [str(r) for r in range(rows)])
        ax.set_ylabel(f"{dim_names[0]} (dim 0)")
    else:
        ax.set_yticks([])
    ax.set_aspect("equal")
    ax.set_title(title or f"device mesh {shape}, dims {tuple(dim_names)}", fontsize=10)
    fig.legend(loc="lower center", ncol=len(groups), fontsize="small")
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig

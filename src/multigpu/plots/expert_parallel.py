"""Expert parallelism's figures: where each token goes, how many rows each rank
sends each rank, and how many tokens each expert and rank gets (18)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from multigpu.expert_parallel import experts_per_rank, imbalance, tokens_per_rank

EXPERT_COLOURS = (
    "#4c72b0", "#dd8452", "#55a868", "#c44e52",
    "#8172b3", "#937860", "#da8bc3", "#8c8c8c",
)  # fmt: skip
DROPPED_COLOUR = "#bbbbbb"
DROPPED = "dropped: its expert was full"


def _colour(expert: int) -> str:
    return EXPERT_COLOURS[expert % len(EXPERT_COLOURS)]


def _expert_labels(num_experts: int, local: int) -> list[str]:
    return [f"{e}\n(rank {e // local})" for e in range(num_experts)]


def _rank_box(axis, x: float, y0: float, y1: float, label: str) -> None:
    axis.add_patch(
        Rectangle(
            (x - 0.09, y0 - 0.45), 0.18, y1 - y0 + 0.9,
            facecolor="#f4f4f4", edgecolor="#999999",
        )
    )  # fmt: skip
    axis.text(x, y0 - 0.7, label, ha="center", va="bottom", fontsize=9)


def _draw_routing(axis, experts_per_rank, kept_per_rank, num_experts: int) -> None:
    world = len(experts_per_rank)
    local = num_experts // world
    token_y, y = [], 0.0
    for rank, route in enumerate(experts_per_rank):
        start = y
        token_y.append([start + i for i in range(len(route))])
        y += max(len(route), 1) + 1.5
        _rank_box(axis, 0.0, start, start + max(len(route) - 1, 0), f"rank {rank}")
    height = y - 1.5
    expert_y = {}
    for rank in range(world):
        first = rank * height / world
        for j in range(local):
            expert_y[rank * local + j] = first + (j + 0.5) * height / world / local
        ys = [expert_y[rank * local + j] for j in range(local)]
        _rank_box(axis, 1.0, min(ys), max(ys), f"rank {rank}")
    for rank, route in enumerate(experts_per_rank):
        kept = kept_per_rank[rank]
        for i, expert in enumerate(route):
            stays = expert // local == rank
            axis.plot(
                [0.05, 0.95],
                [token_y[rank][i], expert_y[expert]],
                color=_colour(expert) if kept[i] else DROPPED_COLOUR,
                linestyle=(":" if stays else "-") if kept[i] else "--",
                linewidth=1.5,
            )
            axis.plot(0.0, token_y[rank][i], "s", color=_colour(expert), markersize=7)
    for expert, ey in expert_y.items():
        axis.plot(1.0, ey, "o", color=_colour(expert), markersize=12)
        axis.text(1.12, ey, f"expert {expert}", va="center", fontsize=8)
    styles = [("-", "to another rank"), (":", "stays on its rank")]
    styles += [("--", "dropped")] if not all(map(all, kept_per_rank)) else []
    handles = [
        Line2D([], [], color="black", linestyle=style, label=label)
        for style, label in styles
    ]
    axis.legend(handles=handles, loc="lower center", fontsize=8, frameon=False,
                bbox_to_anchor=(0.5, -0.12), ncol=len(handles))  # fmt: skip
    axis.set_xlim(-0.3, 1.45)
    axis.set_ylim(height + 0.8, -1.6)
    axis.axis("off")
    axis.set_title("tokens (by their expert's colour) -> experts", fontsize=10)


def plot_token_routing(
    experts_per_rank: Sequence[Sequence[int]],
    num_experts: int,
    kept_per_rank: Sequence[Sequence[bool]] | None = None,
) -> Figure:
    """Left: each rank's tokens and the expert each goes to (solid: to another rank;
    dotted: stays; grey dashed: dropped, its expert full); right: the tokens each
    expert computes and drops, by the rank that holds it (18)."""
    kept = kept_per_rank or [[True] * len(route) for route in experts_per_rank]
    figure, (left, right) = plt.subplots(
        1, 2, figsize=(10, 4.2), gridspec_kw={"width_ratios": [1.3, 1]}
    )
    _draw_routing(left, experts_per_rank, kept, num_experts)
    computed, dropped = [0] * num_experts, [0] * num_experts
    for route, flags in zip(experts_per_rank, kept, strict=True):
        for expert, flag in zip(route, flags, strict=True):
            (computed if flag else dropped)[expert] += 1
    experts = range(num_experts)
    colours = [_colour(e) for e in experts]
    right.bar(experts, computed, color=colours, label="computed")
    right.bar(experts, dropped, bottom=computed, color=DROPPED_COLOUR, label=DROPPED)
    world = len(experts_per_rank)
    local = num_experts // world
    right.set_xticks(list(experts), _expert_labels(num_experts, local), fontsize=8)
    right.yaxis.set_major_locator(MaxNLocator(integer=True))
    right.set_xlabel("expert")
    right.set_ylabel("tokens")
    right.set_title("load per expert", fontsize=10)
    if any(dropped):  # the bars' colours are the experts' (the ticks name them)
        right.legend(handles=[Patch(color=DROPPED_COLOUR, label=DROPPED)], fontsize=8)
    figure.tight_layout()
    return figure


def plot_send_table(sent: Sequence[Sequence[int]]) -> Figure:
    """The rows each rank sends each rank, ``sent[s][r]`` (ep, ep): row s is what
    rank s sends (its input split sizes, which it counts itself), column r what
    rank r receives (its output split sizes, which the other ranks hold) (18)."""
    world = len(sent)
    figure, axis = plt.subplots(figsize=(1.2 * world + 3.4, 0.8 * world + 1.2))
    axis.imshow([list(row) for row in sent], cmap="Blues", vmin=0,
                vmax=2 * max(max(row) for row in sent) or 1)  # fmt: skip
    for s, row in enumerate(sent):
        for r, rows in enumerate(row):
            axis.text(r, s, str(rows), ha="center", va="center", fontsize=12)
    axis.set_xticks(range(world), [f"to rank {r}" for r in range(world)])
    axis.set_yticks(range(world), [f"from rank {s}" for s in range(world)])
    axis.xaxis.tick_top()
    axis.set_xlabel("column r: rank r's output_split_sizes (the others know them)")
    axis.set_ylabel("row s: rank s's\ninput_split_sizes\n(it counts them)")
    figure.tight_layout()
    return figure


def plot_load_balance(
    histories: Mapping[str, Sequence[Sequence[int]]], ep_size: int
) -> Figure:
    """Left: the busiest expert's tokens over the mean (solid) and the busiest
    rank's (dashed), step by step, for each run (name -> tokens per expert at each
    step); right: tokens per expert at the first step and at the last step of each
    run, labelled with the rank that holds each expert (18)."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    for k, (name, per_step) in enumerate(histories.items()):
        colour = f"C{k}"
        left.plot([imbalance(loads) for loads in per_step], colour, label=name)
        by_rank = [imbalance(tokens_per_rank(loads, ep_size)) for loads in per_step]
        left.plot(by_rank, colour, linestyle="--", label=f"{name}, per rank")
    left.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
    left.set_xlabel("step")
    left.set_ylabel("max / mean tokens")
    left.set_title(f"per expert (solid), per rank of {ep_size} (dashed)", fontsize=10)
    left.legend(fontsize=8)
    # each run's bars in its curves' colour; the common start in grey
    bars = [("start", next(iter(histories.values()))[0], "0.6")]
    bars += [
        (f"{name}, end", per_step[-1], f"C{k}")
        for k, (name, per_step) in enumerate(histories.items())
    ]
    num_experts = len(bars[0][1])
    width = 0.8 / len(bars)
    for k, (label, loads, colour) in enumerate(bars):
        offset = (k - (len(bars) - 1) / 2) * width
        xs = [e + offset for e in range(num_experts)]
        right.bar(xs, loads, width, label=label, color=colour)
    local = experts_per_rank(num_experts, ep_size)
    right.set_xticks(range(num_experts), _expert_labels(num_experts, local))
    right.set_xlabel("expert")
    right.set_ylabel("tokens routed to it")
    right.legend(fontsize=8)
    figure.tight_layout()
    return figure

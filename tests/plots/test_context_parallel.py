"""Tests for multigpu.plots.context_parallel: a panel per ring step with each rank's
blocks (a block on the diagonal: computed whole, needed below its staircase), the
ring's backward with the gradients' shares as they travel, the two layouts with the
products each rank needs and computes, and Ulysses' tokens x heads grids."""

import matplotlib.pyplot as plt

from multigpu.context_parallel import make_attention_case, simulate_ring_attention
from multigpu.plots.context_parallel import (
    plot_layouts,
    plot_ring_backward,
    plot_ring_steps,
    plot_ulysses_layout,
)


def records(layout, causal):
    case = make_attention_case(16, causal=causal)
    return simulate_ring_attention(case.q, case.k, case.v, 4, layout, causal)[1]


def test_plot_ring_steps_draws_every_block_of_every_step():
    zigzag = records("zigzag", True)
    figure = plot_ring_steps(zigzag, 16)
    assert [axis.get_title() for axis in figure.axes] == [
        "step 0", "step 1", "step 2", "step 3"
    ]  # fmt: skip
    for step, axis in enumerate(figure.axes):
        blocks = [b for r in zigzag for b in r.blocks if b.step == step]
        diagonal = sum(1 for b in blocks if b.kind == "causal")
        # a shape and its outline per block; a diagonal block also its pale whole
        assert len(axis.patches) == 2 * len(blocks) + diagonal
    labels = [text.get_text() for text in figure.legends[0].get_texts()]
    assert labels == [
        "rank 0", "rank 1", "rank 2", "rank 3", "computed, then masked", "skipped"
    ]  # fmt: skip
    plt.close(figure)


def test_plot_ring_backward_fills_each_blocks_share_once_per_step():
    for causal in (False, True):
        contiguous = records("contiguous", causal)
        figure = plot_ring_backward(contiguous)
        panels = [a for a in figure.axes if a.get_title()]
        assert [a.get_title() for a in panels] == [
            "step 0", "step 1", "step 2", "step 3", "home"
        ]  # fmt: skip
        kinds = [b.kind for r in contiguous for b in r.blocks]
        steps = [b.step for r in contiguous for b in r.blocks]
        for panel, axis in enumerate(panels[:4]):
            assert len(axis.patches) == 4 * (panel + 1)  # a share per rank and step
            full = [p for p in axis.patches if p.get_alpha() == 1.0]
            skipped_before = sum(
                1 for k, s in zip(kinds, steps) if k == "skip" and s < panel
            )
            assert len(full) == 4 + skipped_before  # this step's shares stand out
        assert len(panels[4].patches) == 16  # home: every share added
        grey = [p for p in panels[4].patches if p.get_hatch() == "//"]
        assert len(grey) == kinds.count("skip")
        plt.close(figure)


def test_plot_layouts_colours_each_query_row_by_its_rank_and_bars_the_work():
    needed = {"contiguous": [10, 26, 42, 58], "zigzag": [34, 34, 34, 34]}
    computed = {"contiguous": [16, 32, 48, 64], "zigzag": [36, 36, 36, 36]}
    figure = plot_layouts(16, 4, needed, computed)
    top_left, top_right, bottom_left, bottom_right = figure.axes
    assert (top_left.get_title(), top_right.get_title()) == ("contiguous", "zigzag")
    matrix = top_right.images[0].get_array()
    assert matrix[0][0] == 1 and matrix[15][0] == 1  # positions 0 and 15: rank 0
    assert matrix[0][1] == 0  # the future: masked
    for axis, layout in ((bottom_left, "contiguous"), (bottom_right, "zigzag")):
        heights = [p.get_height() for p in axis.patches]
        assert heights[:4] == needed[layout]  # solid: needed
        tops = [p.get_y() + p.get_height() for p in axis.patches[4:]]
        assert tops == computed[layout]  # pale on top: computed, then masked
        labels = [t.get_text() for t in axis.texts]
        assert labels == [
            f"{n} / {c}" for n, c in zip(needed[layout], computed[layout])
        ]
    plt.close(figure)


def test_plot_ulysses_layout_gives_each_rank_its_tokens_then_its_heads():
    figure = plot_ulysses_layout(seq_len=4, heads=4, world_size=2)
    before, after = figure.axes[:2]
    assert before.get_title().startswith("before") and after.get_title().startswith(
        "after"
    )
    colours = {}
    for axis in (before, after):
        cells = {
            (int(p.get_x()), int(p.get_y())): p.get_facecolor() for p in axis.patches
        }
        colours[axis.get_title()[:5]] = cells
    rank0 = colours["befor"][(0, 0)]
    assert colours["befor"][(3, 1)] == rank0  # tokens 0-1, every head: rank 0
    assert colours["befor"][(0, 2)] != rank0
    assert colours["after"][(1, 3)] == rank0  # heads 0-1, every token: rank 0
    assert colours["after"][(2, 0)] != rank0
    assert [t.get_text() for t in after.texts][:4] == ["r0", "r0", "r0", "r0"]
    plt.close(figure)

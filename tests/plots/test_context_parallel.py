"""Tests for multigpu.plots.context_parallel: a panel per ring step with each rank's
blocks, and the two layouts with their work per rank."""

import matplotlib.pyplot as plt

from multigpu.context_parallel import make_attention_case, simulate_ring_attention
from multigpu.plots.context_parallel import plot_layouts, plot_ring_steps


def test_plot_ring_steps_draws_every_block_of_every_step():
    case = make_attention_case(16, causal=True)
    _, records = simulate_ring_attention(case.q, case.k, case.v, 4, "zigzag", True)
    figure = plot_ring_steps(records, 16)
    assert [axis.get_title() for axis in figure.axes] == [
        "step 0", "step 1", "step 2", "step 3"
    ]  # fmt: skip
    for step, axis in enumerate(figure.axes):
        met = sum(1 for r in records for b in r.blocks if b.step == step)
        assert len(axis.patches) == 2 * met  # a shape and its outline per block
    labels = [text.get_text() for text in figure.legends[0].get_texts()]
    assert labels == ["rank 0", "rank 1", "rank 2", "rank 3", "skipped"]
    plt.close(figure)


def test_plot_layouts_colours_each_query_row_by_its_rank_and_bars_the_work():
    work = {"contiguous": [16, 32, 48, 64], "zigzag": [36, 36, 36, 36]}
    figure = plot_layouts(16, 4, work)
    top_left, top_right, bottom_left, bottom_right = figure.axes
    assert (top_left.get_title(), top_right.get_title()) == ("contiguous", "zigzag")
    matrix = top_right.images[0].get_array()
    assert matrix[0][0] == 1 and matrix[15][0] == 1  # positions 0 and 15: rank 0
    assert matrix[0][1] == 0  # the future: masked
    assert [p.get_height() for p in bottom_left.patches] == work["contiguous"]
    assert [p.get_height() for p in bottom_right.patches] == work["zigzag"]
    plt.close(figure)

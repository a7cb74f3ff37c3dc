"""Tests of plot_placements and plot_mesh (13, 14b)."""

import matplotlib.pyplot as plt
import pytest
from matplotlib.patches import FancyBboxPatch, Rectangle

from multigpu.plots.dtensor import plot_mesh, plot_placements

PARTIALS = [[0, 1, 2, 3], [8, 10, 12, 14], [24, 27, 30, 33], [48, 52, 56, 60]]


def _cells(ax):
    """(row, first element) -> the value written in the cell, from the patches and
    their texts: row 0 is the tensor, row r + 1 rank r."""
    texts = {
        (round(t.get_position()[0] - 0.5), t.get_position()[1]): t.get_text()
        for t in ax.texts
    }
    cells = {}
    for patch in ax.patches:
        x, y = patch.get_xy()
        row = 0 if y == 0 else round(y - 0.5)
        cells[(row, round(x))] = texts[(round(x), y + 0.5)]
    return cells


def test_placements_draw_the_tensor_and_each_ranks_local_piece():
    fig = plot_placements(list(range(10)), 4, partials=PARTIALS)
    shard, replicate, partial = fig.axes
    assert [ax.get_title() for ax in fig.axes] == [
        "Shard(0), printed S(0)",
        "Replicate(), printed R",
        "Partial(), printed P(sum)",
    ]
    labels = ["tensor", "rank 0", "rank 1", "rank 2", "rank 3"]
    for ax in fig.axes:
        assert [t.get_text() for t in ax.get_yticklabels()] == labels
        assert all(isinstance(p, Rectangle) for p in ax.patches)
    # Shard(0): the tensor, then torch.chunk's 3 + 3 + 3 + 1 elements
    assert len(shard.patches) == 10 + 10
    cells = _cells(shard)
    assert [x for (row, x) in cells if row == 4] == [9]  # rank 3 holds only 9
    assert [x for (row, x) in sorted(cells) if row == 1] == [0, 1, 2]
    # Replicate(): every rank holds all ten
    assert len(replicate.patches) == 10 + 4 * 10
    assert {cells_row for (cells_row, _) in _cells(replicate)} == {0, 1, 2, 3, 4}
    # Partial(): every rank a whole tensor of partial sums, hatched; the tensor is
    # their sum
    assert len(partial.patches) == 4 + 4 * 4
    cells = _cells(partial)
    assert [cells[(0, x)] for x in range(4)] == ["80", "90", "100", "110"]
    assert cells[(2, 3)] == "14"
    hatched = [p for p in partial.patches if p.get_hatch()]
    assert len(hatched) == 16
    plt.close(fig)


def test_placements_without_partials_have_two_panels_and_refuse_bad_input():
    fig = plot_placements([1.5, 2.5, 3.5], 2)
    assert len(fig.axes) == 2
    assert len(fig.axes[0].patches) == 3 + 3  # chunks of 2 and 1
    plt.close(fig)
    with pytest.raises(ValueError, match="one local tensor per rank"):
        plot_placements([1, 2], 2, partials=[[1, 2]])
    with pytest.raises(ValueError, match="world_size >= 1"):
        plot_placements([], 2)


def test_mesh_draws_one_box_per_rank_and_outlines_its_groups():
    labels = [f"node {r // 4}, GPU {r % 4}" for r in range(8)]
    fig = plot_mesh((2, 4), ("replicate", "shard"), labels=labels)
    (ax,) = fig.axes
    boxes = [p for p in ax.patches if type(p) is Rectangle]
    groups = [p for p in ax.patches if isinstance(p, FancyBboxPatch)]
    assert len(boxes) == 8
    assert len(groups) == 2 + 4  # a row per shard group, a column per replicate
    texts = [t.get_text() for t in ax.texts]
    assert texts[5] == "rank 5\nnode 1, GPU 1"
    # rank 5 sits in row 1, column 1: ranks are numbered row by row
    (five,) = [t for t in ax.texts if t.get_text().startswith("rank 5")]
    assert five.get_position() == (1.5, 1.5)
    assert ax.get_xlabel() == "shard (dim 1)"
    assert ax.get_ylabel() == "replicate (dim 0)"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["shard group: a row", "replicate group: a column"]
    assert ax.get_title() == "device mesh (2, 4), dims ('replicate', 'shard')"
    plt.close(fig)


def test_a_one_dimensional_mesh_is_one_group_and_bad_meshes_are_refused():
    fig = plot_mesh([4], ["world"], title="all the ranks")
    (ax,) = fig.axes
    assert len([p for p in ax.patches if type(p) is Rectangle]) == 4
    assert len([p for p in ax.patches if isinstance(p, FancyBboxPatch)]) == 1
    assert ax.get_title() == "all the ranks"
    assert ax.get_xlabel() == "world (dim 0)"
    plt.close(fig)
    with pytest.raises(ValueError, match="one name per dim"):
        plot_mesh((2, 2), ("dp",))
    with pytest.raises(ValueError, match="1-D or 2-D"):
        plot_mesh((2, 2, 2), ("a", "b", "c"))
    with pytest.raises(ValueError, match="one per rank"):
        plot_mesh((2, 2), ("dp", "tp"), labels=["a"])

"""Tests of multigpu.plots.tensor_parallel: each figure draws what each rank holds
(read back from the patches' gids) and names the collectives where it should (15)."""

import matplotlib.pyplot as plt
import pytest

from multigpu.plots.tensor_parallel import (
    plot_2d_mesh,
    plot_column_row_cut,
    plot_sequence_parallel,
)


def patches(figure):
    """gid -> patch, for every named patch of the figure's one axes."""
    (ax,) = figure.axes
    return {p.get_gid(): p for p in ax.patches if p.get_gid()}


def texts(figure):
    return [t.get_text() for t in figure.axes[0].texts]


def bounds(patch):
    x, y = patch.get_xy() if hasattr(patch, "get_xy") else (patch.get_x(), 0)
    return round(x, 6), round(y, 6), patch.get_width(), patch.get_height()


@pytest.mark.parametrize("world_size", [2, 4])
def test_column_row_cut_gives_each_rank_rows_of_fc1_and_columns_of_fc2(world_size):
    figure = plot_column_row_cut(world_size)
    named = patches(figure)
    fc1_tops, fc2_lefts = [], []
    for rank in range(world_size):
        x, y, w, h = bounds(named[f"fc1 outline rank {rank}"])
        bx, by, bw, bh = bounds(named[f"fc1 rank {rank}"])
        assert (bx, bw) == (x, w)  # whole rows: every input feature
        assert bh == pytest.approx(h / world_size)  # ffn/n of them
        fc1_tops.append(round(y + h - (by + bh), 6))  # its rows, from the top
        x, y, w, h = bounds(named[f"fc2 outline rank {rank}"])
        bx, by, bw, bh = bounds(named[f"fc2 rank {rank}"])
        assert (by, bh) == (y, h)  # whole columns: every output feature
        assert bw == pytest.approx(w / world_size)
        fc2_lefts.append(round(bx - x, 6))
        hidden = named[f"H rank {rank}"]  # its ffn/n features: fc2's columns' width
        assert hidden.get_width() == pytest.approx(bw)
        assert named[f"Z rank {rank}"].get_hatch() == "///"  # a partial sum
        assert (
            named[f"X rank {rank}"].get_facecolor()
            == named[f"Y rank {rank}"].get_facecolor()
        )  # whole, the same grey on every rank
    step = 2.0 / world_size
    assert fc1_tops == pytest.approx([r * step for r in range(world_size)])
    assert fc2_lefts == pytest.approx([r * step for r in range(world_size)])
    assert named["fc1 rank 0"].get_facecolor() == named["fc2 rank 0"].get_facecolor()
    assert named["fc1 rank 0"].get_facecolor() != named["fc1 rank 1"].get_facecolor()
    words = texts(figure)
    assert {"f", "g"} <= set(words)
    assert "forward:\nidentity\n\nbackward:\nall-reduce" in words  # f
    assert "forward:\nall-reduce\n\nbackward:\nidentity" in words  # g
    f_box, g_box = named["operator f"], named["operator g"]
    assert f_box.get_x() < named["fc1 outline rank 0"].get_x()  # f before fc1
    assert named["Z rank 0"].get_x() < g_box.get_x() < named["Y rank 0"].get_x()
    assert [w for w in words if w.startswith("rank ")] == [
        f"rank {r}" for r in range(world_size)
    ]
    plt.close(figure)


@pytest.mark.parametrize("world_size", [2, 4])
def test_sequence_parallel_shards_the_sequence_around_gather_and_reduce_scatter(
    world_size,
):
    figure = plot_sequence_parallel(world_size)
    named = patches(figure)
    for rank in range(world_size):
        for kind in ("sharded", "sharded after"):
            x, y, w, h = bounds(named[f"{kind} outline rank {rank}"])
            bx, by, bw, bh = bounds(named[f"{kind} rank {rank}"])
            assert (bx, bw) == (x, w)  # every hidden feature
            assert bh == pytest.approx(h / world_size)  # seq/n positions
            assert y + h - (by + bh) == pytest.approx(rank * h / world_size)
        gathered = bounds(named[f"gathered rank {rank}"])
        assert gathered == bounds(named[f"gathered outline rank {rank}"])
        assert named[f"partial rank {rank}"].get_hatch() == "///"
    order = [
        named["sharded rank 0"].get_x(),
        named["operator all-gather"].get_x(),
        named["gathered rank 0"].get_x(),
        named["partial rank 0"].get_x(),
        named["operator reduce-scatter"].get_x(),
        named["sharded after rank 0"].get_x(),
    ]
    assert order == sorted(order)  # shards, all-gather, whole, partial, ...
    words = texts(figure)
    assert {"all-gather", "reduce-scatter"} <= set(words)
    gather = "backward:\nreduce-scatter\n\nin f's place;\nKorthikanti\net al.'s g"
    scatter = "backward:\nall-gather\n\nin g's place;\nKorthikanti\net al.'s ḡ"
    assert {gather, scatter} <= set(words)
    plt.close(figure)


def test_2d_mesh_puts_rank_i_tp_plus_j_at_row_i_column_j_with_its_groups():
    figure = plot_2d_mesh(dp=2, tp=2)
    named = patches(figure)
    words = texts(figure)
    for rank in range(4):
        i, j = divmod(rank, 2)
        assert any(w.startswith(f"rank {rank}\n(dp {i}, tp {j})") for w in words)
        cell = named[f"rank {rank}"]
        assert cell.get_x() == named[f"rank {j}"].get_x()  # same column as tp j
        assert cell.get_y() == named[f"rank {i * 2}"].get_y()  # same row as dp i
    assert named["rank 0"].get_y() > named["rank 2"].get_y()  # dp 0 on top
    assert named["rank 0"].get_facecolor() == named["rank 2"].get_facecolor()
    assert named["rank 0"].get_facecolor() != named["rank 1"].get_facecolor()
    assert any(w.startswith("tp group 0: ranks 0, 1\n") for w in words)
    assert any(w.startswith("tp group 1: ranks 2, 3\n") for w in words)
    assert any(w.startswith("dp group 0: ranks 0, 2\n") for w in words)
    assert any(w.startswith("dp group 1: ranks 1, 3\n") for w in words)
    assert {"tp group 0", "tp group 1", "dp group 0", "dp group 1"} <= set(named)
    assert figure.axes[0].get_title() == "a (2, 2) mesh, mesh_dim_names = (dp, tp)"
    plt.close(figure)


def test_2d_mesh_of_other_shapes_lists_each_group():
    figure = plot_2d_mesh(dp=3, tp=2)
    words = texts(figure)
    assert any(w.startswith("dp group 1: ranks 1, 3, 5\n") for w in words)
    assert any(w.startswith("tp group 2: ranks 4, 5\n") for w in words)
    plt.close(figure)

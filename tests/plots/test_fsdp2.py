"""plot_hsdp_mesh draws a 2-D mesh: rows are shard groups, columns replicate
groups, each rank where the mesh puts it (14b)."""

from multigpu.plots.fsdp2 import plot_hsdp_mesh


def _by_gid(ax):
    return {
        artist.get_gid(): artist
        for artist in [*ax.patches, *ax.lines]
        if artist.get_gid() is not None
    }


def test_plot_hsdp_mesh_puts_each_rank_in_its_row_and_column():
    fig = plot_hsdp_mesh([[0, 1], [2, 3]])
    (ax,) = fig.axes
    found = _by_gid(ax)
    centres = {
        rank: found[f"rank {rank}"].get_bbox().get_points().mean(axis=0)
        for rank in range(4)
    }
    assert centres[0][1] == centres[1][1] > centres[2][1] == centres[3][1]  # rows
    assert centres[0][0] == centres[2][0] < centres[1][0] == centres[3][0]  # columns
    texts = [t.get_text() for t in ax.texts]
    assert [f"rank {r}" in texts for r in range(4)] == [True] * 4
    assert ax.get_title() == "HSDP on a 2 x 2 mesh (replicate x shard)"


def test_plot_hsdp_mesh_names_the_groups_and_their_collectives():
    fig = plot_hsdp_mesh([[0, 1, 2], [3, 4, 5]])
    (ax,) = fig.axes
    found = _by_gid(ax)
    assert sorted(gid for gid in found if "group" in gid) == [
        "replicate group 0",
        "replicate group 1",
        "replicate group 2",
        "shard group 0",
        "shard group 1",
    ]
    texts = [t.get_text() for t in ax.texts]
    assert "shard group [3, 4, 5]:\nall-gather,\nreduce-scatter" in texts
    assert "replicate group [1, 4]:\nall-reduce" in texts
    assert texts.count("shard 2 of each parameter") == 2
    # a shard group's frame holds exactly its row of ranks
    frame = found["shard group 1"].get_bbox()
    inside = [
        rank
        for rank in range(6)
        if frame.contains(*found[f"rank {rank}"].get_bbox().get_points().mean(axis=0))
    ]
    assert inside == [3, 4, 5]
    # a replicate group's line joins the ranks of its column
    xs = set(found["replicate group 1"].get_xdata())
    centre_x = {
        found[f"rank {r}"].get_bbox().get_points().mean(axis=0)[0] for r in (1, 4)
    }
    assert xs == centre_x

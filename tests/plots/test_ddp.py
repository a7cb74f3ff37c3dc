"""Tests of plot_buckets and plot_overlap (10)."""

from multigpu import plots


def test_plot_buckets_draws_one_bar_per_bucket():
    layout = [["b", "a"], ["c"]]
    fig = plots.plot_buckets(layout, {"a": 4096, "b": 1024, "c": 2048})
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["bucket 0", "bucket 1"]
    assert len(fig.axes[0].patches) == 3


def test_plot_overlap_draws_a_compute_and_a_communication_lane_per_rank():
    from multigpu.miniddp import TimelineEvent

    rank = [
        TimelineEvent("backward", "layer 1", 0.0, 1.0),
        TimelineEvent("backward", "layer 0", 1.0, 2.0),
        TimelineEvent("all-reduce", "bucket 0", 1.0, 2.5),
    ]
    fig = plots.plot_overlap({"flat": [rank, rank], "bucketed": [rank, rank]})
    assert len(fig.axes) == 2
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == [
        "rank 0 backward",
        "rank 0 all-reduce",
        "rank 1 backward",
        "rank 1 all-reduce",
    ]
    # one span per event: 3 events on each of 2 ranks, in milliseconds
    spans = [c.get_paths()[0].get_extents() for c in fig.axes[0].collections]
    assert len(spans) == 6
    assert sorted({(round(b.x0), round(b.x1)) for b in spans}) == [
        (0, 1000),
        (1000, 2000),
        (1000, 2500),
    ]

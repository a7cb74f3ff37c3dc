"""plot_prefetch draws a compute and a communication lane per setting (14)."""

from multigpu.miniddp import TimelineEvent
from multigpu.plots.fsdp import plot_prefetch


def test_plot_prefetch_draws_one_span_per_event_in_its_lane():
    events = [
        TimelineEvent("all-gather", "0", 0.0, 1.0),
        TimelineEvent("compute", "forward 0", 1.0, 2.0),
        TimelineEvent("compute", "backward 0", 2.0, 3.0),
        TimelineEvent("reduce-scatter", "0", 3.0, 3.5),
    ]
    fig = plot_prefetch({"depth 0": events, "depth 1": events})
    assert len(fig.axes) == 2
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["compute", "communication"]
    spans = [c.get_paths()[0].get_extents() for c in ax.collections]
    assert sorted((round(b.x0), round(b.x1), round(b.y0 + 0.35)) for b in spans) == [
        (0, 1000, 1),
        (1000, 2000, 0),
        (2000, 3000, 0),
        (3000, 3500, 1),
    ]

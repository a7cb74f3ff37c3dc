"""plot_prefetch draws a compute and a communication lane per setting; plot_unit_life
draws one unit's step: its compute among the others', the spans its parameters are
gathered and the gap where they are freed, its all-gathers and its reduce-scatter
(14)."""

from multigpu.miniddp import TimelineEvent
from multigpu.plots.fsdp import plot_prefetch, plot_unit_life, unit_life_spans

# A step of two units, "a" then "b", at depth 0, in seconds.
STEP = [
    TimelineEvent("gathered", "a", 0.000, 0.003),
    TimelineEvent("all-gather", "a", 0.000, 0.001),
    TimelineEvent("compute", "forward a", 0.001, 0.003),
    TimelineEvent("gathered", "b", 0.003, 0.006),
    TimelineEvent("all-gather", "b", 0.003, 0.004),
    TimelineEvent("compute", "forward b", 0.004, 0.006),
    TimelineEvent("gathered", "b", 0.006, 0.009),
    TimelineEvent("all-gather", "b", 0.006, 0.007),
    TimelineEvent("compute", "backward b", 0.007, 0.009),
    TimelineEvent("reduce-scatter", "b", 0.009, 0.010),
    TimelineEvent("gathered", "a", 0.009, 0.012),
    TimelineEvent("all-gather", "a", 0.010, 0.011),
    TimelineEvent("compute", "backward a", 0.011, 0.012),
    TimelineEvent("reduce-scatter", "a", 0.012, 0.013),
]


def test_plot_prefetch_draws_one_span_per_event_in_its_lane():
    events = [
        TimelineEvent("all-gather", "0", 0.0, 1.0),
        TimelineEvent("compute", "forward 0", 1.0, 2.0),
        TimelineEvent("compute", "backward 0", 2.0, 3.0),
        TimelineEvent("reduce-scatter", "0", 3.0, 3.5),
        TimelineEvent("gathered", "0", 0.0, 2.0),  # memory: not drawn here
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


def test_unit_life_spans_pick_the_unit_and_find_where_it_is_freed():
    spans = unit_life_spans(STEP, "a")
    assert spans["forward"] == [(1.0, 3.0)] and spans["backward"] == [(11.0, 12.0)]
    assert spans["other units"] == [(4.0, 6.0), (7.0, 9.0)]
    assert spans["gathered"] == [(0.0, 3.0), (9.0, 12.0)]
    assert spans["freed"] == [(3.0, 9.0)]  # from its free to its second gather
    assert spans["all-gather"] == [(0.0, 1.0), (10.0, 11.0)]
    assert spans["reduce-scatter"] == [(12.0, 13.0)]


def test_plot_unit_life_draws_each_span_in_its_row_and_names_each_moment():
    fig = plot_unit_life(STEP, "a")
    ax = fig.axes[0]
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert rows == ["compute", "unit a gathered", "communication"]
    drawn = {}
    for collection in ax.collections:
        for path in collection.get_paths():
            box = path.get_extents()
            row = round(box.y0 + 0.35)
            drawn.setdefault(collection.get_label(), []).append(
                (round(box.x0, 3), round(box.x1, 3), row)
            )
    assert drawn == {
        "other units": [(4.0, 6.0, 0), (7.0, 9.0, 0)],
        "forward": [(1.0, 3.0, 0)],
        "backward": [(11.0, 12.0, 0)],
        "gathered": [(0.0, 3.0, 1), (9.0, 12.0, 1)],
        "all-gather": [(0.0, 1.0, 2), (10.0, 11.0, 2)],
        "reduce-scatter": [(12.0, 13.0, 2)],
    }
    texts = {t.get_text(): t.get_position() for t in ax.texts}
    assert texts["gathered for forward"] == (1.5, 1)
    assert texts["freed"] == (6.0, 1)
    assert texts["gathered again for backward"] == (10.5, 1)
    assert "gradient reduce-scattered" in texts
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == list(drawn)

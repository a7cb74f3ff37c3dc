"""gather_hidden_share and step_seconds on timelines worked out by hand, and on
FSDP by hand's own timeline at depth 0, where no all-gather can hide and each unit's
memory is there twice per step: gathered for forward, freed, gathered again for
backward, freed before its gradient's reduce-scatter."""

import torch

from multigpu.fsdp import gather_hidden_share, step_seconds, unit_life
from multigpu.miniddp import TimelineEvent


def test_hidden_share_counts_gather_time_under_compute():
    compute = [TimelineEvent("compute", "forward a", 1.0, 3.0)]
    waited = [TimelineEvent("all-gather", "a", 0.0, 1.0)]  # before: nothing hidden
    assert gather_hidden_share(compute + waited) == 0.0
    half = waited + [TimelineEvent("all-gather", "b", 2.0, 4.0)]  # 1 of 3 s hidden
    assert gather_hidden_share(compute + half) == 1 / 3
    reduce = [TimelineEvent("reduce-scatter", "a", 1.0, 2.0)]  # not an all-gather
    assert gather_hidden_share(compute + waited + reduce) == 0.0
    assert gather_hidden_share(compute) == 0.0
    assert step_seconds(compute + half) == 4.0
    assert step_seconds([]) == 0.0


def test_at_depth_0_no_all_gather_runs_under_compute(fsdp_runs):
    _, histories, _ = fsdp_runs
    for history in histories[("depth 0", torch.float32)]:
        lanes = {event.lane for event in history.timeline}
        assert lanes == {"compute", "all-gather", "reduce-scatter", "gathered"}
        assert gather_hidden_share(history.timeline) == 0.0


def test_the_timeline_records_each_units_life(fsdp_runs):
    _, histories, _ = fsdp_runs
    for history in histories[("depth 0", torch.float32)]:
        events = history.timeline
        units = {e.name for e in events if e.lane == "gathered"}
        assert len(units) == len(history.forward_order)  # every unit that ran
        for unit in units:
            mine = [e for e in events if e.name.split(" ")[-1] == unit]
            life = [(e.lane, e.name.split(" ")[0]) for e in mine]
            spans = [e for e in mine if e.lane == "gathered"]
            assert len(spans) == 2  # forward, then backward: freed in between
            first, second = spans
            forward = next(e for e in mine if e.name == f"forward {unit}")
            backward = next(e for e in mine if e.name == f"backward {unit}")
            gathers = [e for e in mine if e.lane == "all-gather"]
            (reduce,) = [e for e in mine if e.lane == "reduce-scatter"]
            assert first.start <= gathers[0].start <= forward.start
            assert forward.end <= first.end < second.start  # freed after forward
            assert second.start <= gathers[1].start <= backward.start
            assert backward.end <= second.end <= reduce.start  # freed, then reduced
            assert life.count(("all-gather", unit)) == 2, life
            assert unit_life(events, unit) == LIFE


LIFE = ["gathered", "all-gather", "forward", "freed"]  # then the same for backward
LIFE += ["gathered", "all-gather", "backward", "freed", "reduce-scatter"]


def test_unit_life_reads_the_moments_of_one_unit_in_order():
    events = [
        TimelineEvent("gathered", "a", 0.0, 3.0),
        TimelineEvent("all-gather", "a", 0.1, 1.0),
        TimelineEvent("compute", "forward a", 1.0, 3.0),
        TimelineEvent("compute", "forward b", 3.0, 4.0),  # another unit
        TimelineEvent("gathered", "a", 5.0, 8.0),
        TimelineEvent("all-gather", "a", 5.1, 6.0),
        TimelineEvent("compute", "backward a", 6.0, 8.0),
        TimelineEvent("reduce-scatter", "a", 8.0, 9.0),
    ]
    assert unit_life(events, "a") == LIFE
    assert unit_life(events, "b") == ["forward"]

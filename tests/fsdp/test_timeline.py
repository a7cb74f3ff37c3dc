"""gather_hidden_share and step_seconds on timelines worked out by hand, and on
FSDP by hand's own timeline at depth 0, where no all-gather can hide."""

import torch

from multigpu.fsdp import gather_hidden_share, step_seconds
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
        assert lanes == {"compute", "all-gather", "reduce-scatter"}
        assert gather_hidden_share(history.timeline) == 0.0

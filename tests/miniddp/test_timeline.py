"""The timeline a wrapper records (multigpu.miniddp.timeline): buckets overlap
backward, the flat wrapper waits for it."""

import pytest
import torch

from multigpu import miniddp
from multigpu.core.models import mlp
from multigpu.miniddp import TimelineEvent
from multigpu.ranks import miniddp as miniddp_ranks
from multigpu.runtime.launch import spawn

TIMEOUT = 30.0


def test_timeline_shows_buckets_overlapping_backward_and_flat_waiting():
    torch.manual_seed(0)
    model = mlp(width=64, depth=4)
    X, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    per_rank = spawn(
        miniddp_ranks.timeline_rank,
        2,
        model,
        X,
        y,
        ("flat", "bucketed"),
        {"bucket_cap_mb": 0.01},
        timeout=TIMEOUT,
    )
    for timelines in per_rank:
        flat, bucketed = timelines["flat"], timelines["bucketed"]

        def last_gradient(events):
            return max(
                e.end for e in events if e.lane == "backward" and e.name != "sync"
            )

        flat_comm = [e for e in flat if e.lane == "all-reduce"]
        assert [e.name for e in flat_comm] == ["all gradients"]
        assert flat_comm[0].start >= last_gradient(flat)
        assert miniddp.hidden_fraction(flat) == 0.0
        comm = [e for e in bucketed if e.lane == "all-reduce"]
        assert sorted(e.name for e in comm) == [f"bucket {i}" for i in range(len(comm))]
        assert len(comm) >= 3
        first = min(comm, key=lambda e: e.start)
        assert first.start < last_gradient(bucketed)  # sent while backward went on
        assert all(e.end >= e.start for e in bucketed)


def test_hidden_fraction_counts_communication_before_the_last_gradient():
    events = [
        TimelineEvent("backward", "forward", 0.0, 1.0),
        TimelineEvent("backward", "layer", 1.0, 3.0),
        TimelineEvent("all-reduce", "bucket 0", 2.0, 4.0),  # half before 3.0
        TimelineEvent("all-reduce", "bucket 1", 3.0, 5.0),  # none
        TimelineEvent("backward", "sync", 3.0, 5.0),
    ]
    assert miniddp.hidden_fraction(events) == pytest.approx(0.25)
    assert miniddp.hidden_fraction(events[:2]) == 0.0

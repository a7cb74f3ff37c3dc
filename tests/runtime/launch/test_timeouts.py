"""Tests for multigpu.runtime.launch.timeouts: timeout=None, and what counts as
torch.distributed giving up on its peers."""

from datetime import timedelta

import pytest

from multigpu.runtime import launch
from multigpu.runtime.launch import (
    WorkerError,
    spawn,
)
from tests import ranks as test_ranks


def test_timeout_none_means_no_timeout(no_leftovers):
    # Rank 1 joins the all_reduce 1.5 s late; with timeout=1 that fails.
    assert spawn(test_ranks.join_late_rank, 2, 1, 1.5, timeout=None) == [3, 3]
    assert launch.as_timedelta(None) >= timedelta(days=365)
    with pytest.raises(WorkerError) as caught:
        spawn(test_ranks.join_late_rank, 2, 1, 3.0, timeout=1.0)
    assert caught.value.timed_out


def test_ranks_that_all_wait_for_each_other_time_out(no_leftovers):
    with pytest.raises(WorkerError) as caught:
        spawn(test_ranks.wait_for_each_other_rank, 2, timeout=2.0)
    error = caught.value
    assert error.timed_out
    assert error.missing_ranks == []  # both reported: torch's own error said so


def test_a_timeout_is_recognised_by_kind_and_only_after_the_timeout():
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    with pytest.raises(dist.DistStoreError) as caught:  # a rendezvous that never ends
        store.wait(["a key no rank sets"], timedelta(seconds=0.1))
    store_timeout = caught.value
    assert launch.is_timeout(store_timeout, waited_s=2.0, timeout=1.0)
    assert launch.is_timeout(TimeoutError(), waited_s=2.0, timeout=1.0)
    assert not launch.is_timeout(store_timeout, waited_s=0.5, timeout=1.0)
    assert not launch.is_timeout(ValueError("timed out"), waited_s=2.0, timeout=1.0)


def test_a_peers_closed_connection_in_work_wait_does_not_hide_the_cause(no_leftovers):
    # gloo raises it from the caller's line (irecv(...).wait()), not from inside
    # torch.distributed: its text marks it as a peer's symptom all the same.
    with pytest.raises(WorkerError) as caught:
        spawn(test_ranks.fail_while_peer_waits_on_a_receive_rank, 2, timeout=30.0)
    assert str(caught.value).startswith(
        "Rank 1 of 2 failed with ValueError: rank 1's own mistake"
    )


def test_the_rank_that_timed_out_is_named_not_the_peer_it_left(no_leftovers):
    # Rank 1 times out and ends; rank 0 then sees "Connection closed by peer". Both
    # are torch.distributed's errors; the closed connection is the symptom.
    with pytest.raises(WorkerError) as caught:
        spawn(test_ranks.time_out_while_peer_waits_longer_rank, 2, timeout=1.0)
    assert caught.value.rank == 1
    assert caught.value.timed_out

"""Tests for multigpu.workers: the functions ranks run for notebook 07 and the tests
(the launch demos are tested in test_launch.py, the all-reduce comparisons in
test_collectives.py)."""

import pickle

import pytest
import torch

from multigpu import costmodel, workers
from multigpu.launch import spawn


def test_ping_pong_sends_and_receives():
    assert spawn(workers.ping_pong, 2, 1.5) == [[3.0], [3.0]]


def test_rank_tensor_is_deterministic_and_differs_between_ranks():
    first = workers.rank_tensor(0, (4, 5), torch.float32)
    assert torch.equal(first, workers.rank_tensor(0, (4, 5), torch.float32))
    assert not torch.equal(first, workers.rank_tensor(1, (4, 5), torch.float32))
    assert first.shape == (4, 5) and first.dtype == torch.float32
    integers = workers.rank_tensor(2, (50,), torch.int64)
    assert integers.dtype == torch.int64
    assert 2 <= integers.min() and integers.max() <= 101


def test_bytes_sent_are_counted_by_rank():
    rows = spawn(workers.bytes_sent, 4, 10)
    assert [row["rank"] for row in rows] == [0, 1, 2, 3]
    assert [row["naive"] for row in rows] == [120, 40, 40, 40]
    assert [row["ring"] for row in rows] == [
        costmodel.ring_bytes_per_rank(10, 4, 4, rank) for rank in range(4)
    ]


def test_timing_rows_have_the_expected_shape():
    rows = spawn(workers.time_all_reduces, 2, [4096], 1, timeout=10.0)[0]
    names = ["naive", "ring", "ring pipelined", "dist.all_reduce"]
    assert [row["algorithm"] for row in rows] == names
    assert [row["bytes sent"] for row in rows] == [4096, 4096, 4096, None]
    assert all(row["seconds"] > 0 and row["busbw GB/s"] > 0 for row in rows)
    assert {row["world_size"] for row in rows} == {2}


def test_timing_only_the_named_all_reduces():
    rows = spawn(workers.time_all_reduces, 2, [4096, 8192], 1, ["ring"])[1]
    assert [(row["algorithm"], row["bytes"]) for row in rows] == [
        ("ring", 4096),
        ("ring", 8192),
    ]


def test_the_misbehaving_workers_misbehave_only_on_their_rank():
    # Called in this process: the ranks that behave return at once.
    assert workers.stuck_outside_collectives(0, 2, 1) == 0
    assert workers.exit_without_returning(0, 2, 1) == 0
    assert workers.raise_unprintable(0, 2, 1) == 0
    assert workers.result_that_fails_to_unpickle(0, 2, 1) == 0


def test_the_faulty_objects_fail_where_they_should():
    with pytest.raises(RuntimeError, match="cannot be turned into text"):
        str(workers.UnprintableError())
    data = pickle.dumps(workers.RefusesToUnpickle())  # pickling works ...
    with pytest.raises(ValueError, match="cannot be rebuilt outside the rank"):
        pickle.loads(data)  # ... unpickling does not

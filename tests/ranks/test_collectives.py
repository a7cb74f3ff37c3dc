"""Tests for multigpu.ranks.collectives: the functions the ranks of notebook 07 run
(the launch demos are tested in tests/runtime/launch, the all-reduce comparisons in
tests/test_collectives.py)."""

import torch

from multigpu import costmodel
from multigpu.ranks import collectives as collective_ranks
from multigpu.runtime.launch import spawn


def test_ping_pong_sends_and_receives():
    assert spawn(collective_ranks.ping_pong_rank, 2, 1.5) == [[3.0], [3.0]]


def test_rank_tensor_is_deterministic_and_differs_between_ranks():
    first = collective_ranks.rank_tensor(0, (4, 5), torch.float32)
    assert torch.equal(first, collective_ranks.rank_tensor(0, (4, 5), torch.float32))
    assert not torch.equal(
        first, collective_ranks.rank_tensor(1, (4, 5), torch.float32)
    )
    assert first.shape == (4, 5) and first.dtype == torch.float32
    integers = collective_ranks.rank_tensor(2, (50,), torch.int64)
    assert integers.dtype == torch.int64
    assert 2 <= integers.min() and integers.max() <= 101


def test_bytes_sent_are_counted_by_rank():
    rows = spawn(collective_ranks.bytes_sent_rank, 4, 10)
    assert [row["rank"] for row in rows] == [0, 1, 2, 3]
    assert [row["naive"] for row in rows] == [120, 40, 40, 40]
    assert [row["ring"] for row in rows] == [
        costmodel.ring_bytes_per_rank(10, 4, 4, rank) for rank in range(4)
    ]


def test_timing_rows_have_the_expected_shape():
    rows = spawn(collective_ranks.time_all_reduces_rank, 2, [4096], 1, timeout=10.0)[0]
    names = ["naive", "ring", "ring pipelined", "dist.all_reduce"]
    assert [row["algorithm"] for row in rows] == names
    assert [row["bytes sent"] for row in rows] == [4096, 4096, 4096, None]
    assert all(row["seconds"] > 0 and row["busbw GB/s"] > 0 for row in rows)
    assert {row["world_size"] for row in rows} == {2}


def test_timing_only_the_named_all_reduces():
    rows = spawn(collective_ranks.time_all_reduces_rank, 2, [4096, 8192], 1, ["ring"])[
        1
    ]
    assert [(row["algorithm"], row["bytes"]) for row in rows] == [
        ("ring", 4096),
        ("ring", 8192),
    ]


def test_check_all_reduce_tells_a_ring_from_a_wrong_sum_and_from_other_traffic():
    from multigpu import collectives

    ring = spawn(collective_ranks.check_all_reduce_rank, 3, collectives.ring_all_reduce)
    assert ring[0] == ring[1] == ring[2]  # every rank returns the verdict of all
    assert [row["case"] for row in ring[0]] == [
        "(1000,) float32",
        "(3,) float32",
        "(4, 5) float64",
        "(13,) int64",
    ]
    assert all(row["sum"] and row["ring bytes"] for row in ring[0])
    # Right sums, but rank 0 sends (n-1)·S: not a ring.
    naive = spawn(
        collective_ranks.check_all_reduce_rank, 3, collectives.naive_all_reduce
    )[0]
    assert [(row["sum"], row["ring bytes"]) for row in naive] == [(True, False)] * 4
    # Zeros instead of the sum, and a tensor instead of a byte count.
    first_case = collective_ranks.CHECK_CASES[:1]
    wrong = spawn(
        collective_ranks.check_all_reduce_rank, 3, torch.Tensor.zero_, first_case
    )[0]
    assert [(row["sum"], row["ring bytes"]) for row in wrong] == [(False, False)]

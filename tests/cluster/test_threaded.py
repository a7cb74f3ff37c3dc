"""Tests for multigpu.cluster.threaded: thread ranks' collectives are exact and
their results come in rank order; a rank's error and a rank stuck in a collective
come back as one line."""

import time

import pytest
import torch
import torch.distributed as dist

from multigpu.cluster.threaded import run_threaded


def sum_of_ranks(rank, world_size):
    value = torch.tensor([float(rank)])
    dist.all_reduce(value)
    return value.item()


def fails_on_rank_1(rank, world_size):
    if rank == 1:
        raise ValueError("a learner's bug")
    return sum_of_ranks(rank, world_size)


def only_rank_0_reduces(rank, world_size):
    return sum_of_ranks(rank, world_size) if rank == 0 else None


def test_collectives_are_exact_and_results_come_in_rank_order():
    assert run_threaded(sum_of_ranks, 4) == [6.0] * 4


def test_the_first_error_comes_back_as_one_line():
    with pytest.raises(RuntimeError) as error:
        run_threaded(fails_on_rank_1, 3)
    assert str(error.value) == "thread rank 1 failed: ValueError: a learner's bug"


def test_a_rank_stuck_in_a_collective_is_bounded_by_the_timeout():
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"thread ranks \[0\] did not finish"):
        run_threaded(only_rank_0_reduces, 2, timeout=0.5)
    assert time.monotonic() - start < 5
    assert run_threaded(sum_of_ranks, 2) == [1.0, 1.0]  # usable again afterwards

"""Tests for multigpu.tensor_parallel.operators: the ledger, the sequence split and
the count of what collectives move (the operators' collectives are counted in
test_blocks.py) (15)."""

import torch
import torch.distributed as dist

from multigpu.collectives import ring_all_reduce
from multigpu.runtime.launch import spawn
from multigpu.tensor_parallel import (
    CollectiveRecord,
    all_reduce_max,
    count_communication,
    record_collectives,
    sequence_chunk,
)
from multigpu.tensor_parallel.operators import all_reduce_sum
from tests.tensor_parallel.problem import TIMEOUT


def test_sequence_chunk_takes_this_ranks_positions():
    x = torch.arange(2 * 8).view(2, 8, 1)
    assert torch.equal(sequence_chunk(x, 2, 4), x[:, 4:6])


def test_the_ledger_records_only_inside_its_block(monkeypatch):
    monkeypatch.setattr(
        "multigpu.tensor_parallel.operators.ring_all_reduce", lambda t: t.numel()
    )
    all_reduce_sum(torch.zeros(3), "forward")  # outside: not recorded
    with record_collectives() as outer:
        all_reduce_sum(torch.zeros(2), "forward")
        with record_collectives() as inner:
            all_reduce_sum(torch.zeros(5), "backward")
    assert outer == [CollectiveRecord("all-reduce", "forward", 2)]
    assert inner == [CollectiveRecord("all-reduce", "backward", 5)]


def counting_rank(rank, world_size):
    """What count_communication sees for each API, on 2 ranks."""
    counts = {}
    tensor = torch.ones(6, 4, dtype=torch.float64)
    with count_communication() as counter:
        ring_all_reduce(tensor.clone())  # 07's ring: send/recv of 12-element chunks
    counts["ring"] = counter.elements
    with count_communication() as counter:
        dist.all_reduce(tensor.clone())
    counts["dist.all_reduce"] = counter.elements
    with count_communication() as counter:
        dist.all_gather([torch.empty_like(tensor) for _ in range(2)], tensor)
    counts["dist.all_gather"] = counter.elements
    with count_communication() as counter:
        all_reduce_max(torch.ones(6, dtype=torch.float64))
    counts["max"] = counter.elements
    with count_communication() as counter:
        tensor.sum()  # no communication
    counts["none"] = counter.elements
    return counts


def test_count_communication_sees_every_api():
    counts = spawn(counting_rank, 2, timeout=TIMEOUT)[0]
    assert counts == {
        "ring": 4 * 12,  # reduce-scatter and all-gather: one send, one receive each
        "dist.all_reduce": 24,
        "dist.all_gather": 3 * 24,  # two outputs and the input
        "max": 2 * 6,  # 07's all-gather of 6 values: one send, one receive
        "none": 0,
    }

"""Tests for multigpu.tensor_parallel.operators: the ledger and the sequence split
(the operators' collectives are counted in test_blocks.py) (15)."""

import torch

from multigpu.tensor_parallel import (
    CollectiveRecord,
    record_collectives,
    sequence_chunk,
)
from multigpu.tensor_parallel.operators import all_reduce_sum


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

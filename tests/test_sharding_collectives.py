"""Tests for the ring's halves in multigpu.collectives: reduce_scatter and all_gather
equal PyTorch's, for chunks of equal and unequal sizes, and send what they say."""

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

from multigpu import collectives as C
from multigpu import zero
from multigpu.launch import spawn

# Sizes that 1..4 divide, that only some divide, smaller than the world, empty.
NUMELS = [12, 10, 3, 1, 0, 1573]


@pytest.fixture(
    scope="module",
    params=[(n, dtype) for n in (1, 2, 3, 4) for dtype in (torch.float64, torch.int64)],
    ids=lambda p: f"world{p[0]}-{str(p[1]).removeprefix('torch.')}",
)
def gathered(request):
    world_size, dtype = request.param
    per_rank = spawn(zero.collectives_worker, world_size, NUMELS, dtype, timeout=60.0)
    return world_size, dtype, per_rank


def test_reduce_scatter_leaves_each_rank_its_chunk_of_the_sum(gathered):
    world_size, dtype, per_rank = gathered
    for index, numel in enumerate(NUMELS):
        total = torch.stack([rows[index]["input"] for rows in per_rank]).sum(0)
        for rank, rows in enumerate(per_rank):
            row = rows[index]
            assert row["reduce_scatter"].dtype == dtype
            assert (
                row["reduce_scatter"].numel()
                == C.ring_chunk_sizes(numel, world_size)[rank]
            )
            assert_close(row["reduce_scatter"], total.tensor_split(world_size)[rank])


def test_all_gather_puts_every_rank_chunk_in_rank_order(gathered):
    world_size, dtype, per_rank = gathered
    for index in range(len(NUMELS)):
        expected = torch.cat([rows[index]["mine"] for rows in per_rank])
        for rows in per_rank:
            assert torch.equal(rows[index]["all_gather"], expected)


def test_equal_to_pytorch_where_pytorch_accepts_the_size(gathered):
    world_size, dtype, per_rank = gathered
    compared = 0
    for rows in per_rank:
        for row in rows:
            if row["numel"] % world_size == 0:
                assert_close(row["reduce_scatter"], row["dist.reduce_scatter_single"])
                assert torch.equal(row["all_gather"], row["dist.all_gather_single"])
                compared += 1
    assert compared >= 2 * world_size  # 12 and 0 divide by every world size


def test_bytes_sent_are_half_a_ring_all_reduce(gathered):
    world_size, dtype, per_rank = gathered
    element_size = torch.empty((), dtype=dtype).element_size()
    for rank, rows in enumerate(per_rank):
        for row in rows:
            numel = row["numel"]
            assert row["reduce_scatter bytes"] == C.reduce_scatter_bytes_per_rank(
                numel, element_size, world_size, rank
            )
            assert row["all_gather bytes"] == C.all_gather_bytes_per_rank(
                numel, element_size, world_size, rank
            )
            if numel % world_size == 0:  # exactly (n-1)/n of the tensor
                share = (world_size - 1) * numel // world_size * element_size
                assert row["reduce_scatter bytes"] == share
                assert row["all_gather bytes"] == share


def test_byte_counts_worked_out_by_hand():
    # 10 elements over 4 ranks are chunks of 3, 3, 2, 2 (float32: 4 bytes each).
    # Reduce-scatter: rank r sends every chunk but its own.
    assert [C.reduce_scatter_bytes_per_rank(10, 4, 4, r) for r in range(4)] == [
        28,
        28,
        32,
        32,
    ]
    # All-gather: every chunk but its right neighbour's, which arrives last.
    assert [C.all_gather_bytes_per_rank(10, 4, 4, r) for r in range(4)] == [
        28,
        32,
        32,
        28,
    ]
    assert C.reduce_scatter_bytes_per_rank(10, 4, 1, 0) == 0
    # Together, over all ranks, they send what notebook 07's ring all-reduce sends
    # (whose reduce-scatter leaves chunk r+1 on rank r, so ranks differ one by one).
    from multigpu.costmodel import ring_bytes_per_rank

    halves = sum(
        C.reduce_scatter_bytes_per_rank(10, 4, 4, r)
        + C.all_gather_bytes_per_rank(10, 4, 4, r)
        for r in range(4)
    )
    assert halves == sum(ring_bytes_per_rank(10, 4, 4, r) for r in range(4)) == 240


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_chunk_of_the_wrong_size_is_refused(one_rank_group):
    with pytest.raises(ValueError) as error:
        C.reduce_scatter(torch.empty(3), torch.zeros(4))
    assert str(error.value) == (
        "The output of rank 0 has 3 elements of torch.float32, but its chunk of 4 "
        "elements of torch.float32 over 1 ranks has 4 of torch.float32. Pass a chunk "
        "of the size ring_chunk_sizes(numel, world_size)[rank] and of the full "
        "tensor's dtype."
    )
    with pytest.raises(ValueError, match="^The input of rank 0 has 4 elements of "):
        C.all_gather(torch.empty(4, dtype=torch.float64), torch.zeros(4))


def test_one_rank_copies_and_sends_nothing(one_rank_group):
    source = torch.arange(5.0)
    output = torch.empty(5)
    assert C.reduce_scatter(output, source) == 0
    assert torch.equal(output, source)
    gathered = torch.empty(5)
    assert C.all_gather(gathered, source) == 0
    assert torch.equal(gathered, source)

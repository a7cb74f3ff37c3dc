"""Tests for multigpu.collectives: hand-made all-reduce equals dist.all_reduce; the
ring's halves, reduce_scatter and all_gather, equal PyTorch's, for chunks of equal
and unequal sizes; every collective sends the bytes the formulas of
multigpu.costmodel say."""

import math

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

from multigpu import collectives as C
from multigpu import costmodel
from multigpu.ranks import collectives as collective_ranks
from multigpu.ranks import zero as zero_ranks
from multigpu.runtime.launch import spawn

# (shape, dtype): sizes divisible by 1..4 or not, smaller than the world, empty,
# several dimensions, floats and integers, and chunks larger than PIECE_BYTES.
CASES = [
    ((12,), torch.float32),
    ((10,), torch.float32),
    ((3,), torch.float64),
    ((1,), torch.float32),
    ((0,), torch.float32),
    ((5, 7), torch.float32),
    ((13,), torch.int64),
    ((2, 3), torch.int32),
    ((3 * 2**18 + 5,), torch.float32),  # 3 MiB: the pipelined ring adds 1 MiB pieces
    # 12 MiB + 4 bytes: on 2, 3 and 4 ranks chunk 0 needs one piece more than the
    # others, so a rank that cut by the wrong chunk would send mismatched pieces.
    ((12 * 2**18 + 1,), torch.float32),
]
HAND_WRITTEN = ("naive", "ring", "ring pipelined")


@pytest.fixture(scope="module", params=[1, 2, 3, 4], ids=lambda n: f"world{n}")
def compared(request):
    world_size = request.param
    rows = spawn(
        collective_ranks.compare_all_reduces_rank, world_size, CASES, timeout=10.0
    )
    return world_size, rows


def test_results_equal_dist_all_reduce(compared):
    world_size, per_rank = compared
    for rows in per_rank:
        for row in rows:
            expected = row["dist.all_reduce"]
            assert expected.shape == row["shape"]
            for name in HAND_WRITTEN:
                assert row[name].dtype == row["dtype"]
                assert_close(row[name], expected)


def test_results_equal_the_sum_of_the_inputs(compared):
    world_size, per_rank = compared
    for (shape, dtype), row in zip(CASES, per_rank[0], strict=True):
        inputs = [
            collective_ranks.rank_tensor(rank, shape, dtype)
            for rank in range(world_size)
        ]
        total = torch.stack(inputs).sum(0).to(dtype)
        for name in HAND_WRITTEN:
            assert_close(row[name], total)


def test_ring_adds_in_the_order_of_its_schedule_pipelined_or_not(compared):
    # Same additions in the same order: the textbook ring, the pipelined ring and
    # the one-process simulation of the schedule agree bit for bit on every rank.
    world_size, per_rank = compared
    for index, (shape, dtype) in enumerate(CASES):
        inputs = [
            collective_ranks.rank_tensor(rank, shape, dtype)
            for rank in range(world_size)
        ]
        simulated = C.simulate_ring_all_reduce(inputs)
        for rank, rows in enumerate(per_rank):
            row = rows[index]
            assert torch.equal(row["ring"], simulated[rank])
            assert torch.equal(row["ring pipelined"], row["ring"])
            assert torch.equal(row["ring"], per_rank[0][index]["ring"])


def test_bytes_sent_equal_the_formulas(compared):
    world_size, per_rank = compared
    for rank, rows in enumerate(per_rank):
        for row in rows:
            numel = math.prod(row["shape"])
            element_size = torch.empty((), dtype=row["dtype"]).element_size()
            nbytes = numel * element_size
            assert row["naive bytes"] == costmodel.naive_bytes_per_rank(
                nbytes, world_size, rank
            )
            ring = costmodel.ring_bytes_per_rank(numel, element_size, world_size, rank)
            assert row["ring bytes"] == row["ring pipelined bytes"] == ring
            if numel % world_size == 0:
                assert ring == costmodel.ring_bytes_theory(nbytes, world_size)
            assert row["dist.all_reduce bytes"] is None  # gloo's bytes are not seen


def test_ring_chunk_sizes_cut_like_tensor_split():
    assert C.ring_chunk_sizes(10, 4) == [3, 3, 2, 2]
    assert C.ring_chunk_sizes(2, 4) == [1, 1, 0, 0]
    for numel in range(13):
        for world_size in range(1, 6):
            chunks = torch.arange(numel).tensor_split(world_size)
            expected = [len(chunk) for chunk in chunks]
            assert C.ring_chunk_sizes(numel, world_size) == expected


def test_non_contiguous_tensors_are_reduced_in_place():
    rows = spawn(collective_ranks.transposed_all_reduce_rank, 2, timeout=10.0)
    for rank_rows in rows:
        for name in HAND_WRITTEN:
            assert not rank_rows[name].is_contiguous()
            assert_close(rank_rows[name], rank_rows["expected"])


def test_schedule_every_rank_sends_a_different_chunk_each_step():
    for world_size in range(1, 7):
        for step in range(world_size - 1):
            for rule in (C.reduce_scatter_send_chunk, C.all_gather_send_chunk):
                chunks = {rule(rank, step, world_size) for rank in range(world_size)}
                assert chunks == set(range(world_size))


def test_simulated_ring_matches_the_sum_and_catches_a_wrong_schedule():
    tensors = [
        collective_ranks.rank_tensor(rank, (10,), torch.float64) for rank in range(4)
    ]
    total = torch.stack(tensors).sum(0)
    for result in C.simulate_ring_all_reduce(tensors):
        assert_close(result, total)
    wrong = C.simulate_ring_all_reduce(tensors, all_gather_chunk=lambda r, s, n: r)
    assert not all(torch.allclose(result, total) for result in wrong)


@pytest.mark.gpu(2)
def test_ring_with_nccl_equals_dist_all_reduce():
    cases = [
        ((10,), torch.float32),
        ((13,), torch.int64),
        ((3 * 2**18 + 5,), torch.float32),
    ]
    for rows in spawn(
        collective_ranks.compare_all_reduces_rank, 2, cases, backend="nccl"
    ):
        for row in rows:
            for name in HAND_WRITTEN:
                assert_close(row[name], row["dist.all_reduce"])


# ----------------------------------------------------------------------------------
# The ring's halves on their own: reduce_scatter and all_gather (13)

# Sizes that 1..4 divide, that only some divide, smaller than the world, empty.
SHARD_NUMELS = [12, 10, 3, 1, 0, 1573]


@pytest.fixture(
    scope="module",
    params=[(n, dtype) for n in (1, 2, 3, 4) for dtype in (torch.float64, torch.int64)],
    ids=lambda p: f"world{p[0]}-{str(p[1]).removeprefix('torch.')}",
)
def halves(request):
    world_size, dtype = request.param
    per_rank = spawn(
        zero_ranks.collectives_rank, world_size, SHARD_NUMELS, dtype, timeout=60.0
    )
    return world_size, dtype, per_rank


def test_reduce_scatter_leaves_each_rank_its_chunk_of_the_sum(halves):
    world_size, dtype, per_rank = halves
    for index, numel in enumerate(SHARD_NUMELS):
        total = torch.stack([rows[index]["input"] for rows in per_rank]).sum(0)
        for rank, rows in enumerate(per_rank):
            row = rows[index]
            assert row["reduce_scatter"].dtype == dtype
            assert (
                row["reduce_scatter"].numel()
                == C.ring_chunk_sizes(numel, world_size)[rank]
            )
            assert_close(row["reduce_scatter"], total.tensor_split(world_size)[rank])


def test_all_gather_puts_every_rank_chunk_in_rank_order(halves):
    world_size, dtype, per_rank = halves
    for index in range(len(SHARD_NUMELS)):
        expected = torch.cat([rows[index]["mine"] for rows in per_rank])
        for rows in per_rank:
            assert torch.equal(rows[index]["all_gather"], expected)


def test_equal_to_pytorch_where_pytorch_accepts_the_size(halves):
    world_size, dtype, per_rank = halves
    compared = 0
    for rows in per_rank:
        for row in rows:
            if row["numel"] % world_size == 0:
                assert_close(row["reduce_scatter"], row["dist.reduce_scatter_single"])
                assert torch.equal(row["all_gather"], row["dist.all_gather_single"])
                compared += 1
    assert compared >= 2 * world_size  # 12 and 0 divide by every world size


def test_bytes_sent_are_half_a_ring_all_reduce(halves):
    world_size, dtype, per_rank = halves
    element_size = torch.empty((), dtype=dtype).element_size()
    for rank, rows in enumerate(per_rank):
        for row in rows:
            numel = row["numel"]
            assert row[
                "reduce_scatter bytes"
            ] == costmodel.reduce_scatter_bytes_per_rank(
                numel, element_size, world_size, rank
            )
            assert row["all_gather bytes"] == costmodel.all_gather_bytes_per_rank(
                numel, element_size, world_size, rank
            )
            if numel % world_size == 0:  # exactly (n-1)/n of the tensor
                share = (world_size - 1) * numel // world_size * element_size
                assert row["reduce_scatter bytes"] == share
                assert row["all_gather bytes"] == share


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

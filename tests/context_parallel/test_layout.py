"""Which tokens each rank holds: contiguous as tensor_split cuts (a rank may hold
none), zig-zag as PyTorch's head-tail load balancer, refused by name where it cannot
split; sharding and unsharding are inverses."""

import pytest
import torch

from multigpu.context_parallel import (
    chunks_of,
    layout_chunks,
    layout_positions,
    shard_sequence,
    torch_head_tail_positions,
    unshard_sequence,
)


@pytest.mark.parametrize(("seq_len", "world_size"), [(16, 4), (13, 4), (3, 4), (7, 2)])
def test_contiguous_cuts_as_tensor_split(seq_len, world_size):
    expected = torch.arange(seq_len).tensor_split(world_size)
    for rank in range(world_size):
        positions = layout_positions("contiguous", seq_len, world_size, rank)
        assert torch.equal(positions, expected[rank])


@pytest.mark.parametrize(("seq_len", "world_size"), [(16, 4), (8, 2), (12, 3), (16, 8)])
def test_zigzag_is_pytorchs_head_tail_order(seq_len, world_size):
    theirs = torch_head_tail_positions(seq_len, world_size)
    ours = [
        layout_positions("zigzag", seq_len, world_size, r).tolist()
        for r in range(world_size)
    ]
    assert ours == theirs


def test_zigzag_gives_rank_r_chunks_r_and_2n_minus_1_minus_r():
    assert layout_chunks("zigzag", 16, 4, 0) == [range(0, 2), range(14, 16)]
    assert layout_chunks("zigzag", 16, 4, 3) == [range(6, 8), range(8, 10)]


def test_zigzag_refuses_a_length_it_cannot_split_by_name():
    with pytest.raises(ValueError) as error:
        layout_chunks("zigzag", 13, 2, 0)
    assert str(error.value) == (
        "zig-zag sharding needs the sequence length (13) to be divisible by 2 x world "
        "size (4): each rank takes two equal chunks. Pad the sequence to 16 tokens, "
        "or use the contiguous layout."
    )
    with pytest.raises(ValueError, match="Unknown layout 'striped'"):
        layout_chunks("striped", 16, 2, 0)


@pytest.mark.parametrize(("layout", "seq_len"), [("contiguous", 13), ("zigzag", 16)])
def test_shard_then_unshard_gives_the_sequence_back(layout, seq_len):
    x = torch.randn(2, 3, seq_len, 4)
    pieces = [shard_sequence(x, layout, 4, rank) for rank in range(4)]
    assert sum(p.shape[2] for p in pieces) == seq_len
    assert torch.equal(unshard_sequence(pieces, layout, seq_len), x)


def test_chunks_of_joins_consecutive_positions():
    assert chunks_of([0, 1, 14, 15]) == [range(0, 2), range(14, 16)]
    assert chunks_of([6, 7, 8, 9]) == [range(6, 10)]
    assert chunks_of([]) == []

"""Tests for multigpu.tensor_parallel.blocks: the tensor-parallel block (with and
without sequence parallelism) equals one process at 1, 2 and 4 ranks, gradients
included, with one all-reduce per block in forward and one in backward (15)."""

import pytest
import torch

from multigpu.costmodel.tensor_parallel import (
    sp_bytes_per_layer,
    tp_all_reduce_bytes_per_layer,
)
from multigpu.tensor_parallel import (
    TensorParallelBlock,
    block_distances,
    make_block,
    one_process_block,
    sequence_chunk,
    shard_block_state,
)
from tests.tensor_parallel.problem import EXACT, FLOAT32, SHAPE, block_and_data


def _distances(result, reference, rank, world_size, sequence_parallel):
    return block_distances(
        result, reference, rank, world_size, sequence_parallel
    ).values()


@pytest.mark.parametrize("name", ["tp", "sp", "tp dropout", "sp dropout"])
def test_block_equals_one_process_with_gradients(launched, name):
    world_size, results = launched
    dropout = 0.25 if "dropout" in name else 0.0
    block, x, grad_out = block_and_data(dropout=dropout)
    reference = one_process_block(block, x, grad_out, seed=5 if dropout else 0)
    for rank, result in enumerate(results[name]):
        distances = _distances(result, reference, rank, world_size, "sp" in name)
        assert max(distances) < EXACT, (rank, distances)


def test_float32_block_stays_within_its_bound(launched):
    world_size, results = launched
    block, x, grad_out = block_and_data(torch.float32)
    reference = one_process_block(block, x, grad_out)
    for rank, result in enumerate(results["sp float32"]):
        assert max(_distances(result, reference, rank, world_size, True)) < FLOAT32


def test_one_all_reduce_per_block_each_way_and_the_formula_bytes(launched):
    world_size, results = launched
    for result in results["tp"]:
        ledger = result["ledger"]
        assert [(r.kind, r.phase) for r in ledger] == [
            ("all-reduce", "forward"),  # attention's output projection (g)
            ("all-reduce", "forward"),  # the MLP's fc2 (g)
            ("all-reduce", "backward"),  # the MLP's input (f)
            ("all-reduce", "backward"),  # attention's input (f)
        ]
        sent = sum(r.nbytes for r in ledger)
        assert sent == tp_all_reduce_bytes_per_layer(
            2, 8, SHAPE["hidden"], world_size, 8
        )


def test_sequence_parallel_swaps_each_all_reduce_for_two_halves(launched):
    world_size, results = launched
    for result in results["sp"]:
        ledger = result["ledger"]
        pairs = [("all-gather", "reduce-scatter")] * 2
        forward = [r.kind for r in ledger if r.phase == "forward"]
        backward = [r.kind for r in ledger if r.phase == "backward"]
        assert forward == [k for pair in pairs for k in pair]
        assert backward == ["all-gather", "reduce-scatter"] * 2
        activations = sum(r.nbytes for r in ledger if r.phase != "gradient sync")
        assert activations == sp_bytes_per_layer(2, 8, SHAPE["hidden"], world_size, 8)
        sync = [r for r in ledger if r.phase == "gradient sync"]
        # LayerNorms (4 x 8) and the two row-parallel biases (2 x 8): 48 values.
        assert [r.kind for r in sync] == ["all-reduce"]
        assert sync[0].nbytes == 2 * (world_size - 1) / world_size * 48 * 8


@pytest.mark.parametrize(
    ("shape", "world_size", "what", "size"),
    [
        (dict(hidden=6, heads=3, ffn=12), 4, "hidden", 6),
        (dict(hidden=8, heads=8, ffn=12), 8, "ffn", 12),
        (dict(hidden=8, heads=4, ffn=16), 8, "heads", 4),
    ],
)
def test_shapes_the_ranks_cannot_split_are_refused_by_name(
    shape, world_size, what, size
):
    with pytest.raises(ValueError) as error:
        TensorParallelBlock(make_block(**shape), 0, world_size)
    assert str(error.value) == (
        f"{what}={size} is not divisible by the tensor-parallel world size "
        f"{world_size}. Choose a {what} that is a multiple of {world_size}, or run "
        "on a world size that divides it."
    )


def test_a_sequence_the_ranks_cannot_split_is_refused_by_name():
    with pytest.raises(ValueError) as error:
        sequence_chunk(torch.zeros(2, 7, 8), 0, 2)
    assert str(error.value).startswith(
        "seq=7 is not divisible by the tensor-parallel world size 2."
    )


def test_shard_block_state_stacks_q_k_v_per_rank():
    block, _, _ = block_and_data()
    state = block.state_dict()
    shard = shard_block_state(state, 1, 2)
    assert shard["attn.qkv.weight"].shape == (12, 8)  # 3 x (8/2) rows
    assert torch.equal(shard["attn.qkv.weight"][:4], state["attn.q.weight"][4:])
    assert torch.equal(shard["attn.qkv.weight"][8:], state["attn.v.weight"][4:])
    assert torch.equal(shard["mlp.fc2.weight"], state["mlp.fc2.weight"][:, 8:])
    assert torch.equal(shard["mlp.fc2.bias"], state["mlp.fc2.bias"])
    assert set(TensorParallelBlock(block, 1, 2).state_dict()) == set(shard)

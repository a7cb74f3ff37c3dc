"""Tests for multigpu.tensor_parallel.layers: the shards of a linear layer, and the
refusal of a split the ranks cannot make, of tied and of frozen parameters (15)."""

import pytest
import torch
from torch import nn

from multigpu.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallelBlock,
    TensorParallelLM,
    TinyLM,
    column_shard,
    make_block,
    row_shard,
)


def test_column_and_row_shards_put_back_together_are_the_weight():
    weight = torch.arange(24.0).view(4, 6)
    assert torch.equal(torch.cat([column_shard(weight, r, 2) for r in (0, 1)]), weight)
    rows = [row_shard(weight, r, 3) for r in range(3)]
    assert torch.equal(torch.cat(rows, dim=1), weight)
    assert rows[1].shape == (4, 2)


def test_layers_take_their_shard_and_row_keeps_the_whole_bias():
    torch.manual_seed(0)
    linear = nn.Linear(6, 4)
    column = ColumnParallelLinear.from_linears([linear], 1, 2)
    assert torch.equal(column.weight, linear.weight[2:])
    assert torch.equal(column.bias, linear.bias[2:])
    row = RowParallelLinear.from_linear(linear, 2, 3, sequence_parallel=True)
    assert torch.equal(row.weight, linear.weight[:, 4:])
    assert torch.equal(row.bias, linear.bias)
    assert row.bias.sequence_parallel  # its gradient must be summed under SP


@pytest.mark.parametrize(
    ("cut", "what", "size"),
    [(column_shard, "out_features", 4), (row_shard, "in_features", 6)],
)
def test_a_split_the_ranks_cannot_make_is_refused_by_name(cut, what, size):
    with pytest.raises(ValueError) as error:
        cut(torch.zeros(4, 6), 0, 5)
    assert str(error.value) == (
        f"{what}={size} is not divisible by the tensor-parallel world size 5. "
        f"Choose a {what} that is a multiple of 5, or run on a world size that "
        "divides it."
    )


def test_a_tied_weight_is_refused_by_name():
    torch.manual_seed(0)
    lm = TinyLM(16, 8, 4, 16)
    lm.head.weight = lm.embed.weight  # (16, 8) both: tied like GPT-2
    with pytest.raises(ValueError) as error:
        TensorParallelLM(lm, 0, 2)
    assert str(error.value) == (
        "The language model ties embed.weight and head.weight (one tensor, two "
        "modules); the tensor-parallel split would cut them into two parameters "
        "that train apart. Untie them, or split a model without tied weights."
    )


def test_a_frozen_parameter_is_refused_by_name():
    block = make_block()
    block.mlp.fc1.weight.requires_grad_(False)
    with pytest.raises(ValueError) as error:
        TensorParallelBlock(block, 0, 2)
    assert str(error.value) == (
        "The block has a frozen parameter, mlp.fc1.weight (requires_grad=False); the "
        "tensor-parallel split trains every shard. Unfreeze it, or keep frozen "
        "layers out of the split."
    )

"""Column-parallel and row-parallel linear layers (15).

A linear layer y = x Aᵀ + b with A of shape (out, in) split over n ranks:

- :class:`ColumnParallelLinear`: rank r keeps rows r·out/n.. of A (and of b), so it
  computes its own slice of the output features from the whole input; in backward
  the input's gradient is a sum over ranks, which f (:class:`CopyToTensorParallel`)
  all-reduces.
- :class:`RowParallelLinear`: rank r keeps columns r·in/n.. of A and reads only its
  slice of the input features (what a column-parallel layer left it), so each rank
  holds a partial sum of the output, which g (:class:`ReduceFromTensorParallel`)
  all-reduces; the bias, replicated, is added once, after the sum.

A column-parallel layer followed by a row-parallel one (an MLP, attention's heads)
needs one all-reduce in forward and one in backward. With ``sequence_parallel``,
f becomes an all-gather along the sequence and g a reduce-scatter
(:mod:`~multigpu.tensor_parallel.operators`). Megatron's versions:
``megatron/core/tensor_parallel/layers.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from multigpu.tensor_parallel.operators import (
    CopyToTensorParallel,
    GatherFromSequenceParallel,
    ReduceFromTensorParallel,
    ReduceScatterToSequenceParallel,
    check_divisible,
)


def column_shard(tensor: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s rows of a weight (out, in) or a bias (out,): a copy (15)."""
    check_divisible("out_features", tensor.shape[0], world_size)
    rows = tensor.shape[0] // world_size
    return tensor[rank * rows : (rank + 1) * rows].clone()


def row_shard(weight: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s columns of a weight (out, in): a copy (15)."""
    check_divisible("in_features", weight.shape[1], world_size)
    columns = weight.shape[1] // world_size
    return weight[:, rank * columns : (rank + 1) * columns].clone()


def check_splittable(module: nn.Module, what: str) -> None:
    """Refuse a module whose parameters the split cannot keep as they are: a tensor
    shared by two modules (tied) or a frozen parameter (15)."""
    seen: dict[int, str] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            raise ValueError(
                f"{what} ties {seen[id(p)]} and {name} (one tensor, two modules); "
                "the tensor-parallel split would cut them into two parameters that "
                "train apart. Untie them, or split a model without tied weights."
            )
        seen[id(p)] = name
        if not p.requires_grad:
            raise ValueError(
                f"{what} has a frozen parameter, {name} (requires_grad=False); the "
                "tensor-parallel split trains every shard. Unfreeze it, or keep "
                "frozen layers out of the split."
            )


def mark_sequence_parallel(parameter: nn.Parameter) -> nn.Parameter:
    """Flag a replicated parameter that, under sequence parallelism, sees only this
    rank's part of the sequence: its gradient must be summed over the ranks."""
    parameter.sequence_parallel = True
    return parameter


class ColumnParallelLinear(nn.Module):
    """x (..., in) on every rank -> this rank's (..., out/n) slice of x Aᵀ + b (15)."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        sequence_parallel: bool = False,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)  # (out/n, in)
        self.bias = None if bias is None else nn.Parameter(bias)  # (out/n,)
        self.sequence_parallel = sequence_parallel

    @classmethod
    def from_linears(
        cls,
        linears: Sequence[nn.Linear],
        rank: int,
        world_size: int,
        sequence_parallel: bool = False,
    ) -> ColumnParallelLinear:
        """This rank's rows of each of ``linears`` (same input), stacked: one layer
        for attention's q, k and v, each cut at the same place (15)."""
        weight = torch.cat(
            [column_shard(lin.weight.detach(), rank, world_size) for lin in linears]
        )
        biases = [lin.bias for lin in linears]
        bias = None
        if all(b is not None for b in biases):
            bias = torch.cat(
                [column_shard(b.detach(), rank, world_size) for b in biases]
            )
        return cls(weight, bias, sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            x = GatherFromSequenceParallel.apply(x)  # (b, s/n, in) -> (b, s, in)
        else:
            x = CopyToTensorParallel.apply(x)  # f: all-reduce in backward
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """This rank's slice (..., in/n) of x -> the whole x Aᵀ + b (..., out) (15)."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        sequence_parallel: bool = False,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)  # (out, in/n)
        self.bias = None if bias is None else nn.Parameter(bias)  # (out,), whole
        self.sequence_parallel = sequence_parallel
        if self.bias is not None and sequence_parallel:
            mark_sequence_parallel(self.bias)

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        rank: int,
        world_size: int,
        sequence_parallel: bool = False,
    ) -> RowParallelLinear:
        """This rank's columns of ``linear``, and its whole bias (15)."""
        weight = row_shard(linear.weight.detach(), rank, world_size)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(weight, bias, sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.sequence_parallel:
            return row_parallel_linear(x, self.weight, self.bias)
        partial = F.linear(x, self.weight)  # this rank's share of the sum
        out = ReduceScatterToSequenceParallel.apply(partial)  # (b, s/n, out)
        return out if self.bias is None else out + self.bias


def row_parallel_linear(
    x_shard: torch.Tensor, weight_shard: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x Aᵀ + b from this rank's input features x_shard (..., in/n) and columns
    weight_shard (out, in/n) of A; ``bias`` (out,) is whole on every rank (15)."""
    partial = F.linear(x_shard, weight_shard)  # this rank's share of the sum
    out = ReduceFromTensorParallel.apply(partial)  # g: all-reduce forward
    return out if bias is None else out + bias  # once, after the sum

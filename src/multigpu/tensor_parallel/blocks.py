"""A transformer block split over tensor-parallel ranks, with or without sequence
parallelism (15).

:class:`TensorParallelMLP`: fc1 column-parallel, GELU on this rank's slice of the
hidden features, fc2 row-parallel. :class:`TensorParallelAttention`: q, k and v
column-parallel, so each rank computes whole heads (heads/n of them), the output
projection row-parallel. Each costs one all-reduce in forward and one in backward.
:class:`TensorParallelBlock` adds the replicated LayerNorms, dropout and residuals;
with ``sequence_parallel`` those run on this rank's seq/n positions only, and its
input and output are (batch, seq/n, hidden). :func:`shard_block_state` cuts a
one-process :class:`~multigpu.tensor_parallel.model.Block`'s state (or its
gradients) the way the ranks hold it.
"""

from __future__ import annotations

from copy import deepcopy

import torch
from torch import nn
from torch.nn import functional as F

from multigpu.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    check_splittable,
    column_shard,
    mark_sequence_parallel,
    row_shard,
)
from multigpu.tensor_parallel.model import Block, causal_attention, dropout_mask
from multigpu.tensor_parallel.operators import all_reduce_sum, check_divisible


class TensorParallelMLP(nn.Module):
    """(b, s, h) -> (b, s, h); with sequence_parallel (b, s/n, h) -> (b, s/n, h)."""

    def __init__(self, mlp: nn.Module, rank: int, world_size: int, sp: bool) -> None:
        super().__init__()
        self.fc1 = ColumnParallelLinear.from_linears([mlp.fc1], rank, world_size, sp)
        self.fc2 = RowParallelLinear.from_linear(mlp.fc2, rank, world_size, sp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))  # GELU needs no communication


class TensorParallelAttention(nn.Module):
    """Causal self-attention with heads/n heads on each rank (15)."""

    def __init__(self, attn: nn.Module, rank: int, world_size: int, sp: bool) -> None:
        super().__init__()
        check_divisible("heads", attn.heads, world_size)
        self.local_heads = attn.heads // world_size
        linears = [attn.q, attn.k, attn.v]
        self.qkv = ColumnParallelLinear.from_linears(linears, rank, world_size, sp)
        self.out = RowParallelLinear.from_linear(attn.out, rank, world_size, sp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)  # (b, s, 3h/n): this rank's heads of q, k and v
        b, s, _ = qkv.shape
        q, k, v = (
            t.reshape(b, s, self.local_heads, -1).transpose(1, 2)
            for t in qkv.chunk(3, dim=-1)
        )
        context = causal_attention(q, k, v).transpose(1, 2).reshape(b, s, -1)
        return self.out(context)  # row-parallel: the heads' outputs summed


class TensorParallelBlock(nn.Module):
    """This rank's part of a :class:`~multigpu.tensor_parallel.model.Block` (15)."""

    def __init__(
        self,
        block: Block,
        rank: int,
        world_size: int,
        sequence_parallel: bool = False,
    ) -> None:
        super().__init__()
        check_splittable(block, "The block")
        check_block(block)
        hidden = block.ln1.normalized_shape[0]
        check_divisible("hidden", hidden, world_size)
        check_divisible("ffn", block.mlp.fc1.out_features, world_size)
        self.rank, self.world_size = rank, world_size
        self.sequence_parallel, self.dropout = sequence_parallel, block.dropout
        sp = sequence_parallel
        self.ln1 = _copy_norm(block.ln1, sp)
        self.attn = TensorParallelAttention(block.attn, rank, world_size, sp)
        self.ln2 = _copy_norm(block.ln2, sp)
        self.mlp = TensorParallelMLP(block.mlp, rank, world_size, sp)

    def forward(self, x: torch.Tensor, seed: int = 0) -> torch.Tensor:
        x = x + self._drop(self.attn(self.ln1(x)), seed)
        return x + self._drop(self.mlp(self.ln2(x)), seed + 1)

    def _drop(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        """The one-process mask; under sequence parallelism this rank's slice."""
        if not self.dropout:
            return x
        b, s, h = x.shape
        if not self.sequence_parallel:
            return x * dropout_mask((b, s, h), self.dropout, seed, x.dtype)
        full = dropout_mask((b, s * self.world_size, h), self.dropout, seed, x.dtype)
        return x * full[:, self.rank * s : (self.rank + 1) * s]


def check_block(block: nn.Module) -> None:
    """Refuse, by name, a module that is not a transformer block: one without the
    ln1, attn, ln2 and mlp of :class:`~multigpu.tensor_parallel.model.Block` (15)."""
    missing = [n for n in ("ln1", "attn", "ln2", "mlp") if not hasattr(block, n)]
    if missing:
        raise TypeError(
            "TensorParallelBlock splits a transformer block (ln1, attn, ln2, mlp, "
            f"as make_block() builds it); {type(block).__name__} has no "
            f"{', '.join(missing)}. Build the block with make_block(), or split "
            "its nn.Linear layers with ColumnParallelLinear and RowParallelLinear."
        )


def _copy_norm(norm: nn.LayerNorm, sequence_parallel: bool) -> nn.LayerNorm:
    copy = deepcopy(norm)
    if sequence_parallel:
        mark_sequence_parallel(copy.weight)
        mark_sequence_parallel(copy.bias)
    return copy


def sync_sequence_parallel_grads(module: nn.Module) -> None:
    """Sum over the ranks the gradients of the parameters flagged by
    :func:`~multigpu.tensor_parallel.layers.mark_sequence_parallel` (LayerNorms,
    row-parallel biases): each rank saw only its part of the sequence. One
    all-reduce, recorded in the ledger as phase "gradient sync" (15)."""
    flagged = [
        p
        for p in module.parameters()
        if getattr(p, "sequence_parallel", False) and p.grad is not None
    ]
    if not flagged:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in flagged])
    summed = all_reduce_sum(flat, "gradient sync")
    for p, piece in zip(flagged, summed.split([p.numel() for p in flagged])):
        p.grad.copy_(piece.view_as(p.grad))


def shard_block_state(
    state: dict[str, torch.Tensor], rank: int, world_size: int
) -> dict[str, torch.Tensor]:
    """A one-process Block's state (or gradients), keyed as in Block, cut into
    rank ``rank``'s :class:`TensorParallelBlock` state (15)."""
    shard: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.startswith(("ln1.", "ln2.")) or name.endswith(("out.bias", "fc2.bias")):
            shard[name] = tensor.clone()
        elif name.startswith("attn.q."):
            kind = name.rsplit(".", 1)[1]
            parts = [state[f"attn.{p}.{kind}"] for p in "qkv"]
            shard[f"attn.qkv.{kind}"] = torch.cat(
                [column_shard(t, rank, world_size) for t in parts]
            )
        elif name.startswith(("attn.k.", "attn.v.")):
            continue  # stacked with attn.q
        elif name.startswith("mlp.fc1."):
            shard[name] = column_shard(tensor, rank, world_size)
        else:  # attn.out.weight, mlp.fc2.weight
            shard[name] = row_shard(tensor, rank, world_size)
    return shard

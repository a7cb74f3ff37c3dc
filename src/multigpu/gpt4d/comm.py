"""The collectives of the 4-D step as autograd functions on one process group (19).

Lesson 15's f and g (:class:`~multigpu.tensor_parallel.operators.CopyToTensorParallel`,
``ReduceFromTensorParallel``) talk to the whole world; here every dimension has
its own group, so each takes the group:

- :func:`copy_to` (f): identity forward, all-reduce of the gradient backward,
  before a column-parallel layer;
- :func:`reduce_from` (g): all-reduce forward, identity backward, after a
  row-parallel layer;
- :func:`gather_sequence` : all-gather of keys or values along the sequence
  forward, the sum of every rank's gradient, then this rank's slice, backward
  (context parallel: each rank's queries see every earlier key). gloo has no
  reduce-scatter, so backward is an all-reduce and a slice.

A ``None`` group is a dimension of size 1: the functions return their input.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["all_reduce_grads", "copy_to", "gather_sequence", "reduce_from"]


class _CopyTo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):  # noqa: D102
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFrom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):  # noqa: D102
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        return grad, None


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim):  # noqa: D102
        ctx.group, ctx.dim = group, dim
        ctx.rank, ctx.size = dist.get_rank(group), dist.get_world_size(group)
        pieces = [torch.empty_like(x) for _ in range(ctx.size)]
        dist.all_gather(pieces, x.contiguous(), group=group)
        return torch.cat(pieces, dim=dim)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad.chunk(ctx.size, dim=ctx.dim)[ctx.rank].contiguous(), None, None


def copy_to(x: torch.Tensor, group: object) -> torch.Tensor:
    """f: x unchanged; its gradient summed over ``group`` (19)."""
    return x if group is None else _CopyTo.apply(x, group)


def reduce_from(x: torch.Tensor, group: object) -> torch.Tensor:
    """g: x summed over ``group``; its gradient unchanged (19)."""
    return x if group is None else _ReduceFrom.apply(x, group)


def gather_sequence(x: torch.Tensor, group: object, dim: int = -2) -> torch.Tensor:
    """Every rank's ``x`` concatenated along ``dim`` in rank order (19)."""
    return x if group is None else _GatherSequence.apply(x, group, dim)


def all_reduce_grads(parameters: list[torch.nn.Parameter], group: object) -> int:
    """Sum the gradients of ``parameters`` over ``group`` in one flat all-reduce
    (08's flattening); returns the bytes reduced (19)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if group is None or not grads:
        return 0
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    for g, piece in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(piece.view_as(g))
    return flat.numel() * flat.element_size()

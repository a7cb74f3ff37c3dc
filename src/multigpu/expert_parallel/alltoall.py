"""An all-to-all that autograd can go through, and a log of the bytes it sends (18).

``dist.all_to_all_single(output, input, output_split_sizes, input_split_sizes)``
cuts ``input``'s rows into one piece per rank (``input_split_sizes``: how many rows
go to each) and fills ``output`` with the pieces every rank sent to this one, in
rank order (``output_split_sizes``: how many rows come from each). Its backward is
the same exchange run the other way: the gradient of a received row goes back to
the rank that sent it, so the two lists of sizes swap (:class:`AllToAll`).
PyTorch's own autograd versions do the same (``_AlltoAllSingle`` in
torch/distributed/nn/functional.py, ``all_to_all_single_backward`` in
torch/distributed/_functional_collectives.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["AllToAll", "AllToAllRecord", "all_to_all", "exchange_rows"]


@dataclass(frozen=True)
class AllToAllRecord:
    """One all-to-all seen from one rank (18): ``what`` ("counts", "dispatch",
    "combine", and "... backward"), rows and bytes sent to the *other* ranks (the
    piece a rank keeps for itself crosses no link)."""

    what: str
    rows_to_others: int
    bytes_to_others: int


def exchange_rows(
    tensor: torch.Tensor,
    output_split_sizes: list[int],
    input_split_sizes: list[int],
    group: dist.ProcessGroup | None = None,
    log: list[AllToAllRecord] | None = None,
    what: str = "",
) -> torch.Tensor:
    """``dist.all_to_all_single`` on the rows of ``tensor``, without autograd: a new
    tensor of sum(output_split_sizes) rows; appends an :class:`AllToAllRecord` to
    ``log`` (18)."""
    output = tensor.new_empty((sum(output_split_sizes), *tensor.shape[1:]))
    dist.all_to_all_single(
        output,
        tensor.contiguous(),
        list(output_split_sizes),
        list(input_split_sizes),
        group=group,
    )
    if log is not None:
        me = dist.get_rank(group)
        rows = sum(n for rank, n in enumerate(input_split_sizes) if rank != me)
        row_bytes = math.prod(tensor.shape[1:]) * tensor.element_size()
        log.append(AllToAllRecord(what, rows, rows * row_bytes))
    return output


class AllToAll(torch.autograd.Function):
    """all_to_all_single whose backward sends each row's gradient back to the rank
    that sent the row: the same exchange with the split sizes swapped (18)."""

    @staticmethod
    def forward(ctx, tensor, output_split_sizes, input_split_sizes, group, log, what):
        ctx.sizes = (list(output_split_sizes), list(input_split_sizes))
        ctx.group, ctx.log, ctx.what = group, log, what
        return exchange_rows(
            tensor, output_split_sizes, input_split_sizes, group, log, what
        )

    @staticmethod
    def backward(ctx, grad_output):
        output_split_sizes, input_split_sizes = ctx.sizes
        grad = exchange_rows(
            grad_output,
            input_split_sizes,  # swapped: what this rank received goes back
            output_split_sizes,
            ctx.group,
            ctx.log,
            f"{ctx.what} backward",
        )
        return grad, None, None, None, None, None


def all_to_all(
    tensor: torch.Tensor,
    output_split_sizes: list[int],
    input_split_sizes: list[int],
    group: dist.ProcessGroup | None = None,
    log: list[AllToAllRecord] | None = None,
    what: str = "",
) -> torch.Tensor:
    """Rows of ``tensor`` to the ranks of ``group``: ``input_split_sizes[r]`` rows
    (in order) to rank r; returns the rows every rank sent here, in rank order,
    ``output_split_sizes[r]`` from rank r. Autograd sends the gradients back (18)."""
    return AllToAll.apply(
        tensor, output_split_sizes, input_split_sizes, group, log, what
    )

"""All-reduce of one tensor, its mean or its sum: ``hvd.allreduce`` and
``hvd.allreduce_`` with ``op=hvd.Average`` or ``op=hvd.Sum`` (12)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from multigpu.core.checks import check_choice
from multigpu.horovod_api._state import _require_init
from multigpu.runtime.rank import reduce_value

Average = "average"  # op=hvd.Average: the sum over the ranks divided by their number
Sum = "sum"  # op=hvd.Sum: the sum over the ranks
OPS = (Average, Sum)


def allreduce_(
    tensor: torch.Tensor, op: str = Average, name: str | None = None
) -> torch.Tensor:
    """Replace ``tensor`` by its sum (``Sum``) or mean (``Average``) over the ranks,
    in place, and return it. ``name`` is accepted for Horovod's signature: Horovod
    matches tensors across ranks by name, torch.distributed by call order (12)."""
    _require_init("allreduce_")
    check_choice("op", op, OPS)
    dist.all_reduce(tensor)  # a sum
    if op == Average:
        tensor.div_(dist.get_world_size())
    return tensor


def allreduce(
    tensor: torch.Tensor, op: str = Average, name: str | None = None
) -> torch.Tensor:
    """The sum (``Sum``) or mean (``Average``) of ``tensor`` over the ranks, as a
    new tensor; ``tensor`` is not changed (12)."""
    _require_init("allreduce")
    check_choice("op", op, OPS)
    return reduce_value(tensor, average=op == Average)

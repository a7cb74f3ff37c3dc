"""The rank function of ``python -m multigpu.doctor``: one all-reduce whose result
the doctor checks (:mod:`multigpu.doctor`)."""

from __future__ import annotations

import torch
import torch.distributed as dist

# Each rank contributes ``rank + VALUES``: the sum over n ranks is
# ``n * VALUES + n * (n - 1) / 2``, different in every element.
VALUES = (0.0, 1.0, 2.5, -4.0)


def all_reduce_check_rank(rank: int, world_size: int) -> list[float]:
    """All-reduce (sum) ``rank + VALUES`` over the group; return the result, which
    the doctor compares with :func:`expected_all_reduce`."""
    tensor = torch.tensor(VALUES, dtype=torch.float64) + rank
    dist.all_reduce(tensor)
    return tensor.tolist()


def expected_all_reduce(world_size: int) -> list[float]:
    """What :func:`all_reduce_check_rank` returns on every rank of ``world_size``."""
    offset = world_size * (world_size - 1) / 2
    return [world_size * value + offset for value in VALUES]

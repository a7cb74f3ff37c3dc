"""Giving every rank the root's weights and optimizer state:
``hvd.broadcast_parameters`` and ``hvd.broadcast_optimizer_state`` (12)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from multigpu.horovod_api._state import _require_init
from multigpu.horovod_api.optimizer import DistributedOptimizer


def _check_root(root_rank: int) -> None:
    """Raise unless ``root_rank`` is a rank of the group."""
    if not (isinstance(root_rank, int) and 0 <= root_rank < dist.get_world_size()):
        raise ValueError(
            f"root_rank={root_rank!r} is not a rank of this group of "
            f"{dist.get_world_size()}. Pass a rank from 0 to "
            f"{dist.get_world_size() - 1}, usually root_rank=0."
        )


def broadcast_parameters(
    params: dict[str, torch.Tensor] | Iterable[Any], root_rank: int
) -> None:
    """Overwrite every tensor with the root's, in place: ``model.state_dict()``
    (sorted by name, as Horovod does), ``model.named_parameters()`` or
    ``model.parameters()``. All broadcasts start, then all are waited for (12)."""
    _require_init("broadcast_parameters")
    _check_root(root_rank)
    if isinstance(params, dict):
        tensors = [tensor for _, tensor in sorted(params.items())]
    else:
        tensors = [p[1] if isinstance(p, tuple) else p for p in params]
    works = [dist.broadcast(t.detach(), src=root_rank, async_op=True) for t in tensors]
    for work in works:
        work.wait()


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer | DistributedOptimizer, root_rank: int
) -> None:
    """Give every rank the root's optimizer state (momentum buffers, Adam's
    moments, step counts) and hyper-parameters (lr, momentum) (12).

    The root's whole ``state_dict()`` is sent as one pickled object, so it does not
    matter which ranks have state yet: a rank without any receives the root's, and
    if the root has none, every rank ends with none. (Horovod instead broadcasts
    tensor by tensor, so it first creates missing state on a rank by calling the
    optimizer's ``step()`` with zero gradients.)"""
    _require_init("broadcast_optimizer_state")
    _check_root(root_rank)
    if isinstance(optimizer, DistributedOptimizer):
        optimizer = optimizer.optimizer
    message: list[Any] = [None]
    if dist.get_rank() == root_rank:
        state = optimizer.state_dict()
        message[0] = {  # tensors travel on the CPU; load_state_dict moves them back
            "state": {
                index: {
                    key: value.cpu() if torch.is_tensor(value) else value
                    for key, value in values.items()
                }
                for index, values in state["state"].items()
            },
            "param_groups": state["param_groups"],
        }
    dist.broadcast_object_list(message, src=root_rank)
    if dist.get_rank() != root_rank:
        optimizer.load_state_dict(message[0])

"""What the ranks run when 09b's checkers try a learner's code: a checkpoint saved
and loaded under DDP, and one accumulation step with ``no_sync`` (09b)."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from multigpu.ddp import wrap

SAVE_DELAY_S = 1.0  # rank 0's second save waits this long before it writes


def _momentum(optimizer: Any) -> list[torch.Tensor]:
    """SGD's momentum buffers, in parameter order (empty before the first step)."""
    state = optimizer.state_dict()["state"]
    return [state[i]["momentum_buffer"].clone() for i in sorted(state)]


def _sgd_step(model: nn.Module, optimizer: Any) -> None:
    """One SGD step on fixed data, so that the optimizer has momentum buffers."""
    optimizer.zero_grad()
    model(torch.ones(3, 4, dtype=torch.float64)).square().sum().backward()
    optimizer.step()


def _keys(path: str, real_load: Callable) -> list[str]:
    """The top-level keys of the file at ``path``, sorted, or [] if it is no dict."""
    try:
        saved = real_load(path, map_location="cpu", weights_only=False)
    except Exception:  # the file is not there, or not a checkpoint
        return []
    return sorted(map(str, saved)) if isinstance(saved, dict) else []


def checkpoint_probe_rank(
    rank: int, world_size: int, save: Callable, load: Callable, folder: str
) -> dict[str, Any]:
    """Run the learner's ``save(path, model, optimizer, epoch)`` twice (epochs 1 and
    2, with other weights and momentum) and then ``load(path, model, optimizer,
    device)`` into a fresh model and optimizer; report what happened on this rank
    (09b).

    The model takes an SGD step before each save, so the optimizer holds momentum
    buffers that a load must restore. ``torch.save`` and ``torch.load`` are
    watched while the learner's code runs: which ranks saved, and the
    ``map_location`` of each load. Rank 0's second save waits ``SAVE_DELAY_S``
    before writing, as a large checkpoint would, so a rank that loads without
    waiting at a barrier reads epoch 1's file. An exception in ``save`` is raised
    (its peers may be waiting for it); one in ``load`` is reported, with the keys
    of the file it read."""
    path = f"{folder}/checkpoint.pt"
    saves: list[int] = []
    locations: list[Any] = []
    real_save, real_load = torch.save, torch.load

    def watched_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        saves.append(epoch)
        if rank == 0 and epoch == 2:
            time.sleep(SAVE_DELAY_S)
        real_save(obj, f, *args, **kwargs)

    def watched_load(f: Any, *args: Any, **kwargs: Any) -> Any:
        locations.append(kwargs.get("map_location", args[0] if args else None))
        return real_load(f, *args, **kwargs)

    torch.manual_seed(0)
    model = nn.Linear(4, 2).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    fresh = copy.deepcopy(model)
    fresh_optimizer = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    error = None
    torch.save, torch.load = watched_save, watched_load
    try:
        epoch = 1
        _sgd_step(model, optimizer)
        save(path, model, optimizer, epoch)
        dist.barrier()  # the checker's: epoch 1's file is complete everywhere
        _sgd_step(model, optimizer)  # epoch 2's momentum differs from epoch 1's
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)  # epoch 2's weights differ from epoch 1's
        epoch = 2
        save(path, model, optimizer, epoch)
        try:
            loaded_epoch = load(path, fresh, fresh_optimizer, torch.device("cpu"))
        except Exception as raised:  # the learner's load: no peer waits for it
            error = (type(raised).__name__, str(raised))
            loaded_epoch = None
    finally:
        torch.save, torch.load = real_save, real_load
    same = all(
        torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters())
    )
    momentum, loaded_momentum = _momentum(optimizer), _momentum(fresh_optimizer)
    return {
        "saves": saves,
        "locations": [str(location) for location in locations],
        "loaded epoch 2's weights": same,
        "loaded epoch 2's momentum": len(momentum) == len(loaded_momentum)
        and all(map(torch.equal, momentum, loaded_momentum)),
        "momentum buffers after load": len(loaded_momentum),
        "loaded epoch": loaded_epoch,
        "load error": error,
        "saved keys": _keys(path, real_load) if error else [],
    }


def accumulation_probe_rank(
    rank: int,
    world_size: int,
    step: Callable,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    micro_batches: int,
    steps: int = 2,
) -> dict[str, Any]:
    """``steps`` calls of the learner's ``step(ddp_model, optimizer, micro)`` on this
    rank's slice of each global batch, ``micro`` a list of ``micro_batches`` (X, y)
    pairs; report the micro-batch whose backward ran each all-reduce, whether a
    forward ran inside ``no_sync``, and the weights (09b).

    A forward pre-hook counts the forwards; a communication hook records the count
    when DDP reduces a bucket (this small model fits in one bucket), so a backward
    that syncs shows the index of its own forward."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
        allreduce_hook,
    )

    ddp_model = wrap(copy.deepcopy(model))
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    forwards = [0]
    inside = [False]
    synced: list[list[int]] = [[] for _ in range(steps)]
    forwards_inside_no_sync = [0]
    used_no_sync = [False]

    def count_forward(module: nn.Module, args: Any) -> None:
        forwards[0] += 1
        forwards_inside_no_sync[0] += inside[0]

    def counting_hook(state, bucket):  # no annotations: DDP checks them
        synced[current[0]].append((forwards[0] - 1) % micro_batches)
        return allreduce_hook(state, bucket)

    real_no_sync = ddp_model.no_sync

    class WatchedNoSync:
        def __enter__(self) -> None:
            used_no_sync[0] = inside[0] = True
            self.context = real_no_sync()
            self.context.__enter__()

        def __exit__(self, *exc: Any) -> None:
            inside[0] = False
            self.context.__exit__(*exc)

    ddp_model.no_sync = WatchedNoSync  # type: ignore[method-assign]
    ddp_model.module.register_forward_pre_hook(count_forward)
    ddp_model.register_comm_hook(None, counting_hook)
    per_step = len(X) // steps  # the global batch: world_size x micro_batches x b
    current = [0]
    for current[0] in range(steps):
        batch = slice(current[0] * per_step, (current[0] + 1) * per_step)
        mine = X[batch].chunk(world_size)[rank], y[batch].chunk(world_size)[rank]
        micro = list(zip(mine[0].chunk(micro_batches), mine[1].chunk(micro_batches)))
        step(ddp_model, optimizer, micro)
    return {
        "synced": synced,
        "used no_sync": used_no_sync[0],
        "forwards inside no_sync": forwards_inside_no_sync[0],
        "parameters": {
            name: p.detach().clone() for name, p in ddp_model.module.named_parameters()
        },
    }

"""Rank functions of notebook 12's Horovod-style API, run by
:func:`multigpu.runtime.launch.spawn`: notebook 08's training run written as a
Horovod script, and what the fusion buffers, broadcasts and all-reduces of
:mod:`multigpu.horovod_api` give on each rank (12).

Their first argument, the rank that spawn passes, is called ``rank_`` so that the
body can ask ``rank()`` (``hvd.rank()``) as a Horovod script does.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from multigpu.core.batches import epoch_means, per_rank_batch_size, run_batches
from multigpu.core.train import History, TrainConfig, cpu_state_dict
from multigpu.horovod_api import (
    DistributedOptimizer,
    Sum,
    allreduce,
    allreduce_,
    broadcast_optimizer_state,
    broadcast_parameters,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from multigpu.horovod_api.optimizer import FUSION_THRESHOLD_MB
from multigpu.runtime.rank import rank_device


def train_horovod_style_rank(
    rank_: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    backward_passes_per_step: int = 1,
    fusion_threshold_mb: float = FUSION_THRESHOLD_MB,
    different_start: bool = True,
) -> History:
    """Notebook 08's training run written as a Horovod script: the same batches
    (:func:`~multigpu.core.batches.batch_indices`), so the same weights as one
    process on the global batch. With ``different_start`` ranks other than 0 first
    add noise to their weights, as if each had its own seed, so that
    ``hvd.broadcast_parameters`` has work to do. With ``backward_passes_per_step=k``
    each rank's batch is split into k micro-batches (12)."""
    init()
    k = backward_passes_per_step
    per_rank = per_rank_batch_size(config.batch_size, size())
    if per_rank % k != 0:
        raise ValueError(
            f"Each rank's batch of {per_rank} does not split into "
            f"backward_passes_per_step={k} equal micro-batches. Choose a batch_size "
            f"whose share per rank is a multiple of {k}."
        )
    device = rank_device()
    model = copy.deepcopy(model).to(device)  # never change the caller's weights
    if different_start and rank() != 0:
        generator = torch.Generator().manual_seed(rank())
        with torch.no_grad():
            for p in model.parameters():
                noise = torch.randn(p.shape, generator=generator, dtype=p.dtype)
                p.add_(noise.to(device))
    X, y = X.to(device), y.to(device)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=config.lr, momentum=config.momentum
    )
    optimizer = DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        backward_passes_per_step=k,
        fusion_threshold_mb=fusion_threshold_mb,
    )
    broadcast_parameters(model.state_dict(), root_rank=0)
    broadcast_optimizer_state(optimizer, root_rank=0)
    history = History(rank=rank(), world_size=size())
    batches, steps_per_epoch = run_batches(len(X), config, size(), rank())
    for indices in batches:
        optimizer.zero_grad()
        loss_sum = 0.0
        for chunk in indices.chunk(k):  # k micro-batches of per_rank / k
            loss = nn.functional.cross_entropy(model(X[chunk]), y[chunk]) / k
            loss.backward()
            loss_sum += loss.item()
        optimizer.step()
        history.step_loss.append(loss_sum)
    history.train_loss = epoch_means(history.step_loss, steps_per_epoch)
    history.parameters = cpu_state_dict(model)
    return history


def fusion_rank(
    rank_: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    fusion_threshold_mb: float,
) -> dict[str, Any]:
    """One training step on X, y with ``hvd.DistributedOptimizer``: the fused
    all-reduces already started when backward returned (names, gradients still to
    come when each started) and all those of the step (12)."""
    init()
    model = copy.deepcopy(model)
    optimizer = DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        fusion_threshold_mb=fusion_threshold_mb,
    )
    nn.functional.cross_entropy(model(X), y).backward()
    during = [(f.names, f.gradients_to_come) for f in optimizer.fusions]
    optimizer.step()
    return {
        "during_backward": during,
        "all": [f.names for f in optimizer.last_fusions],
    }


def broadcast_rank(
    rank_: int, world_size: int, model: nn.Module, form: str, seed: int = 0
) -> dict[str, Any]:
    """Each rank re-initialises a copy of ``model`` from its own seed, then calls
    ``hvd.broadcast_parameters`` with ``form`` ("state_dict", "named_parameters" or
    "parameters"). Rank 0 alone has momentum buffers (one SGD step) and lr=0.1, the
    others lr=0.5 and no state; then ``hvd.broadcast_optimizer_state``. Returns the
    weights before and after, the momentum buffers and the lr (12)."""
    init()
    model = copy.deepcopy(model)
    torch.manual_seed(seed + rank())
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    before = cpu_state_dict(model)
    params = {
        "state_dict": model.state_dict,
        "named_parameters": model.named_parameters,
        "parameters": model.parameters,
    }[form]()
    broadcast_parameters(params, root_rank=0)
    after = cpu_state_dict(model)
    inner = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    if rank() == 0:
        inner.param_groups[0]["lr"] = 0.1
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        inner.step()  # creates the momentum buffers
    optimizer = DistributedOptimizer(inner, named_parameters=model.named_parameters())
    broadcast_optimizer_state(optimizer, root_rank=0)
    return {
        "before": before,
        "after": after,
        "momentum": [inner.state[p].get("momentum_buffer") for p in model.parameters()],
        "lr": inner.param_groups[0]["lr"],
    }


def api_rank(rank_: int, world_size: int) -> dict[str, Any]:
    """What ``hvd.rank``, ``hvd.size``, ``hvd.local_rank``, ``hvd.local_size``,
    ``hvd.allreduce`` and ``hvd.allreduce_`` give on this rank, with the tensor
    ``[rank + 1, 10 * rank]``; and what ``hvd.shutdown`` leaves (12)."""
    init()
    tensor = torch.tensor([rank() + 1.0, 10.0 * rank()], dtype=torch.float64)
    original = tensor.clone()
    result = {
        "rank": rank(),
        "size": size(),
        "local_rank": local_rank(),
        "local_size": local_size(),
        "average": allreduce(tensor),
        "sum": allreduce(tensor, op=Sum),
        "unchanged": torch.equal(tensor, original),
    }
    returned = allreduce_(tensor, op=Sum)
    result["in_place"] = returned is tensor and torch.equal(tensor, result["sum"])
    result["in_place_average"] = allreduce_(original.clone())
    shutdown()
    result["after_shutdown"] = (is_initialized(), dist.is_initialized())
    init()  # spawn's group is still there
    result["after_init_again"] = is_initialized()
    return result


def resume_rank(rank_: int, world_size: int, broadcast_optimizer: bool) -> bool:
    """A resume as the walk-through wrote it: only rank 0 restores the checkpoint
    (weights and SGD momentum), then the weights are broadcast, and the optimizer
    state too if ``broadcast_optimizer``; one more step; do all ranks still hold
    the same weights? (12)"""
    init()
    torch.manual_seed(0)
    model = nn.Linear(4, 1).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    X = torch.randn(8, 4, dtype=torch.float64)
    y = torch.randn(8, 1, dtype=torch.float64)
    if rank() == 0:  # the checkpoint: one earlier step left momentum behind
        nn.functional.mse_loss(model(X), y).backward()
        optimizer.step()
    broadcast_parameters(model.state_dict(), root_rank=0)
    if broadcast_optimizer:
        broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters()
    )
    optimizer.zero_grad()
    shard = slice(rank() * 8 // size(), (rank() + 1) * 8 // size())
    nn.functional.mse_loss(model(X[shard]), y[shard]).backward()
    optimizer.step()
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(weights) for _ in range(size())]
    dist.all_gather(gathered, weights)
    shutdown()
    return all(torch.equal(gathered[0], other) for other in gathered[1:])

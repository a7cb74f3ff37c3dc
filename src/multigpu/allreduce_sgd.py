"""Synchronous data-parallel SGD by hand: shard the data, all-reduce the gradients.

Taught in ``notebooks/08_allreduce_sgd.ipynb``. A run reads the series'
:class:`~multigpu.core.train.TrainConfig` and returns a
:class:`~multigpu.core.train.History` per rank, like the single-device loop of 01.
The recipe of PyTorch's tutorial "Writing Distributed Applications" (Séb Arnold,
2017), whose names ``DataPartitioner`` and ``average_gradients`` this module borrows,
written with today's API:

1. every rank holds the same model (same seed, same initial weights);
2. a :class:`DataPartitioner` shuffles the sample indices with a fixed seed and deals
   them to the ranks like cards, so the shards are disjoint;
3. each step every rank computes the loss on its own ``batch_size / world_size``
   samples (``batch_size`` is the global batch) and calls ``backward()``;
4. the gradients are summed over the ranks with an all-reduce (``"naive"`` or
   ``"ring"`` from :mod:`multigpu.collectives`, or ``"torch"`` for
   ``dist.all_reduce``) and divided by ``world_size``;
5. every rank takes the same optimizer step, so the replicas stay identical.

:func:`train_loop` is the loop of one rank (and of the single process); the launchers
that start the ranks are in :mod:`multigpu.ranks.allreduce_sgd`. A caller can
replace :func:`sgd_step` by a step of its own with the same signature, and
:func:`multigpu.exercises.allreduce_sgd.check_step` compares its training with the
reference: the exercise where the learner writes the step.

PyTorch's counterparts: ``DistributedSampler``, which deals indices with the same
stride, in https://github.com/pytorch/pytorch/blob/main/torch/utils/data/distributed.py
and ``dist.all_reduce`` in
https://github.com/pytorch/pytorch/blob/main/torch/distributed/distributed_c10d.py.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from multigpu import collectives
from multigpu.core.batches import (  # noqa: F401 (taught in 08)
    DataPartitioner,
    batch_indices,
    epoch_means,
    per_rank_batch_size,
    run_batches,
)
from multigpu.core.compare import max_parameter_difference
from multigpu.core.train import ALLREDUCE_METHODS, History, TrainConfig, cpu_state_dict
from multigpu.runtime.rank import rank_device

# A training step: step(model, optimizer, X, y, config, distributed) -> this rank's
# mean loss, like sgd_step below.
Step = Callable[
    [nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor, TrainConfig, bool],
    float,
]


def allreduce_sum(tensor: torch.Tensor, method: str = "ring") -> None:
    """Sum ``tensor`` over all ranks in place with the named all-reduce (08)."""
    if method == "naive":
        collectives.naive_all_reduce(tensor)
    elif method == "ring":
        collectives.ring_all_reduce(tensor)
    elif method == "torch":
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    else:
        raise ValueError(
            f"Unknown all-reduce {method!r}. Choose one of: "
            f"{', '.join(ALLREDUCE_METHODS)}."
        )


def sum_gradients(model: nn.Module, method: str = "ring") -> None:
    """Replace every gradient by its sum over the ranks, with one all-reduce (08).

    The gradients travel as one flat buffer (one message per step instead of one per
    parameter, as DDP's buckets do). A frozen parameter (``requires_grad=False``)
    is left out; a trainable one that got no gradient on this rank (unused in
    forward) sends zeros, as DDP does with ``find_unused_parameters=True``, so that
    every rank sends a buffer of the same layout.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise RuntimeError(
            "The model has no trainable parameters: every parameter is frozen "
            "(requires_grad=False), so there is nothing to train. Unfreeze at least "
            "one parameter."
        )
    if all(p.grad is None for p in params):
        raise RuntimeError(
            "The model has no gradients to reduce. Call loss.backward() before "
            "summing or averaging gradients."
        )
    for p in params:
        if p.grad is None:  # unused in this rank's forward: a zero gradient
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])  # (total parameters,)
    allreduce_sum(flat, method)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def average_gradients(model: nn.Module, method: str = "ring") -> None:
    """Replace every gradient by its mean over the ranks: sum, then divide (08)."""
    sum_gradients(model, method)
    world_size = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(world_size)


def check_same_start(model: nn.Module) -> None:
    """Raise on every rank unless all ranks' weights and buffers equal rank 0's (08).

    Step 1 of the recipe: averaged gradients keep identical replicas identical, but
    never make different ones agree (models built from ``seed + rank``). This
    module does not broadcast rank 0's weights, as DDP does; it refuses instead.
    """
    floats = [t for t in model.state_dict().values() if t.is_floating_point()]
    mine = torch.cat([t.detach().reshape(-1).double() for t in floats])
    root = mine.clone()
    dist.broadcast(root, src=0)
    differ = torch.tensor([float(not torch.equal(mine, root))], device=mine.device)
    dist.all_reduce(differ)  # the number of ranks whose weights are not rank 0's
    if differ.item() > 0:
        raise ValueError(
            f"The ranks start from different weights: {int(differ.item())} of "
            f"{dist.get_world_size()} ranks differ from rank 0 (a model built from "
            "seed + rank?). Build the model from the same seed on every rank, or "
            "copy rank 0's weights to the others with dist.broadcast first."
        )


def sgd_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    distributed: bool = False,
) -> float:
    """One step on this rank's batch X (B, ...), y (B,); returns its mean loss (08).

    ``distributed=False``: plain SGD, nothing is communicated.
    ``distributed=True`` with ``reduction="average"``: backward the local mean loss,
    then average the gradients over the ranks. With ``reduction="scale_loss"``:
    backward ``loss / world_size``, then sum the gradients. Both give the same update.
    """
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(X), y)  # mean over this rank's batch
    if not distributed:
        loss.backward()
    elif config.reduction == "scale_loss":
        (loss / dist.get_world_size()).backward()
        sum_gradients(model, config.allreduce)
    else:
        loss.backward()
        average_gradients(model, config.allreduce)
    optimizer.step()
    return loss.item()


def train_loop(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    rank: int = 0,
    world_size: int = 1,
    distributed: bool = False,
    step: Step = sgd_step,
) -> History:
    """The loop shared by the single process and every rank; ``step`` does each step.

    How the shards relate to the global batch: epoch ``e`` uses one permutation
    ``order`` of the N sample indices (seeded with ``seed + e``, as
    ``DistributedSampler`` does), and rank ``r`` owns ``order[r::world_size]``. Rank
    ``r``'s ``k``-th batch is ``order[k*G + r : (k+1)*G : world_size]`` for a global
    batch of ``G`` samples, so the ``k``-th batches of all ranks together are exactly
    ``order[k*G : (k+1)*G]``: the ``k``-th batch of a single process that uses the
    same ``order``. Equal per-rank batch sizes make the mean of the per-rank mean
    losses the mean over the global batch, so averaged gradients equal the
    global-batch gradient and k steps on ``world_size`` processes equal k steps of
    :func:`train_one_process`. The last ``N % G`` samples of each epoch's order are
    not used (``drop_last``), which keeps every batch full (08).
    """
    device = rank_device() if distributed else torch.device("cpu")
    model = copy.deepcopy(model).to(device)  # never change the caller's weights
    model.train()
    if distributed:
        check_same_start(model)  # step 1 of the recipe
    X, y = X.to(device), y.to(device)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=config.lr, momentum=config.momentum
    )
    history = History(rank=rank, world_size=world_size)
    batches, steps_per_epoch = run_batches(len(X), config, world_size, rank)
    for epoch in range(config.epochs):
        start = time.perf_counter()
        first = epoch * steps_per_epoch
        for indices in batches[first : first + steps_per_epoch]:  # (batch_size / R,)
            loss = step(model, optimizer, X[indices], y[indices], config, distributed)
            history.step_loss.append(float(loss))
        epoch_losses = history.step_loss[first:]  # equal batches: a plain mean
        history.train_loss.append(sum(epoch_losses) / len(epoch_losses))
        history.seconds.append(time.perf_counter() - start)
    history.parameters = cpu_state_dict(model)
    return history


def train_one_process(
    model: nn.Module, X: torch.Tensor, y: torch.Tensor, config: TrainConfig
) -> History:
    """The reference: plain SGD on the global batch in this process (08).

    X (N, ...) and y (N,) are the whole training set; ``model`` is not changed.
    ``config.allreduce`` and ``config.reduction`` are not used.
    """
    return train_loop(model, X, y, config)


def world_losses(results: list[History]) -> list[float]:
    """Per step, the mean of the ranks' losses = the loss on the global batch (08)."""
    steps = zip(*(result.step_loss for result in results), strict=True)
    return [sum(losses) / len(results) for losses in steps]


def compare_with_reference(
    results: list[History], reference: History
) -> tuple[bool, float, float]:
    """(ranks bit-for-bit identical, max |weight difference|, max |loss difference|)
    of a data-parallel run against the single-process reference (08)."""
    first = results[0].parameters
    identical = all(
        torch.equal(result.parameters[name], tensor)
        for result in results
        for name, tensor in first.items()
    )
    weights = max(
        max_parameter_difference(result.parameters, reference.parameters)
        for result in results
    )
    losses = world_losses(results)
    loss_difference = max(
        abs(a - b) for a, b in zip(losses, reference.step_loss, strict=True)
    )
    return identical, weights, loss_difference

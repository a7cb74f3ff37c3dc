"""Notebook 08's training run with the model wrapped by a step of the ladder (10)."""

from __future__ import annotations

import contextlib
import copy

import torch
import torch.distributed as dist
from torch import nn

from multigpu.core.batches import epoch_means
from multigpu.core.data import epoch_order
from multigpu.core.train import History, TrainConfig, cpu_state_dict
from multigpu.miniddp.ladder import make_ddp


def global_batch_shares(
    num_samples: int, config: TrainConfig, world_size: int = 1, rank: int = 0
) -> tuple[list[torch.Tensor], int]:
    """This rank's share of every full global batch of ``config.batch_size`` in
    ``config.epochs`` epochs, and the number of steps per epoch (10).

    Global batch k of an epoch is ``order[k*G : (k+1)*G]`` (the single process's),
    and rank r takes every R-th sample of it from the r-th on: the indices of
    :func:`~multigpu.core.batches.run_batches` where R divides G; otherwise shares
    that differ by one sample, and empty ones when G < R. The last ``N % G``
    samples of each epoch are not used, as in one process."""
    steps_per_epoch = num_samples // config.batch_size
    if steps_per_epoch == 0:
        raise ValueError(
            f"The global batch of {config.batch_size} is larger than the "
            f"{num_samples} samples, so not even one full batch fits. Use a global "
            f"batch of at most {num_samples}."
        )
    G = config.batch_size
    shares = []
    for epoch in range(config.epochs):
        order = epoch_order(num_samples, config.seed, epoch)
        for k in range(steps_per_epoch):
            shares.append(order[k * G : (k + 1) * G][rank::world_size])
    return shares, steps_per_epoch


def train_with_strategy(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    strategy: str | type = "bucketed",
    options: dict | None = None,
    accumulation: int = 1,
    fp16_compress: bool = False,
) -> History:
    """Notebook 08's training run with ``model`` wrapped by ``strategy``: the same
    batches, so the same weights as one process on the global batch. With
    ``accumulation=k`` each rank's batch is split into k micro-batches, the first
    k - 1 inside ``no_sync()``. ``fp16_compress=True`` (PyTorch's DDP only) sends
    the gradients as float16 through DDP's ``fp16_compress_hook``. The rank and
    the world size are the process group's (10).

    The world size need not divide the global batch: ranks take shares of it that
    differ in size (:func:`global_batch_shares`), some maybe empty, and each rank's
    loss is the sum over its samples times R / G, so that the mean of the ranks'
    gradients is still the global batch's. ``step_loss`` holds that share of each
    step's loss, whose mean over the ranks is the global batch's mean loss."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    wrapped = make_ddp(copy.deepcopy(model), strategy, **(options or {}))
    if fp16_compress:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
            fp16_compress_hook,
        )

        if strategy != "torch":
            raise ValueError(
                "fp16_compress=True registers a communication hook of PyTorch's DDP; "
                f"the {strategy!r} strategy has none. Use strategy='torch'."
            )
        wrapped.register_comm_hook(None, fp16_compress_hook)
    optimizer = torch.optim.SGD(
        wrapped.parameters(), lr=config.lr, momentum=config.momentum
    )
    history = History(rank=rank, world_size=world_size)
    batches, steps_per_epoch = global_batch_shares(len(X), config, world_size, rank)
    share = world_size / config.batch_size  # R / G
    for indices in batches:
        optimizer.zero_grad()
        chunks = indices.tensor_split(accumulation)  # always k, maybe empty
        loss_sum = 0.0
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            context = contextlib.nullcontext() if last else wrapped.no_sync()
            with context:
                output = wrapped(X[chunk])
                loss = nn.functional.cross_entropy(output, y[chunk], reduction="sum")
                (loss * share).backward()
            loss_sum += loss.item() * share
        optimizer.step()
        history.step_loss.append(loss_sum)
    history.train_loss = epoch_means(history.step_loss, steps_per_epoch)
    history.parameters = cpu_state_dict(wrapped.module)
    return history

"""Notebook 08's training run with the model wrapped by a step of the ladder (10)."""

from __future__ import annotations

import contextlib
import copy

import torch
import torch.distributed as dist
from torch import nn

from multigpu.core.sharding import epoch_means, run_batches
from multigpu.core.train import History, TrainConfig, cpu_state_dict
from multigpu.miniddp.ladder import make_ddp


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
    the world size are the process group's (10)."""
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
    batches, steps_per_epoch = run_batches(len(X), config, world_size, rank)
    for indices in batches:
        optimizer.zero_grad()
        chunks = indices.chunk(accumulation)
        loss_sum = 0.0
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            context = contextlib.nullcontext() if last else wrapped.no_sync()
            with context:
                loss = nn.functional.cross_entropy(wrapped(X[chunk]), y[chunk])
                (loss / len(chunks)).backward()
            loss_sum += loss.item() / len(chunks)
        optimizer.step()
        history.step_loss.append(loss_sum)
    history.train_loss = epoch_means(history.step_loss, steps_per_epoch)
    history.parameters = cpu_state_dict(wrapped.module)
    return history

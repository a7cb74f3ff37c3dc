"""The training loop every rank runs in a process group (09)."""

from __future__ import annotations

import copy
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset
from tqdm import tqdm

from multigpu.core.batches import per_rank_batch_size
from multigpu.core.checks import check_positive_int
from multigpu.core.train import BAR_FORMAT, History, TrainConfig, cpu_state_dict
from multigpu.ddp.accumulation import accumulate, scaled_lr
from multigpu.ddp.checkpoints import resume, save_on_main
from multigpu.ddp.evaluation import evaluate_distributed
from multigpu.ddp.loader import distributed_loader
from multigpu.ddp.wrapper import wrap
from multigpu.runtime.checkpoint import unwrap
from multigpu.runtime.rank import rank_device, reduce_value


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) while a loop trained. Its text says where the run stood and
    what a rerun resumes from, in one line: the torchrun script prints it on rank 0
    instead of a traceback on every rank (11)."""


def train_ddp_loop(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    *,
    X_test: torch.Tensor | None = None,
    y_test: torch.Tensor | None = None,
    accumulation: int = 1,
    how: str = "no_sync",
    lr_scaling: str = "none",
    amp: bool = False,
    set_epoch: bool = True,
    checkpoint: str | os.PathLike | None = None,
    resume_from_checkpoint: bool = False,
    stop_after_epochs: int | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = print,
    wrap_options: Mapping[str, Any] | None = None,
    padded_sampler: bool = False,
) -> History:
    """Train ``model`` with DDP in a running process group; this rank's History (09).

    X (N, ...), y (N,): the whole training set, which every rank holds; the
    ``DistributedSampler`` picks this rank's samples. ``config.batch_size`` is the
    global batch of one optimizer step, split over the ranks and then into
    ``accumulation`` micro-batches. Every step is a full global batch of distinct
    samples, ``N // batch_size`` steps per epoch: one process's steps on 08's
    batches (:func:`distributed_loader`); ``padded_sampler=True`` trains on the
    sampler's padded default instead (09 shows why that is not one process).
    ``History.step_loss`` holds this rank's losses,
    ``train_loss`` the epoch means averaged over the ranks, ``test_*`` come from
    :func:`evaluate_distributed`. ``checkpoint``: a file rank 0 writes after every
    epoch; ``resume_from_checkpoint``: start from it if it exists.
    ``stop_after_epochs``: stop early (to simulate an interrupted run).
    Only rank 0 shows progress and calls ``log``.
    """
    check_positive_int("accumulation", accumulation)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = rank_device()
    per_rank = per_rank_batch_size(config.batch_size, world_size)
    if per_rank % accumulation:
        raise ValueError(
            f"A per-rank batch of {per_rank} does not split into {accumulation} "
            "equal micro-batches. Choose a global batch that is a multiple of "
            f"world_size x accumulation = {world_size * accumulation}."
        )
    main = rank == 0
    loader = distributed_loader(
        TensorDataset(X, y),
        config.batch_size,
        rank,
        world_size,
        config.seed,
        padded_sampler=padded_sampler,
    )
    if len(loader) == 0:
        raise ValueError(
            f"The global batch of {config.batch_size} is larger than the {len(X)} "
            "samples, so not even one full batch fits. Use a global batch of at "
            f"most {len(X)}."
        )
    model = wrap(copy.deepcopy(model), device, **dict(wrap_options or {}))
    lr = scaled_lr(config.lr, world_size, lr_scaling)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=config.momentum)
    scaler = torch.amp.GradScaler("cuda") if amp and device.type == "cuda" else None
    start_epoch = 0
    if checkpoint is not None and resume_from_checkpoint:
        start_epoch = resume(checkpoint, model, optimizer, device)
        if main and log and start_epoch >= config.epochs:
            log(
                f"the run is already complete: {os.path.basename(checkpoint)} is of "
                f"epoch {start_epoch}, and this run asks for {config.epochs} "
                "epoch(s), so there is nothing to train. Use a new checkpoint file "
                "to train again, or more epochs to train on."
            )
        elif main and log and start_epoch:
            log(f"resumed from the checkpoint of epoch {start_epoch}")
    history = History(rank=rank, world_size=world_size)
    last_epoch = config.epochs
    if stop_after_epochs is not None:
        last_epoch = min(last_epoch, start_epoch + stop_after_epochs)
    steps, saved = start_epoch * len(loader), start_epoch or None  # for a Ctrl-C
    epoch = start_epoch
    try:
        for epoch in range(start_epoch, last_epoch):
            start = time.perf_counter()
            if set_epoch:
                loader.sampler.set_epoch(epoch)  # a new shuffle every epoch
            model.train()
            losses = []
            batches = tqdm(
                loader,
                desc=f"epoch {epoch + 1}/{config.epochs}",
                disable=not (progress and main),
                bar_format=BAR_FORMAT,
                file=sys.stderr,
                mininterval=0.5,
            )
            for xb, yb in batches:  # (per_rank, C, H, W), (per_rank,)
                xb, yb = xb.to(device), yb.to(device)
                optimizer.zero_grad()
                micro = list(zip(xb.chunk(accumulation), yb.chunk(accumulation)))
                loss = accumulate(model, micro, how, amp, scaler)
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                losses.append(loss)
                steps += 1
            batches.close()
            history.step_loss.extend(losses)
            line = end_epoch(
                history, model, losses, epoch, config.epochs, X_test, y_test
            )
            if checkpoint is not None:
                save_on_main(checkpoint, model, optimizer, epoch + 1, config=config)
                saved = epoch + 1
            history.seconds.append(time.perf_counter() - start)
            if main and log:
                log(line)
    except KeyboardInterrupt:  # Ctrl-C: one line for the script, not a traceback
        where = f"interrupted at step {steps} (epoch {epoch + 1} of {config.epochs})"
        raise Interrupted(where + _kept(checkpoint, saved)) from None
    history.parameters = cpu_state_dict(unwrap(model))
    return history


def end_epoch(
    history: History,
    model: nn.Module,
    losses: list[float],
    epoch: int,
    epochs: int,
    X_test: torch.Tensor | None = None,
    y_test: torch.Tensor | None = None,
) -> str:
    """What every rank does at the end of epoch ``epoch`` (from 0) of ``epochs``
    (09, 11): append to ``history`` the mean of this rank's ``losses`` averaged over
    the ranks (one all-reduce) and, with a test set, the test loss and accuracy of
    :func:`evaluate_distributed` (every test sample once). Returns the epoch's line,
    ``epoch E/F: train loss ...[, test loss ..., test accuracy ...]``, which rank 0
    logs."""
    mean = torch.tensor(sum(losses) / len(losses), dtype=torch.float64)
    history.train_loss.append(reduce_value(mean).item())  # over all ranks
    line = f"epoch {epoch + 1}/{epochs}: train loss {history.train_loss[-1]:.4f}"
    if X_test is not None and y_test is not None:
        test_loss, accuracy = evaluate_distributed(model, X_test, y_test)
        history.test_loss.append(test_loss)
        history.test_accuracy.append(accuracy)
        line += f", test loss {test_loss:.4f}, test accuracy {accuracy:.4f}"
    return line


def _kept(checkpoint: str | os.PathLike | None, saved: int | None) -> str:
    """What an interrupted run keeps, for :class:`Interrupted`'s line (09b, 11)."""
    if checkpoint is None:
        return "; nothing was saved (no checkpoint file)"
    if saved is None:
        return "; no checkpoint was saved yet (one is saved after every epoch)"
    return (
        f"; the last checkpoint, {os.path.basename(checkpoint)}, is of epoch "
        f"{saved}, which a rerun that resumes (--resume) goes on from"
    )

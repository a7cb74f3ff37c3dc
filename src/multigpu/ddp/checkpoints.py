"""Checkpoints under DDP: rank 0 saves, every rank loads (09b)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from multigpu.runtime.checkpoint import (
    CheckpointMismatchError,
    load_checkpoint,
    save_checkpoint,
)
from multigpu.runtime.rank import is_main_process


def save_on_main(
    path: str | os.PathLike, model: nn.Module, optimizer: Any, epoch: int, **extra: Any
) -> None:
    """Rank 0 saves atomically (``checkpoint.save_checkpoint``: no ``module.``
    prefix), then every rank waits at a barrier, so none reads it too early (09b)."""
    if is_main_process():
        save_checkpoint(path, model, optimizer, epoch=epoch, **extra)
    if dist.is_initialized():
        dist.barrier()


def resume(
    path: str | os.PathLike, model: nn.Module, optimizer: Any, device: torch.device
) -> int:
    """Load the checkpoint into every rank (tensors straight to ``device`` with
    ``map_location``, not to the GPU they were saved from); return the epoch to
    start at, 0 when there is no file yet (09b). An optimizer created with another
    lr or momentum than the saved one raises ``CheckpointMismatchError``: loading
    would silently train with the saved values (:func:`changed_setting`)."""
    if not Path(path).exists():
        return 0
    asked = optimizer_settings(optimizer)
    checkpoint = load_checkpoint(path, model, optimizer, map_location=device)
    changed = changed_setting(asked, optimizer_settings(optimizer))
    if changed is not None:
        name, saved, now = changed
        raise CheckpointMismatchError(
            f"{Path(path).name} was saved by a run whose optimizer had {name} "
            f"{saved}, and this run asks for {now}: resuming would train with "
            f"{saved}. Resume with {name} {saved}, or start afresh with a new "
            "checkpoint file."
        )
    return int(checkpoint["epoch"] or 0)


# Optimizer settings that choose how a step is computed, not what it computes.
IMPLEMENTATION_KEYS = frozenset(
    {"params", "foreach", "fused", "differentiable", "capturable"}
)


def optimizer_settings(optimizer: Any) -> list[dict[str, Any]]:
    """Every parameter group's hyperparameters (``lr``, ``momentum``, ...), without
    its parameters and the implementation switches (09b, 11)."""
    return [
        {key: value for key, value in group.items() if key not in IMPLEMENTATION_KEYS}
        for group in optimizer.param_groups
    ]


def changed_setting(
    asked: list[dict[str, Any]], loaded: list[dict[str, Any]]
) -> tuple[str, Any, Any] | None:
    """The first hyperparameter that loading a saved optimizer state changed, as
    (name, saved value, asked value); None if none did. ``optimizer.load_state_dict``
    puts back the saved ``lr`` and ``momentum`` whatever the optimizer was created
    with. A group whose saved state has ``initial_lr`` (a learning-rate scheduler's)
    is not compared on ``lr``, which the schedule moves as it goes (09b, 11)."""
    for wanted, got in zip(asked, loaded):
        for name, value in wanted.items():
            if name == "lr" and "initial_lr" in got:
                continue
            if name in got and got[name] != value:
                return name, got[name], value
    return None

"""Checkpoints under DDP: rank 0 saves, every rank loads (09b)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from multigpu.runtime.checkpoint import load_checkpoint, save_checkpoint
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
    start at, 0 when there is no file yet (09b)."""
    if not Path(path).exists():
        return 0
    checkpoint = load_checkpoint(path, model, optimizer, map_location=device)
    return int(checkpoint["epoch"] or 0)

"""Wrapping a model in DistributedDataParallel (09)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from multigpu.runtime.rank import rank_device


def wrap(model: nn.Module, device: torch.device | None = None, **options: Any) -> DDP:
    """``DistributedDataParallel(model)``: no ``device_ids`` on CPU, this rank's GPU
    on CUDA. Building it broadcasts rank 0's weights and buffers to every rank (09).
    ``options`` go to DDP (e.g. ``find_unused_parameters=True``)."""
    device = rank_device() if device is None else device
    model = model.to(device)
    if device.type == "cuda":
        return DDP(model, device_ids=[device.index], **options)
    return DDP(model, **options)

"""One optimizer step: the learning rate, gradient accumulation and AMP (09, 09b)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from multigpu.core.checks import check_choice

LR_SCALINGS = ("none", "linear")  # names accepted by `lr_scaling=`
# How gradient accumulation keeps DDP from syncing every micro-batch: the context
# manager, PyTorch's flag set before the forward (right), or after it (the trap).
ACCUMULATIONS = ("no_sync", "flag_before_forward", "flag_after_forward")


def scaled_lr(lr: float, world_size: int, lr_scaling: str = "none") -> float:
    """The learning rate to use on ``world_size`` ranks (09).

    ``"none"``: ``lr`` unchanged. With averaged gradients N ranks at b samples each
    train exactly like one process at N·b samples and the same lr (08), so nothing
    needs fixing. ``"linear"``: ``lr × world_size``, a choice for when the per-rank
    batch is kept and the global batch grows with the world size: it keeps the step
    per sample roughly as it was (Goyal et al., 2017).
    """
    check_choice("lr_scaling", lr_scaling, LR_SCALINGS)
    return lr * world_size if lr_scaling == "linear" else lr


def _autocast(device: torch.device, amp: bool) -> contextlib.AbstractContextManager:
    """bfloat16 autocast on CPU, float16 on CUDA; nothing when ``amp`` is False."""
    if not amp:
        return contextlib.nullcontext()
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    return torch.autocast(device.type, dtype=dtype)


def accumulate(
    model: DDP,
    micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
    how: str = "no_sync",
    amp: bool = False,
    scaler: Any = None,
    after_backward: Callable[[int], None] | None = None,
) -> float:
    """Forward and backward every micro-batch; gradients are synced only on the last
    one. Returns the mean loss over the micro-batches (09b).

    The loss of each (equal-sized) micro-batch is divided by their number, so the
    summed gradients are those of the mean loss over the whole per-rank batch.
    ``how``: ``"no_sync"`` (DDP's context manager around forward *and* backward);
    ``"flag_before_forward"`` (``model.require_backward_grad_sync`` set before the
    forward, the same thing); ``"flag_after_forward"`` (the flag set between forward
    and backward: DDP reads it in the forward, so the syncs land on the wrong
    micro-batches and the ranks drift apart). ``after_backward(i)`` is called
    after micro-batch i's backward (to watch what happened).
    """
    check_choice("accumulation", how, ACCUMULATIONS)
    device = next(model.parameters()).device
    count = len(micro_batches)
    total = 0.0
    for i, (X, y) in enumerate(micro_batches):
        last = i == count - 1
        if how == "flag_before_forward":
            model.require_backward_grad_sync = last
        context = model.no_sync() if how == "no_sync" and not last else None
        with context or contextlib.nullcontext():
            with _autocast(device, amp):
                loss = nn.functional.cross_entropy(model(X), y) / count
            if how == "flag_after_forward":
                model.require_backward_grad_sync = last  # too late for this forward
            (scaler.scale(loss) if scaler is not None else loss).backward()
        if after_backward is not None:
            after_backward(i)
        total += loss.item()
    return total

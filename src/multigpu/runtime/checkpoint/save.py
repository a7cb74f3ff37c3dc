"""Saving a checkpoint: the unwrapped model's state, the optimizer's, and plain
extras, written atomically (06, 11)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from multigpu.runtime.checkpoint.atomic import (
    check_folders,
    disk_error,
    write_atomically,
)
from multigpu.runtime.checkpoint.plain_data import _check_loadable, to_plain_data
from multigpu.runtime.checkpoint.prefix import unwrap

MODEL_KEY = "model"  # the checkpoint dict's entry for the model's state_dict
OPTIMIZER_KEY = "optimizer"  # ... for the optimizer's state_dict (or None)
EPOCH_KEY = "epoch"  # ... for the epoch number (or None)
# ... for the optimizer's class name ("SGD"); only there when an optimizer is saved
OPTIMIZER_TYPE_KEY = "optimizer_type"
RESERVED_KEYS = (MODEL_KEY, OPTIMIZER_KEY, EPOCH_KEY, OPTIMIZER_TYPE_KEY)


def save_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    epoch: int | None = None,
    **extra: Any,
) -> Path:
    """Atomically save ``{"model": unwrap(model).state_dict(), "optimizer": ...,
    "epoch": epoch, **extra}`` to ``path`` (no ``module.`` prefix) (06, 11).

    With an optimizer, ``"optimizer_type"`` also records its class name ("SGD"), so
    that :func:`load_checkpoint` can say when it is loaded into another type.
    ``extra`` holds plain data: tensors, numbers, strings, lists, tuples and dicts of
    them, and dataclasses (``config=TrainConfig()``), which are stored as a dict of
    their fields with a note of their type (see :func:`to_plain_data`). Anything
    that weights-only loading would refuse (a ``Path``, a NumPy number, your own
    class) raises a ``TypeError`` here, before the file is touched, rather than
    when the checkpoint is loaded. The file carries a checksum of its bytes, which
    :func:`load_checkpoint` checks (see :mod:`.checksum`).
    """
    path = Path(path)
    clashing = sorted(set(extra) & set(RESERVED_KEYS))
    if clashing:
        raise ValueError(
            f"save_checkpoint keeps the key(s) {clashing} for itself, so they cannot "
            "be passed as extra values. Store the value under another name."
        )
    plain = {
        key: to_plain_data(value) for key, value in {EPOCH_KEY: epoch, **extra}.items()
    }
    for key, value in plain.items():
        _check_loadable(key, value)
    checkpoint = {
        MODEL_KEY: unwrap(model).state_dict(),
        OPTIMIZER_KEY: None if optimizer is None else optimizer.state_dict(),
        **plain,
    }
    if optimizer is not None:
        checkpoint[OPTIMIZER_TYPE_KEY] = type(optimizer).__name__
    check_folders(path)  # a file where a folder should be: one clear line
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        clear = disk_error(path, error)  # a read-only or full disk: one clear line
        if clear is None:
            raise
        raise clear from error
    write_atomically(path, checkpoint)
    return path

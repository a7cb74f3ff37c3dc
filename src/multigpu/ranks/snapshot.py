"""The ranks of notebook 11 started through ``spawn``: each runs
:func:`multigpu.snapshot.train_with_snapshots` (11)."""

from __future__ import annotations

import importlib

import torch
from torch import nn

from multigpu.core.train import History, TrainConfig
from multigpu.snapshot import train_with_snapshots


def snapshot_rank(
    rank: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    folder: str,
    every: int,
    stop_after_steps: int | None = None,
    module: str | None = None,
) -> History:
    """What each rank runs when a notebook starts :func:`train_with_snapshots`
    through ``launch.spawn`` (11). ``module``: the name of a module whose
    ``save_snapshot`` and ``load_snapshot`` replace :mod:`multigpu.snapshot`'s (an
    exercise)."""
    functions = {}
    if module is not None:
        written = importlib.import_module(module)
        functions = {"save": written.save_snapshot, "load": written.load_snapshot}
    return train_with_snapshots(
        model,
        X,
        y,
        config,
        folder,
        every,
        stop_after_steps=stop_after_steps,
        log=None,
        **functions,
    )

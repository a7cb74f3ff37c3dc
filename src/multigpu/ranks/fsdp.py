"""The rank functions of notebook 14 (FSDP by hand), and their launchers (14)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from multigpu.core.train import TrainConfig
from multigpu.fsdp import FSDPHistory, train_fsdp, train_fsdp2_mixed
from multigpu.fsdp.train import train_unit_hooks


def _own(model: Any, rank: int) -> nn.Module:
    """A list of models means one per rank (built from ``seed + rank``)."""
    return model[rank] if isinstance(model, (list, tuple)) else model


def fsdp_runs_rank(
    rank: int,
    world_size: int,
    runs: list[tuple[Any, torch.Tensor, torch.Tensor, TrainConfig, dict]],
) -> list[FSDPHistory]:
    """Train each (model, X, y, config, options) of ``runs`` with FSDP by hand, one
    after the other on these ranks: one launch for many runs (14)."""
    torch.set_num_threads(1)
    return [
        train_fsdp(_own(model, rank), X, y, config, **options)
        for model, X, y, config, options in runs
    ]


def fsdp2_mixed_runs_rank(
    rank: int,
    world_size: int,
    runs: list[tuple[Any, torch.Tensor, torch.Tensor, TrainConfig]],
) -> list:
    """Train each (model, X, y, config) of ``runs`` with FSDP2 under bf16
    parameters and fp32 reductions, one after the other (14)."""
    torch.set_num_threads(1)
    return [
        train_fsdp2_mixed(_own(model, rank), X, y, config)
        for model, X, y, config in runs
    ]


def unit_hooks_rank(
    rank: int,
    world_size: int,
    hooks: Any,
    runs: list[tuple[Any, torch.Tensor, torch.Tensor, TrainConfig]],
) -> list[dict[str, Any]]:
    """Train each (model, X, y, config) of ``runs`` with each unit's life left to
    ``hooks`` (a hooks class, made here, or an object), until the first mistake;
    one report per run (:func:`~multigpu.fsdp.train.train_unit_hooks`) (14)."""
    torch.set_num_threads(1)
    hooks = hooks() if isinstance(hooks, type) else hooks
    reports = []
    for model, X, y, config in runs:
        reports.append(train_unit_hooks(_own(model, rank), X, y, config, hooks))
        if reports[-1]["mistake"]:
            break
    return reports


def mixed_precision_exercise_rank(
    rank: int, world_size: int, gather: Any, reduce: Any, numel: int
) -> dict[str, Any]:
    """Run the learner's ``gather(shard, full)`` and ``reduce(full_grad,
    shard_grad)`` once on known tensors; report what came out, or the error (14)."""
    from multigpu.zero import shard_of

    torch.set_num_threads(1)
    report: dict[str, Any] = {"rank": rank}
    master = torch.linspace(-1, 1, numel, dtype=torch.float32) / 3  # not bf16 values
    shard = torch.nn.Parameter(shard_of(master, rank, world_size).clone())
    full = torch.empty(numel, dtype=torch.bfloat16)
    try:
        report["gather_sent"] = gather(shard, full)
        report["full"] = full.clone()
    except Exception as error:  # the learner's mistake, reported as text
        report["gather_error"] = f"{type(error).__name__}: {error}"
    report["shard_after"] = shard.detach().clone()
    generator = torch.Generator().manual_seed(rank)
    full_grad = torch.randn(numel, generator=generator).to(torch.bfloat16)
    shard_grad = torch.empty_like(shard)
    try:
        report["reduce_sent"] = reduce(full_grad, shard_grad)
        report["shard_grad"] = shard_grad.clone()
    except Exception as error:
        report["reduce_error"] = f"{type(error).__name__}: {error}"
    return report

"""The ranks of notebook 16 and the launchers that start them (16).

:func:`pipeline_rank` runs one step of a hand-written schedule
(:func:`multigpu.pipeline.pipeline_step`); :func:`torch_pipeline_rank` one step of
``torch.distributed.pipelining``. :func:`run_pipelines` and
:func:`run_torch_pipelines` start them, several steps in one launch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from multigpu.pipeline import (
    PipelineRun,
    StageResult,
    merge_stage_results,
    pipeline_step,
    schedule_actions,
    torch_pipeline_step,
)
from multigpu.runtime.launch import SLOW_TIMEOUT_S, in_one_launch, spawn

__all__ = [
    "pipeline_rank",
    "run_pipelines",
    "run_torch_pipelines",
    "torch_pipeline_rank",
]


def pipeline_rank(
    rank: int,
    world_size: int,
    model: nn.Sequential,
    X: torch.Tensor,
    y: torch.Tensor,
    num_microbatches: int,
    schedule: str | list,
    delays: tuple[float, float] = (0.0, 0.0),
    message_timeout: float | None = None,
) -> StageResult:
    """Rank function: one step of ``schedule`` ("gpipe", "1f1b", or the actions of
    every stage) on this rank's stage (16)."""
    actions = schedule_actions(schedule, world_size, num_microbatches)
    return pipeline_step(
        rank,
        world_size,
        model,
        X,
        y,
        num_microbatches,
        actions,
        delays,
        message_timeout,
    )


def run_pipelines(
    model: nn.Sequential,
    X: torch.Tensor,
    y: torch.Tensor,
    num_stages: int,
    steps: Sequence[tuple],
    timeout: float = SLOW_TIMEOUT_S,
) -> list[PipelineRun]:
    """Start ``num_stages`` ranks once and run one pipeline step for each
    (num_microbatches, schedule[, delays[, message_timeout]]) of ``steps`` (16)."""
    calls = [(pipeline_rank, (model, X, y, *step)) for step in steps]
    per_rank = spawn(in_one_launch, num_stages, calls, timeout=timeout)
    return [
        merge_stage_results([ranks[k] for ranks in per_rank]) for k in range(len(steps))
    ]


def torch_pipeline_rank(
    rank: int,
    world_size: int,
    model: nn.Sequential,
    X: torch.Tensor,
    y: torch.Tensor,
    num_microbatches: int,
    schedule: str,
) -> dict:
    """Rank function: one step of ``torch.distributed.pipelining`` with
    ``schedule`` ("gpipe" or "1f1b") (16)."""
    return torch_pipeline_step(
        rank, world_size, model, X, y, num_microbatches, schedule
    )


def run_torch_pipelines(
    model: nn.Sequential,
    X: torch.Tensor,
    y: torch.Tensor,
    num_stages: int,
    steps: Sequence[tuple[int, str]],
    timeout: float = SLOW_TIMEOUT_S,
) -> list[list[dict]]:
    """Start ``num_stages`` ranks once and run ``torch.distributed.pipelining`` for
    each (num_microbatches, schedule) of ``steps``; per step, every rank's dict."""
    calls = [(torch_pipeline_rank, (model, X, y, *step)) for step in steps]
    per_rank = spawn(in_one_launch, num_stages, calls, timeout=timeout)
    return [[ranks[k] for ranks in per_rank] for k in range(len(steps))]

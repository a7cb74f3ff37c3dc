"""One pipeline step on a rank, and the ranks' results put together (16).

:func:`pipeline_step` is what every rank runs: cut the model, take its stage and
its list of actions, run them. :func:`merge_stage_results` puts the ranks' results
together in the parent: the gradients of the whole model (each from the stage
that holds it), the loss, the timeline and what each stage held at its peak.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from multigpu.pipeline.executor import StageResult, activation_shapes, run_actions
from multigpu.pipeline.schedules import Action
from multigpu.pipeline.stages import split_microbatches, split_sequential
from multigpu.pipeline.timeline import ScheduleBlock

__all__ = [
    "PipelineRun",
    "max_gradient_difference",
    "merge_stage_results",
    "pipeline_step",
]


def pipeline_step(
    stage: int,
    num_stages: int,
    model: nn.Sequential,
    X: torch.Tensor,
    y: torch.Tensor,
    num_microbatches: int,
    actions: list[list[Action]],
    delays: tuple[float, float] = (0.0, 0.0),
    message_timeout: float | None = None,
) -> StageResult:
    """Stage ``stage`` (this rank) of ``model`` cut into ``num_stages`` stages runs
    ``actions[stage]`` on the micro-batches of (X, y); its gradients are named as
    in ``model`` (16)."""
    model.zero_grad(set_to_none=True)  # a step starts from no gradients
    stages = split_sequential(model, num_stages)
    microbatches = split_microbatches(X, y, num_microbatches)
    shapes = activation_shapes(stages, X)
    result = run_actions(
        stages[stage],
        actions[stage],
        stage,
        num_stages,
        microbatches,
        shape=shapes[stage],
        in_shape=shapes[stage - 1] if stage > 0 else None,
        delays=delays,
        message_timeout=message_timeout,
    )
    mine = {id(p) for p in stages[stage].parameters()}
    result.gradients = {
        name: None if p.grad is None else p.grad.clone()
        for name, p in model.named_parameters()
        if id(p) in mine
    }
    return result


@dataclass
class PipelineRun:
    """The ranks' results of one step, put together."""

    gradients: dict[str, torch.Tensor | None]
    loss: float
    blocks: list[ScheduleBlock]  # seconds from the first block's start
    peak_in_flight: list[int]  # per stage
    peak_saved_bytes: list[int]  # per stage
    saved_bytes: list[list[int]]  # per stage, per micro-batch
    bytes_sent: list[int]  # per stage


def merge_stage_results(results: list[StageResult]) -> PipelineRun:
    """One :class:`PipelineRun` from every rank's :class:`StageResult`."""
    start = min((b.start for r in results for b in r.blocks), default=0.0)
    blocks = [
        ScheduleBlock(b.stage, b.op, b.microbatch, b.start - start, b.end - start)
        for r in results
        for b in r.blocks
    ]
    gradients: dict[str, torch.Tensor | None] = {}
    for r in results:
        gradients.update(r.gradients)
    return PipelineRun(
        gradients=gradients,
        loss=results[-1].loss,
        blocks=sorted(blocks, key=lambda b: (b.start, b.stage)),
        peak_in_flight=[r.peak_in_flight for r in results],
        peak_saved_bytes=[r.peak_saved_bytes for r in results],
        saved_bytes=[r.saved_bytes for r in results],
        bytes_sent=[r.bytes_sent for r in results],
    )


def max_gradient_difference(
    a: dict[str, torch.Tensor | None], b: dict[str, torch.Tensor | None]
) -> float:
    """The largest |difference| between two sets of gradients with the same names;
    a gradient that is None in one and not in the other counts as infinite."""
    if a.keys() != b.keys():
        raise ValueError(
            "The two sets of gradients name different parameters. Compare "
            "gradients of the same model."
        )
    worst = 0.0
    for name, value in a.items():
        if (value is None) != (b[name] is None):
            return float("inf")
        if value is not None:
            worst = max(worst, (value - b[name]).abs().max().item())
    return worst

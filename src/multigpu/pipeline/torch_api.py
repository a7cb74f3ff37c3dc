"""The same step with PyTorch's ``torch.distributed.pipelining`` (16).

``PipelineStage`` wraps this rank's stage (the same cut as
:func:`~multigpu.pipeline.split_sequential`); ``ScheduleGPipe`` or
``Schedule1F1B`` cuts the batch with ``tensor_split`` (like
:func:`~multigpu.pipeline.split_microbatches`) and runs the schedule. Two settings
make it one process on the whole batch: the loss is the *summed* cross-entropy
divided by the batch size, and ``scale_grads=False``, because by default the
schedule divides the accumulated gradients by the number of micro-batches
(``scale_grads`` in torch/distributed/pipelining/schedules.py), which is right
only for a mean loss over micro-batches of equal size.
"""

from __future__ import annotations

import torch
from torch import nn

from multigpu.core.checks import check_choice
from multigpu.pipeline.executor import microbatch_loss
from multigpu.pipeline.stages import split_sequential

__all__ = ["TORCH_SCHEDULES", "torch_pipeline_step"]

TORCH_SCHEDULES = ("gpipe", "1f1b")


def torch_pipeline_step(
    stage: int,
    num_stages: int,
    model: nn.Sequential,
    X: torch.Tensor,
    y: torch.Tensor,
    num_microbatches: int,
    schedule: str,
) -> dict:
    """One step of ``torch.distributed.pipelining`` on stage ``stage`` (this rank):
    {"gradients": {name: gradient or None}, "loss": the last stage's loss} (16)."""
    check_choice("schedule", schedule, TORCH_SCHEDULES)
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
    )

    model.zero_grad(set_to_none=True)  # a step starts from no gradients
    stages = split_sequential(model, num_stages)
    wrapped = PipelineStage(stages[stage], stage, num_stages, torch.device("cpu"))
    num_samples = len(X)

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return microbatch_loss(logits, target, num_samples)

    kind = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
    runner = kind(wrapped, num_microbatches, loss_fn=loss_fn, scale_grads=False)
    losses: list[torch.Tensor] = []
    if stage == 0:
        runner.step(X)
    elif stage == num_stages - 1:
        runner.step(target=y, losses=losses)
    else:
        runner.step()
    mine = {id(p) for p in stages[stage].parameters()}
    gradients = {
        name: None if p.grad is None else p.grad.clone()
        for name, p in model.named_parameters()
        if id(p) in mine
    }
    return {"gradients": gradients, "loss": float(sum(loss.item() for loss in losses))}

"""One training loop for one process and for an FSDP2 rank: micro-batches with
gradients synced on the last only, optional clipping (14b).

A step is a list of micro-batches, each an (inputs, labels) pair; the loss of each
is its mean cross-entropy divided by the number of micro-batches, so the summed
gradient of a step is the gradient of the mean over all of them. On an FSDP2 model
:func:`train_steps` calls ``set_requires_gradient_sync(False)`` before every
micro-batch but the last (no reduce-scatter: each rank adds to its unsharded
gradients) and ``True`` before the last; ``clip_grad_norm_`` on FSDP2's DTensor
gradients returns the norm of the whole gradient as a DTensor.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from multigpu.zero import full_parameters

MicroBatch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class StepsResult:
    """What :func:`train_steps` saw: the loss of each micro-batch (this rank's),
    the gradient norm before clipping per step and its type, the full weights
    after (14b)."""

    losses: list[float] = field(default_factory=list)
    norms: list[float] = field(default_factory=list)
    norm_types: list[str] = field(default_factory=list)  # what clip_grad_norm_ gave
    parameters: dict[str, torch.Tensor] = field(default_factory=dict)


def rank_part(batch: MicroBatch, rank: int, world_size: int) -> MicroBatch:
    """This rank's slice of a global (inputs, labels) batch: chunk ``rank`` of
    ``tensor_split`` (14b)."""
    inputs, labels = batch
    return inputs.tensor_split(world_size)[rank], labels.tensor_split(world_size)[rank]


def train_steps(
    model: nn.Module,
    steps: Sequence[Sequence[MicroBatch]],
    optimizer: torch.optim.Optimizer,
    max_norm: float | None = None,
    on_micro_batch: Callable[[int, int], None] | None = None,
) -> StepsResult:
    """Train ``model`` in place, one optimizer step per entry of ``steps`` (14b).

    Gradients of an FSDP2 model are reduced on the last micro-batch of a step only.
    ``max_norm``: clip the whole gradient's norm first (``clip_grad_norm_``).
    ``on_micro_batch(step, micro)``: called before each micro-batch's forward.
    """
    result = StepsResult()
    sharded = hasattr(model, "set_requires_gradient_sync")
    for step, micro_batches in enumerate(steps):
        for micro, (inputs, labels) in enumerate(micro_batches):
            if sharded:  # reduce-scatter only after the last micro-batch
                model.set_requires_gradient_sync(micro == len(micro_batches) - 1)
            if on_micro_batch is not None:
                on_micro_batch(step, micro)
            loss = F.cross_entropy(model(inputs), labels) / len(micro_batches)
            loss.backward()
            result.losses.append(loss.item() * len(micro_batches))
        if max_norm is not None:
            trainable = [p for p in model.parameters() if p.grad is not None]
            norm = nn.utils.clip_grad_norm_(trainable, max_norm)
            result.norm_types.append(type(norm).__name__)  # DTensor under FSDP2
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
            result.norms.append(norm.item())
        optimizer.step()
        optimizer.zero_grad()
    result.parameters = full_parameters(model)
    return result


def train_one_process(
    model: nn.Module,
    steps: Sequence[Sequence[MicroBatch]],
    lr: float,
    max_norm: float | None = None,
    optimizer: str = "adam",
) -> StepsResult:
    """The reference: :func:`train_steps` on a copy of ``model`` in this process,
    with Adam (or ``optimizer="sgd"``) at ``lr`` (14b)."""
    model = copy.deepcopy(model)
    return train_steps(model, steps, make_optimizer(model, lr, optimizer), max_norm)


def make_optimizer(
    model: nn.Module, lr: float, optimizer: str = "adam"
) -> torch.optim.Optimizer:
    """Adam (PyTorch's defaults but ``lr``) or plain SGD over the trainable
    parameters of ``model`` (14b)."""
    if optimizer not in ("adam", "sgd"):
        raise ValueError(
            f"optimizer must be 'adam' or 'sgd', got {optimizer!r}. Pass one of them."
        )
    trainable = [p for p in model.parameters() if p.requires_grad]
    kind = torch.optim.Adam if optimizer == "adam" else torch.optim.SGD
    return kind(trainable, lr=lr)

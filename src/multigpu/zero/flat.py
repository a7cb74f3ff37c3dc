"""DDP, ZeRO-1 and ZeRO-2 by hand, on one flat buffer of the parameters (13).

All three keep the whole model on every rank, its parameters moved into one flat
buffer (:func:`flatten_parameters`). The buffer is cut into N chunks as
``tensor_split(N)`` cuts it, so the parameter count need not divide by N. Adam
updates ``shard``: the whole buffer (DDP, :func:`ddp_flat_step`) or this rank's
chunk of it (ZeRO-1, -2), a view into the buffer. ZeRO-1 (:func:`zero1_step`)
all-reduces the gradient like DDP and then uses only its chunk; ZeRO-2
(:func:`zero2_step`) reduce-scatters it, so a rank only ever receives its chunk.
Both then all-gather the updated chunks into every rank's buffer. The collectives
are the hand-written ones of :mod:`multigpu.collectives`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from multigpu.collectives import all_gather, reduce_scatter, ring_all_reduce

# A step of DDP, ZeRO-1 or ZeRO-2:
# step(model, flat, shard, optimizer, X, y) -> (this rank's mean loss, bytes sent)
ShardedStep = Callable[
    [nn.Module, torch.Tensor, nn.Parameter, torch.optim.Optimizer, torch.Tensor, Any],
    tuple[float, int],
]


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """``model``'s parameters that train, each once (a tied weight once), in
    ``model.parameters()`` order: what the flat buffer holds. A frozen parameter
    (``requires_grad=False``) stays where it is, outside the buffer and the optimizer,
    as FSDP2 leaves it (13)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError(
            f"{type(model).__name__} has no parameter that requires a gradient, so "
            "there is nothing to train. Unfreeze at least one parameter."
        )
    dtypes = sorted({str(p.dtype) for p in trainable})
    if len(dtypes) > 1:
        raise ValueError(
            f"{type(model).__name__} mixes parameter dtypes ({', '.join(dtypes)}); one "
            "flat buffer holds one dtype. Convert the model first, e.g. model.double()."
        )
    return trainable


def flatten_parameters(model: nn.Module) -> torch.Tensor:
    """Move ``model``'s trainable parameters into one flat buffer (P,) and return it:
    each becomes a view of its slice, so writing into the buffer changes the model.
    Frozen parameters are left out (:func:`trainable_parameters`) (13)."""
    parameters = trainable_parameters(model)
    flat = torch.cat([p.detach().reshape(-1) for p in parameters])
    offset = 0
    for p in parameters:
        p.data = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


def pop_flat_gradients(model: nn.Module) -> torch.Tensor:
    """Take this rank's gradients out of ``model``: one new flat tensor (P,), in the
    order of :func:`flatten_parameters`; the parameters' own ``.grad`` are dropped.
    A parameter that got no gradient (unused in forward) counts as zeros: with Adam
    and no weight decay its moments stay 0 and it does not move, exactly as in one
    process if it never gets one; one used in some steps only would differ, which
    :func:`watch_missing_gradients` refuses (13)."""
    flat = torch.cat(
        [
            p.grad.reshape(-1)
            if p.grad is not None
            else p.detach().new_zeros(p.numel())
            for p in trainable_parameters(model)
        ]
    )
    model.zero_grad(set_to_none=True)
    return flat


def watch_missing_gradients(model: nn.Module, stage: str) -> Callable[[int], None]:
    """A check to call after each step of a flat stage: it refuses, on every rank at
    once, a trainable parameter that got a gradient on some rank in some steps and
    on none in others (a layer the first forward skips, a branch some batches do
    not take). The flat buffer counts a missing gradient as zeros, which Adam turns
    into a move where one process leaves the parameter alone. One small all-reduce
    per step (not counted in the bytes sent) (13)."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    got = torch.zeros(len(named), dtype=torch.int32)  # 1: a gradient this step

    def mark(index: int) -> Callable[[torch.Tensor], None]:
        def hook(_: torch.Tensor) -> None:
            got[index] = 1

        return hook

    for index, (_, p) in enumerate(named):
        p.register_post_accumulate_grad_hook(mark(index))
    first: list[torch.Tensor] = []

    def check(step: int) -> None:
        seen = got.clone()
        got.zero_()
        dist.all_reduce(seen, op=dist.ReduceOp.MAX)  # did any rank get one?
        if not first:
            first.append(seen)
            return
        changed = [n for (n, _), a, b in zip(named, first[0], seen) if a != b]
        if changed:
            index = [n for n, _ in named].index(changed[0])
            was, now = ("one", "none") if first[0][index] else ("none", "one")
            it = "it" if len(changed) == 1 else "them"
            raise ValueError(
                f"{stage} by hand counts a missing gradient as zeros, but "
                f"{', '.join(changed)} got a gradient in some steps and none in "
                f"others ({was} in step 1, {now} in step {step}), so Adam would move "
                f"{it} where one process leaves {it}. Make every trainable parameter "
                "take part in every step's loss (or in none), or train with "
                "PyTorch's DDP (find_unused_parameters=True)."
            )

    return check


def shard_of(flat: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s chunk of ``flat``: a view, cut as ``tensor_split`` cuts (13)."""
    return flat.tensor_split(world_size)[rank]


def ddp_flat_step(model, flat, shard, optimizer, X, y) -> tuple[float, int]:
    """DDP by hand with Adam: all-reduce the gradient, every rank updates every
    parameter. ``shard`` is all of ``flat``; returns (loss, bytes sent) (13)."""
    loss = F.cross_entropy(model(X), y)  # mean over this rank's batch
    loss.backward()
    gradients = pop_flat_gradients(model)  # (P,)
    sent = ring_all_reduce(gradients)  # every rank: the sum over the ranks
    shard.grad = gradients / dist.get_world_size()  # the mean gradient, (P,)
    optimizer.step()  # Adam on all P parameters: 2P numbers of state
    return loss.item(), sent


def zero1_step(model, flat, shard, optimizer, X, y) -> tuple[float, int]:
    """ZeRO-1: all-reduce the gradient as DDP does, update only this rank's chunk
    (its moments are the only ones it keeps), all-gather the chunks (13)."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    gradients = pop_flat_gradients(model)  # (P,)
    sent = ring_all_reduce(gradients)  # every rank receives the whole sum
    gradients /= world_size
    shard.grad = shard_of(gradients, rank, world_size)  # a view: all P stay alive
    optimizer.step()  # Adam on this rank's chunk: 2P/N numbers of state
    sent += all_gather(flat, shard.detach())  # everyone's updated chunk, (P,)
    return loss.item(), sent


def zero2_step(model, flat, shard, optimizer, X, y) -> tuple[float, int]:
    """ZeRO-2: reduce-scatter the gradient, so each rank receives (and keeps) only
    its chunk of the sum; update the chunk; all-gather the chunks (13)."""
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    gradients = pop_flat_gradients(model)  # (P,), dropped when this function returns
    shard.grad = torch.empty_like(shard)  # (P/N,)
    sent = reduce_scatter(shard.grad, gradients)  # my chunk of the sum
    shard.grad /= dist.get_world_size()
    optimizer.step()
    sent += all_gather(flat, shard.detach())
    return loss.item(), sent


STEPS: dict[str, ShardedStep] = {
    "DDP": ddp_flat_step,
    "ZeRO-1": zero1_step,
    "ZeRO-2": zero2_step,
}

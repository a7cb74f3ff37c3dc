"""ZeRO-3 by hand: a Linear layer that keeps only its chunk (13).

:class:`ShardedLinear` keeps only this rank's chunk of its layer's parameters. The
layer all-gathers its full weight just before its forward, frees it right after,
all-gathers it again in backward and reduce-scatters the gradient: a
``torch.autograd.Function`` (:class:`AllGatherLinear`) makes each of these steps one
visible line. This is what FSDP does with hooks. :class:`Meter` counts what a rank
sends and the gathered layers it holds.

Every rank must move the same layer at the same moment: a layer that only some
ranks' batches run would pair one rank's all-gather with another layer's on the
next rank, and the ring would mix their weights without a word. So before each
all-gather and reduce-scatter the ranks compare which layer and moment they are at
(:func:`agree`, a few bytes, not counted by the meter) and refuse together,
naming the layer, where they differ.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from multigpu.collectives import all_gather, reduce_scatter
from multigpu.zero.flat import shard_of


class Meter:
    """What one rank counts while it trains: bytes sent, and the bytes of gathered
    parameters alive now and at most (13)."""

    def __init__(self) -> None:
        self.bytes_sent = 0
        self.gathered_bytes = 0
        self.peak_gathered_bytes = 0

    def gathered(self, tensor: torch.Tensor) -> None:
        self.gathered_bytes += tensor.numel() * tensor.element_size()
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes)

    def freed(self, tensor: torch.Tensor) -> None:
        self.gathered_bytes -= tensor.numel() * tensor.element_size()


class ShardedLinear(nn.Module):
    """An ``nn.Linear`` whose weight and bias (if any), flattened into one buffer of
    out·in (+ out) numbers, are cut over the ranks: this rank keeps only its chunk,
    the parameter ``shard`` (13). A frozen layer's shard stays frozen: it is
    gathered for forward and backward, but gets no gradient and no optimizer state."""

    def __init__(self, linear: nn.Linear, meter: Meter) -> None:
        super().__init__()
        world_size, rank = dist.get_world_size(), dist.get_rank()
        parts = [p for p in (linear.weight, linear.bias) if p is not None]
        full = torch.cat([p.detach().reshape(-1) for p in parts])
        self.weight_shape = linear.weight.shape  # (out, in)
        self.has_bias = linear.bias is not None
        self.numel = full.numel()
        self.shard = nn.Parameter(
            shard_of(full, rank, world_size).clone(),
            requires_grad=linear.weight.requires_grad,
        )
        self.meter = meter
        # its number and name among the model's layers, and theirs (shard_model)
        self.index, self.name, self.names = 0, "the model", ["the model"]

    def gather(
        self, moment: str = "forward"
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """All-gather the full buffer for ``moment`` (a key of :data:`MOMENTS`): (it,
        the weight (out, in), the bias (out,) or None)."""
        agree(self, moment)
        full = torch.empty(self.numel, dtype=self.shard.dtype)
        self.meter.bytes_sent += all_gather(full, self.shard.detach())
        self.meter.gathered(full)
        weight = full[: self.weight_shape.numel()].view(self.weight_shape)
        bias = full[self.weight_shape.numel() :] if self.has_bias else None
        return full, weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return AllGatherLinear.apply(x, self.shard, self)  # (B, in) -> (B, out)


class AllGatherLinear(torch.autograd.Function):
    """ZeRO-3's forward and backward of one layer: gather, compute, free; the
    gradient leaves reduce-scattered, as this rank's chunk only (13)."""

    @staticmethod
    def forward(ctx, x, shard, layer):
        full, weight, bias = layer.gather()  # all-gather just before use
        out = F.linear(x, weight, bias)  # (B, out)
        layer.meter.freed(full)  # freed right after: only x is kept for backward
        ctx.save_for_backward(x)
        ctx.layer = layer
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        layer = ctx.layer
        full, weight, bias = layer.gather("backward")  # again, for grad_x
        grad_x = grad_out @ weight  # (B, in)
        layer.meter.freed(full)
        if not ctx.needs_input_grad[1]:  # a frozen layer: no gradient to send
            return grad_x, None, None
        grad_full = (grad_out.T @ x).reshape(-1)  # the weight's, (out·in,)
        if bias is not None:
            grad_full = torch.cat([grad_full, grad_out.sum(0)])  # and the bias's
        grad_shard = torch.empty_like(layer.shard)
        agree(layer, "gradient")
        layer.meter.bytes_sent += reduce_scatter(grad_shard, grad_full)  # my chunk
        grad_shard /= dist.get_world_size()  # the mean over the ranks
        return grad_x, grad_shard, None


MOMENTS = ("forward", "backward", "gradient", "state dict")


def agree(layer: ShardedLinear, moment: str) -> None:
    """Check that every rank is about to move ``layer``'s weights for ``moment``
    (one of :data:`MOMENTS`); raise the same ValueError on every rank, naming where
    each rank is, if not (13)."""
    names, instead = layer.names, "DDP, ZeRO-1 or ZeRO-2"
    agree_on(layer.index, moment, names, MOMENTS, "ZeRO-3 by hand", "layer", instead)


def agree_on(
    index: int,
    moment: str,
    names: Sequence[str],
    moments: Sequence[str],
    who: str,
    part: str,
    instead: str,
) -> None:
    """Every rank says where it is: the ``part`` (layer, unit) ``names[index]`` at
    ``moment`` (one of ``moments``, e.g. "head's forward"); all-gather that (one
    integer per rank) and, where the ranks differ, raise the same one-line
    ValueError on every rank, naming each rank's place and the wrappers to use
    ``instead`` (13, 14)."""
    mine = torch.tensor([index * len(moments) + moments.index(moment)])
    codes = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(codes, mine)
    if len({int(c) for c in codes}) == 1:
        return
    where = ", ".join(
        f"rank {r}: {names[int(c) // len(moments)]}'s {moments[int(c) % len(moments)]}"
        for r, c in enumerate(codes)
    )
    raise ValueError(
        f"{who}: the ranks are at different {part}s ({where}): a {part} that some "
        f"ranks' batches run and others' skip cannot be sharded, since its "
        f"all-gathers would meet another {part}'s on the ranks that skip it. Run the "
        f"{part} on every batch (masking its output), or train with {instead}."
    )


def shard_model(model: nn.Module, meter: Meter) -> nn.Module:
    """A copy of ``model`` with every ``nn.Linear`` replaced by a
    :class:`ShardedLinear` holding this rank's chunk (13). Buffers and parameter-free
    modules stay as they are. Refused, before anything is sent: a parameter outside
    an ``nn.Linear``, a weight tied between two layers, a layer half frozen. A layer
    unused in forward is supported only if no rank uses it; one that some ranks'
    batches run and others' skip is refused in the step where they differ, on every
    rank (:func:`agree`)."""
    check_shardable(model)
    model = copy.deepcopy(model)
    if isinstance(model, nn.Linear):
        return ShardedLinear(model, meter)
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    names = [name for name, _ in linears]
    for index, (name, layer) in enumerate(linears):
        sharded = ShardedLinear(layer, meter)
        sharded.index, sharded.name, sharded.names = index, name, names
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, sharded)
    return model


def check_shardable(model: nn.Module) -> None:
    """Raise ValueError, naming the case, if :func:`shard_model` cannot shard
    ``model`` (13)."""
    names: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    for tied in names.values():
        if len(tied) > 1:
            raise ValueError(
                "ZeRO-3 by hand cannot shard a weight tied between two layers "
                f"({' is '.join(tied)}): each ShardedLinear keeps its own chunk. "
                "Untie them, or train with DDP, ZeRO-1 or ZeRO-2, which keep tied "
                "weights tied."
            )
    for name, layer in model.named_modules():
        own = [p for p in layer.parameters(recurse=False)]
        if own and not isinstance(layer, nn.Linear):
            raise ValueError(
                f"Layer {name or 'the model'} ({type(layer).__name__}) has parameters "
                "that ZeRO-3 by hand cannot shard: it shards nn.Linear layers only. "
                "Build the model from nn.Linear layers, activations and buffers, e.g. "
                "with make_mlp(), or train it with DDP, ZeRO-1 or ZeRO-2."
            )
        if len({p.requires_grad for p in own}) > 1:
            raise ValueError(
                f"Layer {name or 'the model'} (Linear) is half frozen (its weight and "
                "bias differ in requires_grad): ZeRO-3 by hand freezes or trains a "
                "whole layer. Freeze both or neither, e.g. layer.requires_grad_(False)."
            )


def gathered_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full weights (and buffers) of a ZeRO-3 model under the original model's
    names, gathered on every rank (a collective) (13)."""
    state = {}
    for name, tensor in model.state_dict().items():
        prefix, _, _ = name.rpartition(".")
        layer = model.get_submodule(prefix)
        if not isinstance(layer, ShardedLinear):
            state[name] = tensor.detach().clone()  # a buffer: the same on every rank
            continue
        full, weight, bias = layer.gather("state dict")
        layer.meter.freed(full)
        key = f"{prefix}." if prefix else ""
        state[f"{key}weight"] = weight
        if bias is not None:
            state[f"{key}bias"] = bias
    return state

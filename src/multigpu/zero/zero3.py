"""ZeRO-3 by hand: a Linear layer that keeps only its chunk (13).

:class:`ShardedLinear` keeps only this rank's chunk of its layer's parameters. The
layer all-gathers its full weight just before its forward, frees it right after,
all-gathers it again in backward and reduce-scatters the gradient: a
``torch.autograd.Function`` (:class:`AllGatherLinear`) makes each of these steps one
visible line. This is what FSDP does with hooks. :class:`Meter` counts what a rank
sends and the gathered layers it holds.
"""

from __future__ import annotations

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
    """An ``nn.Linear`` whose weight and bias, flattened into one buffer of
    out·in + out numbers, are cut over the ranks: this rank keeps only its chunk,
    the parameter ``shard`` (13)."""

    def __init__(self, linear: nn.Linear, meter: Meter) -> None:
        super().__init__()
        world_size, rank = dist.get_world_size(), dist.get_rank()
        full = torch.cat([linear.weight.detach().reshape(-1), linear.bias.detach()])
        self.weight_shape = linear.weight.shape  # (out, in)
        self.numel = full.numel()
        self.shard = nn.Parameter(shard_of(full, rank, world_size).clone())
        self.meter = meter

    def gather(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """All-gather the full buffer: (it, the weight (out, in), the bias (out,))."""
        full = torch.empty(self.numel, dtype=self.shard.dtype)
        self.meter.bytes_sent += all_gather(full, self.shard.detach())
        self.meter.gathered(full)
        weight = full[: self.weight_shape.numel()].view(self.weight_shape)
        return full, weight, full[self.weight_shape.numel() :]

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
        full, weight, _ = layer.gather()  # all-gather again, for grad_x
        grad_x = grad_out @ weight  # (B, in)
        layer.meter.freed(full)
        grad_full = torch.cat([(grad_out.T @ x).reshape(-1), grad_out.sum(0)])
        grad_shard = torch.empty_like(layer.shard)
        layer.meter.bytes_sent += reduce_scatter(grad_shard, grad_full)  # my chunk
        grad_shard /= dist.get_world_size()  # the mean over the ranks
        return grad_x, grad_shard, None


def shard_model(model: nn.Sequential, meter: Meter) -> nn.Sequential:
    """A copy of ``model`` with every ``nn.Linear`` replaced by a
    :class:`ShardedLinear` holding this rank's chunk (13)."""
    for index, layer in enumerate(model):  # check everything before sharding
        shardable = isinstance(layer, nn.Linear) and layer.bias is not None
        if not shardable and next(layer.parameters(), None) is not None:
            raise ValueError(
                f"Layer {index} ({type(layer).__name__}) has parameters that ZeRO-3 "
                "by hand cannot shard: it shards nn.Linear layers with a bias only. "
                "Build the model from nn.Linear layers and activations, e.g. with "
                "make_mlp()."
            )
    return nn.Sequential(
        *(
            ShardedLinear(layer, meter) if isinstance(layer, nn.Linear) else layer
            for layer in model
        )
    )


def gathered_state_dict(model: nn.Sequential) -> dict[str, torch.Tensor]:
    """The full weights of a ZeRO-3 model under the original model's names, gathered
    on every rank (a collective) (13)."""
    state = {}
    for index, layer in enumerate(model):
        if isinstance(layer, ShardedLinear):
            full, weight, bias = layer.gather()
            layer.meter.freed(full)
            state[f"{index}.weight"], state[f"{index}.bias"] = weight, bias
    return state

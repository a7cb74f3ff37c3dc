"""Synchronized BatchNorm written with one all-reduce, for CPUs and gloo (09b).

``torch.nn.SyncBatchNorm`` normalises each channel with the mean and variance of the
*global* batch, summed over all ranks, but its kernels are GPU-only: on CPU tensors
it raises "SyncBatchNorm expected input tensor to be on GPU ...". This module is the
same idea in a few lines that run anywhere. Per channel each rank computes its count
n_r, its mean m_r and the sum of squared deviations from that mean, M2_r; the ranks
exchange the three (an all-gather, written as one all-reduce); then, with
N = Σ n_r,

    mean = Σ n_r m_r / N,    var = Σ (M2_r + n_r (m_r - mean)²) / N   (biased)

(Chan et al.'s combination, what PyTorch's ``batch_norm_gather_stats_with_counts``
does). The shorter ``E[x²] - mean²`` is the same in exact arithmetic but cancels in
float32 when the mean is large next to the spread (inputs 1e4 + N(0, 1) give
negative variances). Normalise with them, and keep the running statistics as
BatchNorm does (with the unbiased variance). The all-reduce is differentiable (its
backward all-reduces the gradient), so each rank's backward also gets the other
ranks' share of the gradient through the statistics, as in PyTorch's
https://github.com/pytorch/pytorch/blob/main/torch/nn/modules/_functions.py.
With it, N ranks train exactly like one process with plain BatchNorm on the global
batch, whatever each rank's batch size (0 included). Taught in
``notebooks/09b_ddp_in_practice.ipynb``.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn


class SumOverRanks(torch.autograd.Function):
    """``all_reduce(SUM)`` as an autograd function: forward sums the tensor over the
    ranks, backward sums the incoming gradient over the ranks (09b)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:
        total = tensor.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        total = grad.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total


def combine_statistics(
    count: torch.Tensor, mean: torch.Tensor, m2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(N, mean, biased var)`` per channel of the global batch, from this rank's
    ``count`` (1,), ``mean`` (C,) and sum of squared deviations ``m2`` (C,) (09b).

    Every rank writes its three into its own row of a table of zeros; summing the
    table over the ranks (:class:`SumOverRanks`) gives every rank every row, an
    all-gather that autograd can go back through. The rows are combined with their
    counts (a rank with count 0 adds nothing), never as ``E[x²] - mean²``.
    """
    table = count.new_zeros(dist.get_world_size(), 1 + 2 * mean.numel())
    table[dist.get_rank()] = torch.cat([count, mean, m2])
    rows = SumOverRanks.apply(table)  # (ranks, 1 + 2C): every rank's statistics
    counts, means, m2s = (
        rows[:, :1],
        rows[:, 1 : 1 + mean.numel()],
        rows[:, 1 + mean.numel() :],
    )
    n = counts.sum()
    global_mean = (counts * means).sum(0) / n
    deviations = m2s + counts * (means - global_mean) ** 2  # M2_r about the global mean
    return n, global_mean, deviations.sum(0) / n


class ReferenceSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm over the global batch of all ranks, for any input (B, C, ...) (09b).

    In eval mode, or without a process group of more than one rank, it is plain
    BatchNorm. Same parameters, buffers and state_dict keys as ``nn.BatchNorm2d``.
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(
                f"expected at least 2D input (batch, channels, ...), got "
                f"{input.dim()}D. Pass a batch of shape (B, C) or (B, C, H, W)."
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        distributed = dist.is_initialized() and dist.get_world_size() > 1
        if not (self.training and distributed):
            return super().forward(x)
        channels = x.shape[1]
        dims = [0, *range(2, x.dim())]  # every dimension but the channels
        shape = (1, channels) + (1,) * (x.dim() - 2)
        count = x.numel() // channels  # this rank's values per channel, maybe 0
        local_mean = x.sum(dims) / max(count, 1)  # (C,)
        m2 = ((x - local_mean.view(shape)) ** 2).sum(dims)  # squared deviations
        n, mean, var = combine_statistics(x.new_tensor([count]), local_mean, m2)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                momentum = (
                    1.0 / self.num_batches_tracked.item()
                    if self.momentum is None
                    else self.momentum
                )
                unbiased = var * n / (n - 1)
                self.running_mean.lerp_(mean.to(self.running_mean.dtype), momentum)
                self.running_var.lerp_(unbiased.to(self.running_var.dtype), momentum)
        out = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out


def convert_sync_batchnorm(module: nn.Module) -> nn.Module:
    """A copy of ``module`` with every BatchNorm replaced by a
    :class:`ReferenceSyncBatchNorm` holding the same weights and statistics, like
    ``nn.SyncBatchNorm.convert_sync_batchnorm`` (09b)."""
    module = copy.deepcopy(module)
    return _convert(module)


def _convert(module: nn.Module) -> nn.Module:
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(
        module, ReferenceSyncBatchNorm
    ):
        synced = ReferenceSyncBatchNorm(
            module.num_features,
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
        )
        state = module.state_dict()
        floats = [t for t in state.values() if t.is_floating_point()]
        if floats:
            synced.to(floats[0])  # the same device and dtype as the original
        synced.load_state_dict(state)
        synced.train(module.training)
        return synced
    for name, child in module.named_children():
        module.add_module(name, _convert(child))
    return module

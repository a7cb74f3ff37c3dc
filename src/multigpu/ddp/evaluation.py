"""Evaluation over the ranks: every sample once, and the padded sampler's bias (09)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data.distributed import DistributedSampler

from multigpu.core.checks import check_choice
from multigpu.core.train import evaluation_sums
from multigpu.ddp.loader import exact_shard
from multigpu.runtime.checkpoint import unwrap
from multigpu.runtime.rank import reduce_value


def _sums(
    model: nn.Module, X: torch.Tensor, y: torch.Tensor, batch_size: int
) -> torch.Tensor:
    """[sum of losses, correct, count] of ``model`` on X, y as a float64 tensor,
    from :func:`multigpu.core.train.evaluation_sums` over batches of ``batch_size``."""
    module = unwrap(model)  # no DDP forward: it may sync buffers, a collective
    batches = (
        (X[start : start + batch_size], y[start : start + batch_size])
        for start in range(0, len(y), batch_size)
    )
    return torch.tensor(evaluation_sums(module, batches), dtype=torch.float64)


def evaluate_distributed(
    model: nn.Module, X: torch.Tensor, y: torch.Tensor, batch_size: int = 512
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy over all of X (N, ...), y (N,), each rank
    evaluating its :func:`exact_shard`; every sample counts exactly once (09).

    The ranks all-reduce three sums (loss, correct, count), so every rank returns
    the numbers one process would compute with :func:`multigpu.core.train.evaluate`: the
    same accuracy exactly, the loss up to the order of float additions.
    """
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    shard = exact_shard(len(y), rank, world_size)
    sums = reduce_value(_sums(model, X[shard], y[shard], batch_size), average=False)
    return sums[0].item() / sums[2].item(), sums[1].item() / sums[2].item()


def evaluate_padded(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    divide_by: str = "dataset",
    batch_size: int = 512,
) -> tuple[float, float]:
    """The common, biased mean cross-entropy and accuracy: each rank sums its losses
    and counts its correct predictions over a ``DistributedSampler`` (which pads
    with repeated samples), the sums are summed over the ranks, and each is divided
    by ``len(dataset)`` or by the sampler's ``total_size``. Returns (loss, accuracy),
    as :func:`evaluate_distributed` does. Shown in notebook 09 to be wrong; use
    :func:`evaluate_distributed` (09)."""
    check_choice("divide_by", divide_by, ("dataset", "total_size"))
    sampler = DistributedSampler(
        range(len(y)),
        num_replicas=dist.get_world_size(),
        rank=dist.get_rank(),
        shuffle=False,
    )
    shard = torch.tensor(list(sampler), dtype=torch.long)
    sums = reduce_value(_sums(model, X[shard], y[shard], batch_size), average=False)
    denominator = len(y) if divide_by == "dataset" else sampler.total_size
    return sums[0].item() / denominator, sums[1].item() / denominator

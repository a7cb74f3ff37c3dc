"""The data: a ``DistributedSampler`` deals a seeded shuffle to the ranks (09)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from multigpu.core.batches import per_rank_batch_size


def distributed_loader(
    dataset: Any,
    global_batch: int,
    rank: int,
    world_size: int,
    seed: int = 0,
    shuffle: bool = True,
    drop_last: bool = True,
    padded_sampler: bool = False,
) -> DataLoader:
    """This rank's loader: a ``DistributedSampler`` and ``global_batch / world_size``
    samples per batch (09).

    The sampler shuffles (with ``seed + epoch``: call ``loader.sampler.set_epoch``
    every epoch) and deals every ``world_size``-th index to this rank, so the loader
    itself gets ``shuffle=False``. The sampler gets ``drop_last=True``: it drops the
    epoch's last ``N % world_size`` indices instead of padding with repeats, and
    the loader's ``drop_last=True`` drops each rank's last partial batch. So every
    step is a full global batch of distinct samples, an epoch has one process's
    ``N // global_batch`` steps, and the batches are 08's. ``padded_sampler=True``
    keeps the sampler's default padding (``ceil(N / world_size)`` indices per rank),
    which can add a step of repeated samples per epoch: shown in 09, not exact.
    """
    per_rank = per_rank_batch_size(global_batch, world_size)
    sampler = DistributedSampler(
        dataset,
        num_replicas=world_size,
        rank=rank,
        shuffle=shuffle,
        seed=seed,
        drop_last=not padded_sampler,
    )
    return DataLoader(
        dataset,
        batch_size=per_rank,
        sampler=sampler,
        shuffle=False,
        drop_last=drop_last,
    )


def sampler_shards(
    num_samples: int,
    world_size: int,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
    drop_last: bool = False,
) -> list[list[int]]:
    """The indices ``DistributedSampler`` gives each rank, by rank; no process group
    needed. N=10 on 4 ranks: ``[0,4,8] [1,5,9] [2,6,0] [3,7,1]`` (09)."""
    shards = []
    for rank in range(world_size):
        sampler = DistributedSampler(
            range(num_samples),
            num_replicas=world_size,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
        )
        sampler.set_epoch(epoch)
        shards.append(list(sampler))
    return shards


def exact_shard(num_samples: int, rank: int, world_size: int) -> torch.Tensor:
    """Indices ``rank, rank + W, ...`` below ``num_samples``: the sampler's stride
    without its padding, so every sample belongs to exactly one rank (09)."""
    return torch.arange(rank, num_samples, world_size)

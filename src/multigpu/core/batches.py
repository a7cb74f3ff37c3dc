"""Which samples each rank takes at each step: shards of one seeded epoch order (08).

Epoch ``e`` uses one permutation of the N sample indices (seeded with ``seed + e``,
as ``DistributedSampler`` does) and rank ``r`` owns ``order[r::world_size]``, so the
ranks' k-th batches together are the single process's k-th global batch. Every
training loop of 08, 10, 12 and 13 follows :func:`run_batches`.
"""

from __future__ import annotations

import torch

from multigpu.core.checks import check_positive_int
from multigpu.core.data import epoch_order
from multigpu.core.train import TrainConfig


def per_rank_batch_size(global_batch: int, world_size: int) -> int:
    """Samples per rank per step: ``global_batch // world_size``, only if exact (08)."""
    check_positive_int("global_batch", global_batch)
    check_positive_int("world_size", world_size)
    if global_batch % world_size != 0:
        lower = global_batch - global_batch % world_size
        higher = lower + world_size
        nearest = f"{higher}" if lower == 0 else f"{lower} or {higher}"
        raise ValueError(
            f"A global batch of {global_batch} does not split evenly over "
            f"{world_size} ranks ({global_batch} / {world_size} = "
            f"{global_batch / world_size:.4g} samples each). Choose a global batch "
            f"that is a multiple of the world size, e.g. {nearest}."
        )
    return global_batch // world_size


class DataPartitioner:
    """Deals a seeded shuffle of indices 0..N-1 to ranks: rank r owns order[r::R] (08).

    Unlike the old tutorial's partitioner (contiguous fractions of one shuffle), the
    shards interleave, so the ranks' k-th batches together form the single-process
    run's k-th global batch. Shard sizes differ by at most one sample: unlike
    ``DistributedSampler(drop_last=False)``, nothing is padded or seen twice.
    """

    def __init__(self, num_samples: int, world_size: int, seed: int = 0) -> None:
        check_positive_int("num_samples", num_samples)
        check_positive_int("world_size", world_size)
        self.num_samples = num_samples
        self.world_size = world_size
        self.seed = seed

    def order(self, epoch: int = 0) -> torch.Tensor:
        """The epoch's permutation of all indices, (num_samples,) int64."""
        return epoch_order(self.num_samples, self.seed, epoch)

    def shard(self, rank: int, epoch: int = 0) -> torch.Tensor:
        """The indices rank ``rank`` owns this epoch, (about num_samples / R,) int64."""
        if not 0 <= rank < self.world_size:
            raise ValueError(
                f"rank {rank} is outside this world of {self.world_size} ranks. "
                f"Pass a rank from 0 to {self.world_size - 1}."
            )
        return self.order(epoch)[rank :: self.world_size]

    def shards(self, epoch: int = 0) -> list[torch.Tensor]:
        """Every rank's shard, in rank order."""
        return [self.shard(rank, epoch) for rank in range(self.world_size)]


def batch_indices(
    num_samples: int,
    global_batch: int,
    steps: int,
    world_size: int = 1,
    rank: int = 0,
    seed: int = 0,
) -> list[torch.Tensor]:
    """Rank ``rank``'s sample indices for each step: ``steps`` tensors of (G/R,) (08).

    With ``world_size=1`` these are the single process's global batches.
    """
    per_rank = per_rank_batch_size(global_batch, world_size)
    steps_per_epoch = num_samples // global_batch
    if steps_per_epoch == 0:
        raise ValueError(
            f"The global batch of {global_batch} is larger than the {num_samples} "
            "samples, so not even one full batch fits. Use a global batch of at most "
            f"{num_samples}."
        )
    partitioner = DataPartitioner(num_samples, world_size, seed)
    batches: list[torch.Tensor] = []
    for step in range(steps):
        epoch, k = divmod(step, steps_per_epoch)
        if k == 0:
            shard = partitioner.shard(rank, epoch)
        batches.append(shard[k * per_rank : (k + 1) * per_rank])
    return batches


def run_batches(
    num_samples: int, config: TrainConfig, world_size: int = 1, rank: int = 0
) -> tuple[list[torch.Tensor], int]:
    """This rank's indices for every step of ``config.epochs`` epochs of full global
    batches of ``config.batch_size`` (:func:`batch_indices`), and the number of
    steps per epoch: the schedule every training loop of 08, 10 and 12 follows."""
    steps_per_epoch = num_samples // config.batch_size  # full global batches
    steps = config.epochs * steps_per_epoch
    batches = batch_indices(
        num_samples, config.batch_size, steps, world_size, rank, config.seed
    )
    return batches, steps_per_epoch


def epoch_means(step_loss: list[float], steps_per_epoch: int) -> list[float]:
    """The mean step loss of each epoch; every step's batch has the same size, so
    a plain mean is the epoch's mean loss (08, 10, 12)."""
    return [
        sum(step_loss[first : first + steps_per_epoch]) / steps_per_epoch
        for first in range(0, len(step_loss), steps_per_epoch)
    ]

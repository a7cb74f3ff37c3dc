"""Where a run stands (:class:`Position`) and a sampler that can start part-way
through an epoch (:class:`ResumableSampler`) (11)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch.utils.data.distributed import DistributedSampler


@dataclass(frozen=True)
class Position:
    """Where a run stands: the next step is step ``step`` of epoch ``epoch`` (11)."""

    epoch: int = 0  # 0-based epoch the next step belongs to
    step: int = 0  # optimizer steps already done in that epoch
    global_step: int = 0  # optimizer steps done in all epochs


class ResumableSampler(DistributedSampler):
    """A ``DistributedSampler`` that can start part-way through an epoch (11).

    ``set_epoch(epoch, start)`` gives this epoch's shuffle (seeded by
    ``seed + epoch`` as usual) without its first ``start`` indices: the ones this
    rank has already trained on. Every rank takes the same number of samples per
    step, so ``start`` is ``step × per-rank batch`` on every rank.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start = 0  # indices of this epoch already used by this rank

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Shuffle for ``epoch`` and skip the first ``start`` indices of this rank."""
        if not 0 <= start <= self.num_samples:
            raise ValueError(
                f"start={start} is outside this rank's {self.num_samples} indices "
                "per epoch. Pass the samples already used this epoch, from 0 to "
                f"{self.num_samples}."
            )
        super().set_epoch(epoch)
        self.start = start

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(super().__iter__(), self.start, None)

    def __len__(self) -> int:
        return self.num_samples - self.start

    def state_dict(self) -> dict[str, int]:
        """What a snapshot needs to rebuild this sampler's order (plain ints)."""
        return {
            "seed": self.seed,
            "num_replicas": self.num_replicas,
            "epoch": self.epoch,
            "start": self.start,
        }

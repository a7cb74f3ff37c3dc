"""The function the ranks of notebook 12 run: all-reduce and DDP step times, the
measurements the cost model is fitted to and checked against (12, bench/scaling.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from multigpu.ranks.collectives import time_all_reduces_rank


def scaling_measurements_rank(
    rank: int,
    world_size: int,
    sizes_bytes: Sequence[int],
    model: torch.nn.Module,
    input_shape: tuple[int, ...],
    per_rank_batch: int = 32,
    steps: int = 20,
    repeats: int = 5,
) -> dict:
    """What notebook 12's cost model is fitted to and checked against, measured in
    one launch: ``dist.all_reduce`` times at ``sizes_bytes`` (none on one rank), then
    the fastest step time of ``model`` under DDP with its all-reduce ("synced") and
    without it ("no_sync") (12)."""
    # here: importing ddp slows every rank's start by ~2 s
    from multigpu.ranks.ddp import step_times_rank

    rows = []
    if world_size > 1:
        rows = time_all_reduces_rank(
            rank, world_size, sizes_bytes, repeats, names=("dist.all_reduce",)
        )
    step = step_times_rank(rank, world_size, per_rank_batch, steps, model, input_shape)
    return {"all_reduce": rows, "step": step}

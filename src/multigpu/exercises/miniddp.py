"""The checker of notebook 10's exercise, where the learner writes a bucketed DDP
(10)."""

from __future__ import annotations

import torch
from torch import nn

from multigpu.allreduce_sgd import train_single_process
from multigpu.core.compare import max_parameter_difference
from multigpu.core.train import TrainConfig
from multigpu.miniddp import BucketedDDP
from multigpu.ranks.miniddp import probe_rank
from multigpu.runtime.launch import spawn


def check_wrapper(
    wrapper: type,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    world_size: int = 2,
) -> tuple[bool, str]:
    """Does ``wrapper``, a subclass of :class:`~multigpu.miniddp.BucketedDDP` with its
    own ``gradient_ready`` and ``synchronize``, train like one process on the global
    batch, and start each bucket's all-reduce during backward? (passed, what to
    fix) (10). ``wrapper`` must live in a module the ranks can import (a
    ``%%module`` cell)."""
    if not (isinstance(wrapper, type) and issubclass(wrapper, BucketedDDP)):
        raise TypeError(
            f"check_wrapper needs a subclass of BucketedDDP, got {wrapper!r}. Write "
            "`class MyDDP(BucketedDDP):` in a %%module cell and import it."
        )
    if wrapper.__module__ in ("__main__", "__mp_main__"):
        raise TypeError(
            f"{wrapper.__name__} is defined in the notebook, so the ranks cannot "
            "import it. Write it in a %%module cell and import it from there."
        )
    reference = train_single_process(model, X, y, config)
    results = spawn(probe_rank, world_size, wrapper, model, X, y, config, timeout=60.0)
    first = results[0]
    if any(
        max_parameter_difference(r["run"].parameters, first["run"].parameters) > 0
        for r in results[1:]
    ):
        return False, (
            f"FAIL: the {world_size} ranks ended with different weights: their "
            "gradients were not averaged. In gradient_ready, copy each gradient into "
            "its bucket; once the bucket is full, all-reduce it; in synchronize, "
            "copy the buckets back into .grad."
        )
    distance = max_parameter_difference(first["run"].parameters, reference.parameters)
    if distance > 1e-9:
        return False, (
            f"FAIL: the ranks agree, but end {distance:.1e} away from one process on "
            "the global batch: divide by the world size exactly once (the "
            "all-reduce sums)."
        )
    started = first["started"]
    if first["buckets"] > 1 and (len(started) < 2 or started[-2] == 0):
        return False, (
            "FAIL: the weights are right, but no all-reduce had started before "
            "backward computed its last gradient, so nothing overlapped. Start a "
            "bucket's all-reduce in gradient_ready as soon as its last gradient is "
            "in, with async_op=True, and keep the Work in bucket.work."
        )
    return True, (
        f"PASS: {wrapper.__name__} trains like one process on the global batch on "
        f"{world_size} ranks, and sent {started[-2]} of {first['buckets']} buckets "
        "before backward ended."
    )

"""The ladder's steps by name, and a model wrapped by one of them (10)."""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from multigpu.core.checks import check_choice
from multigpu.miniddp.buckets import BucketedDDP
from multigpu.miniddp.wrappers import AfterBackwardDDP, FlatDDP

# The three steps of the ladder, and PyTorch's DDP for comparison.
STRATEGIES = ("after_backward", "flat", "bucketed", "torch")


def make_ddp(
    model: nn.Module, strategy: str | type = "bucketed", **options: Any
) -> nn.Module:
    """``model`` wrapped by one step of the ladder, or by PyTorch's DDP
    (``strategy="torch"``), or by a wrapper class of your own; ``options`` go to
    the wrapper (10)."""
    if isinstance(strategy, type):
        return strategy(model, **options)
    check_choice("strategy", strategy, STRATEGIES)
    if strategy == "torch":
        return DDP(model, **options)
    if strategy == "bucketed":
        return BucketedDDP(model, **options)
    if "bucket_cap_mb" in options or "first_bucket_mb" in options:
        raise ValueError(
            f"The {strategy!r} strategy has no buckets, so bucket sizes mean nothing "
            "to it. Leave out bucket_cap_mb, or use strategy='bucketed'."
        )
    return {"after_backward": AfterBackwardDDP, "flat": FlatDDP}[strategy](
        model, **options
    )

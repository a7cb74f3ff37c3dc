"""The ranks of notebook 10 (and of ``bench/ddp_ladder.py`` and
:func:`multigpu.exercises.miniddp.check_wrapper`): training, unused parameters,
bucket layouts, timelines and step times of the ladder's wrappers (10)."""

from __future__ import annotations

import copy
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from multigpu.core.train import History, TrainConfig, cpu_state_dict
from multigpu.miniddp import (
    STRATEGIES,
    BranchNet,
    BucketedDDP,
    MiniDDP,
    TimelineEvent,
    bucket_layout,
    hidden_fraction,
    make_ddp,
    record_torch_buckets,
    train_with_strategy,
)


def train_rank(
    rank: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    strategy: str | type = "bucketed",
    options: dict | None = None,
    accumulation: int = 1,
    fp16_compress: bool = False,
) -> History:
    """One training run of :func:`~multigpu.miniddp.train_with_strategy` on this rank
    (10)."""
    return train_with_strategy(
        model, X, y, config, strategy, options, accumulation, fp16_compress
    )


def compare_rank(
    rank: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    strategies: tuple[str, ...] = STRATEGIES,
    options: dict | None = None,
    accumulation: int = 1,
) -> dict[str, History]:
    """:func:`~multigpu.miniddp.train_with_strategy` once per strategy, in one launch
    (10)."""
    return {
        strategy: train_with_strategy(
            model,
            X,
            y,
            config,
            strategy,
            options if strategy in ("bucketed", "torch") else None,
            accumulation,
        )
        for strategy in strategies
    }


def unused_rank(
    rank: int,
    world_size: int,
    strategy: str,
    find_unused_parameters: bool,
    b_on_ranks: tuple[int, ...] = (),
    steps: int = 3,
) -> dict[str, Any]:
    """A few SGD steps of :class:`~multigpu.miniddp.BranchNet` (float64) where head
    ``b`` is used only on the ranks in ``b_on_ranks``. Returns the final parameters,
    or the error that stopped training and the step it came at (10)."""
    torch.manual_seed(0)
    model = make_ddp(
        BranchNet().double(), strategy, find_unused_parameters=find_unused_parameters
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(rank + 1)  # every rank its own data
    X, y = torch.randn(8, 8, dtype=torch.float64), torch.randint(0, 3, (8,))
    try:
        for step in range(steps):  # noqa: B007 (the except reports it)
            optimizer.zero_grad()
            out = model(X, use_b=rank in b_on_ranks)
            nn.functional.cross_entropy(out, y).backward()
            optimizer.step()
    except RuntimeError as error:
        return {"step": step, "error": type(error).__name__, "message": str(error)}
    return {"parameters": cpu_state_dict(model.module)}


def layouts_rank(
    rank: int,
    world_size: int,
    model: nn.Module,
    bucket_cap_mb: float,
    steps: int = 3,
    find_unused_parameters: bool = False,
    X: torch.Tensor | None = None,
) -> dict[str, Any]:
    """The bucket layouts of :class:`~multigpu.miniddp.BucketedDDP` and of PyTorch's
    DDP (as :func:`~multigpu.miniddp.record_torch_buckets` saw them) at each of
    ``steps`` steps, with the same ``bucket_cap_mb`` and ``find_unused_parameters``,
    on ``X`` (default: random 8x8 images, a different batch on each rank) (10)."""
    torch.manual_seed(rank)
    options = {
        "bucket_cap_mb": bucket_cap_mb,
        "find_unused_parameters": find_unused_parameters,
    }
    ours = BucketedDDP(copy.deepcopy(model), **options)
    theirs = DDP(copy.deepcopy(model), **options)
    log = record_torch_buckets(theirs)
    if X is None:
        X = torch.randn(4, 1, 8, 8, dtype=next(model.parameters()).dtype)
    layouts = []
    for _ in range(steps):
        layouts.append(bucket_layout(ours))  # the buckets this step will use
        for wrapped in (ours, theirs):
            wrapped(X).sum().backward()
    return {"ours": layouts, "torch": log}


def timeline_rank(
    rank: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    strategies: tuple[str, ...] = ("flat", "bucketed"),
    options: dict | None = None,
    steps: int = 3,
) -> dict[str, list[TimelineEvent]]:
    """The timeline of the last of ``steps`` training steps for each strategy on
    this rank's batch X, y (10)."""
    timelines = {}
    for strategy in strategies:
        wrapped = make_ddp(
            copy.deepcopy(model),
            strategy,
            record=True,
            **(options or {} if strategy == "bucketed" else {}),
        )
        for _ in range(steps):
            dist.barrier()
            wrapped.zero_grad()
            nn.functional.cross_entropy(wrapped(X), y).backward()
        timelines[strategy] = sorted(wrapped.events, key=lambda e: e.start)
    return timelines


def step_time_rank(
    rank: int,
    world_size: int,
    model: nn.Module,
    per_rank_batch: int,
    input_shape: tuple[int, ...],
    variants: list[tuple[str, str, dict]],
    steps: int = 10,
) -> dict[str, dict[str, float]]:
    """Median seconds of a training step (forward, backward, all gradient
    communication, SGD step) for each ``(label, strategy, options)``, the slowest
    rank counting, variants taking turns so that a busy moment hits all of them;
    also the median fraction of communication hidden behind backward (bench) (10)."""
    torch.manual_seed(0)
    X = torch.randn(per_rank_batch, *input_shape)
    y = torch.randint(0, 10, (per_rank_batch,))
    models = {}
    for label, strategy, options in variants:
        record = strategy != "torch"
        extra = {"record": True} if record else {}
        models[label] = make_ddp(copy.deepcopy(model), strategy, **options, **extra)
    optimizers = {
        label: torch.optim.SGD(m.parameters(), lr=0.01) for label, m in models.items()
    }
    seconds: dict[str, list[float]] = {label: [] for label in models}
    hidden: dict[str, list[float]] = {label: [] for label in models}
    for step in range(steps + 2):
        for label, wrapped in models.items():
            dist.barrier()
            start = time.perf_counter()
            optimizers[label].zero_grad()
            nn.functional.cross_entropy(wrapped(X), y).backward()
            optimizers[label].step()
            elapsed = torch.tensor([time.perf_counter() - start])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if step >= 2:  # two warm-up steps (torch DDP rebuilds its buckets)
                seconds[label].append(elapsed.item())
                if isinstance(wrapped, MiniDDP):
                    hidden[label].append(hidden_fraction(wrapped.events))
    return {
        label: {
            "seconds": statistics.median(seconds[label]),
            "hidden": statistics.median(hidden[label])
            if hidden[label]
            else float("nan"),
        }
        for label in models
    }


def probe_rank(
    rank: int,
    world_size: int,
    wrapper: type,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
) -> dict[str, Any]:
    """One backward through ``wrapper`` watching when its buckets' all-reduces were
    started, and whether ``gradient_ready`` ran any all-reduce without
    ``async_op=True``; then a training run with it (check_wrapper). When that
    backward raises after a blocking all-reduce, the error is reported, not
    raised (every rank ran the same all-reduces, so no peer waits)."""
    real_all_reduce = dist.all_reduce
    inside = [False]
    blocking = [0]

    def watched_all_reduce(*args: Any, **kwargs: Any) -> Any:
        if inside[0] and not kwargs.get("async_op", len(args) > 3 and args[3]):
            blocking[0] += 1
        return real_all_reduce(*args, **kwargs)

    class Probe(wrapper):
        def gradient_ready(self, param: nn.Parameter) -> None:
            inside[0] = True
            try:
                super().gradient_ready(param)
            finally:
                inside[0] = False
            self.started.append(sum(b.work is not None for b in self.buckets))

    probe = Probe(copy.deepcopy(model), bucket_cap_mb=0.002)
    probe.started = []
    dist.all_reduce = watched_all_reduce
    try:
        nn.functional.cross_entropy(probe(X[:4]), y[:4]).backward()
    except Exception as error:
        if not blocking[0]:
            raise
        return {"blocking": blocking[0], "error": f"{type(error).__name__}: {error}"}
    finally:
        dist.all_reduce = real_all_reduce
    history = train_with_strategy(model, X, y, config, wrapper)
    return {
        "started": probe.started,
        "buckets": len(probe.buckets),
        "run": history,
        "blocking": blocking[0],
    }

"""What the ranks run in notebooks 09 and 09b: DDP training, its comparison with 08,
evaluation, uneven inputs, SyncBatchNorm on CPU and its exchanges, a non-finite
loss, accumulation's syncs (09, 09b)."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from multigpu.core.batches import per_rank_batch_size
from multigpu.core.train import History, TrainConfig
from multigpu.ddp import (
    accumulate,
    evaluate_distributed,
    evaluate_padded,
    train_ddp_loop,
    wrap,
)
from multigpu.ranks.allreduce_sgd import train_rank as allreduce_sgd_train_rank
from multigpu.runtime.launch import DEFAULT_DEADLINE_S, DEFAULT_TIMEOUT_S, spawn


def train_rank(
    rank: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    options: Mapping[str, Any],
) -> History:
    """What each rank runs under :func:`train_ddp` (09)."""
    return train_ddp_loop(model, X, y, config, progress=False, log=None, **options)


def train_ddp(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    world_size: int,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    deadline: float | None = DEFAULT_DEADLINE_S,
    backend: str = "gloo",
    **options: Any,
) -> list[History]:
    """Train with DDP on ``world_size`` processes started by ``launch.spawn``; one
    History per rank, by rank. ``options``: the keywords of
    :func:`multigpu.ddp.train_ddp_loop` (09, 09b)."""
    per_rank_batch_size(config.batch_size, world_size)  # fail before starting
    return spawn(
        train_rank,
        world_size,
        model,
        X,
        y,
        config,
        options,
        backend=backend,
        timeout=timeout,
        deadline=deadline,
    )


def compare_rank(
    rank: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    options: Mapping[str, Any],
) -> dict[str, History]:
    """DDP and 08's hand-written all-reduce SGD on the same ranks, same data (09)."""
    by_hand = allreduce_sgd_train_rank(rank, world_size, model, X, y, {"08": config})
    by_hand = by_hand["08"]
    ddp = train_ddp_loop(model, X, y, config, progress=False, log=None, **options)
    return {"ddp": ddp, "allreduce_sgd": by_hand}


def broadcast_at_construction_rank(rank: int, world_size: int, seed: int = 0) -> dict:
    """Each rank builds ConvNet from its *own* seed (``seed + rank``), then wraps it
    in DDP. Returns whether the ranks' weights differed before and agree after (09)."""
    from multigpu.core.models import ConvNet
    from multigpu.core.reproducibility import set_seed

    set_seed(seed + rank)
    model = ConvNet()

    def fingerprints() -> list[torch.Tensor]:
        flat = torch.cat([t.flatten() for t in model.state_dict().values()])
        gathered = [torch.zeros_like(flat) for _ in range(world_size)]
        dist.all_gather(gathered, flat)
        return gathered

    before = fingerprints()
    wrapped = wrap(model)
    after = fingerprints()
    mine = torch.cat([t.flatten() for t in wrapped.module.state_dict().values()])
    return {
        "rank": rank,
        "differed before": any(not torch.equal(t, before[0]) for t in before[1:]),
        "agree after": all(torch.equal(t, after[0]) for t in after),
        "equal rank 0's initial weights": torch.equal(mine, before[0]),
    }


def evaluation_rank(
    rank: int, world_size: int, model: nn.Module, X: torch.Tensor, y: torch.Tensor
) -> dict[str, tuple[float, float]]:
    """(mean loss, accuracy) of ``model`` on X, y three ways: every sample once, and
    the padded sampler's sums divided by the dataset length and by ``total_size``
    (09)."""
    return {
        "every sample once": evaluate_distributed(model, X, y),
        "padded / len(dataset)": evaluate_padded(model, X, y, "dataset"),
        "padded / total_size": evaluate_padded(model, X, y, "total_size"),
    }


def uneven_inputs_rank(
    rank: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    join: bool,
) -> int:
    """Rank r trains on r + 1 batches of 4 samples. Without ``Join`` the ranks with
    fewer batches leave while the others wait in a gradient all-reduce that never
    completes; with ``torch.distributed.algorithms.Join`` the finished ranks shadow
    the others' all-reduces. Returns the batches this rank trained on (09b).

    Without ``Join``, a rank that has run out spends a second on end-of-epoch work
    (a stand-in for an evaluation) before its barrier, so the rank stuck in the
    all-reduce is the first to reach the timeout and the error names it; without
    that head start, which rank times out first is a race of milliseconds."""
    from torch.distributed.algorithms import Join

    ddp_model = wrap(copy.deepcopy(model))
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    steps = rank + 1
    context = Join([ddp_model]) if join else contextlib.nullcontext()
    with context:
        for step in range(steps):
            xb, yb = X[4 * step : 4 * step + 4], y[4 * step : 4 * step + 4]
            optimizer.zero_grad()
            nn.functional.cross_entropy(ddp_model(xb), yb).backward()
            optimizer.step()
    if not join and steps < world_size:
        time.sleep(1.0)  # end-of-epoch work: the stuck rank times out first
    dist.barrier()  # the end of an epoch: e.g. before rank 0 saves a checkpoint
    return steps


def sync_batchnorm_on_cpu_rank(rank: int, world_size: int) -> None:
    """``nn.SyncBatchNorm`` on CPU tensors in a group of ``world_size`` ranks: raises
    PyTorch's own error (09b)."""
    layer = nn.SyncBatchNorm(4)
    layer(torch.randn(8, 4, 2, 2))


SYNCBN_SETTINGS = {  # label: (PyTorch's own layer?, features frozen?, eval mode?)
    "reference, whole model trains": (False, False, False),
    "reference, frozen, train mode": (False, True, False),
    "reference, frozen, eval mode": (False, True, True),
    "nn.SyncBatchNorm, frozen, eval mode": (True, True, True),
}


def syncbn_exchanges_rank(
    rank: int, world_size: int, model: nn.Module, X: torch.Tensor, y: torch.Tensor
) -> dict[str, list[int]]:
    """One DDP training step of ``model`` with synchronized BatchNorm in each of
    :data:`SYNCBN_SETTINGS`, counting the collectives its layers run in forward
    and in backward (``dist.all_reduce`` and ``dist.all_gather`` are watched;
    DDP's reducer calls the process group directly and is not counted) and DDP's
    bucket all-reduces (a communication hook): ``[forward, backward, buckets]``
    per setting. Frozen: only the classifier trains. PyTorch's own layer runs
    without DDP, which refuses SyncBatchNorm on CPU (0 buckets) (09b)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
        allreduce_hook,
    )

    from multigpu.syncbn import convert_sync_batchnorm

    watched = ("all_reduce", "all_gather", "all_gather_into_tensor")
    real = {name: getattr(dist, name) for name in watched}
    counts = [0, 0, 0, 0]  # forward, backward, DDP's buckets, DDP's own calls
    phase = [0]

    def counted(name: str) -> Any:
        def collective(*args: Any, **kwargs: Any) -> Any:
            counts[phase[0]] += 1
            return real[name](*args, **kwargs)

        return collective

    def counting_hook(state, bucket):  # no annotations: DDP checks them
        counts[2] += 1
        during, phase[0] = phase[0], 3  # the hook's own all-reduce: not SyncBN's
        try:
            return allreduce_hook(state, bucket)
        finally:
            phase[0] = during

    results = {}
    for setting, (pytorch, frozen, eval_mode) in SYNCBN_SETTINGS.items():
        convert = (
            nn.SyncBatchNorm.convert_sync_batchnorm
            if pytorch
            else convert_sync_batchnorm
        )
        net = convert(copy.deepcopy(model))
        if frozen:
            net.features.requires_grad_(False)  # only the classifier trains
        if eval_mode:
            net.features.eval()  # BatchNorm uses its running statistics
        if pytorch:  # DDP refuses it on CPU: "SyncBatchNorm layers only work with
            ddp_model = net  # GPU modules"; the layers run in the group alone
        else:
            ddp_model = wrap(net)
            ddp_model.register_comm_hook(None, counting_hook)
        counts[:] = [0, 0, 0, 0]
        for name in watched:
            setattr(dist, name, counted(name))
        try:
            phase[0] = 0
            loss = nn.functional.cross_entropy(ddp_model(X), y)
            phase[0] = 1
            loss.backward()
        finally:
            for name in watched:
                setattr(dist, name, real[name])
        results[setting] = counts[:3]
    return results


def nonfinite_loss_rank(
    rank: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    bad_step: int,
    check: bool,
) -> dict[str, Any]:
    """DDP training on batches of 8 samples per rank in which rank 1's input at step
    ``bad_step`` (counted from 1) holds an infinity, so its loss is NaN. With
    ``check``, every rank all-reduces a flag (1 if its loss is not finite) before
    backward and all stop together at the same step; without it the NaN reaches
    every rank through the gradient all-reduce. Returns the step at which this rank
    stopped, before its update (None: it trained every step), whether its own loss
    was finite there, and whether its weights are finite at the end (09b)."""
    ddp_model = wrap(copy.deepcopy(model))
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.05)
    mine_X, mine_y = X.chunk(world_size)[rank], y.chunk(world_size)[rank]
    stopped, own_finite = None, True
    for step, (xb, yb) in enumerate(zip(mine_X.split(8), mine_y.split(8)), start=1):
        if rank == 1 and step == bad_step:
            xb = xb.clone()
            xb[0, 0, 0, 0] = float("inf")  # one corrupt value in one sample
        loss = nn.functional.cross_entropy(ddp_model(xb), yb)
        if check:
            not_finite = torch.tensor([float(not torch.isfinite(loss))])
            dist.all_reduce(not_finite)  # how many ranks have a non-finite loss
            if not_finite.item() > 0:  # every rank sees the same sum: all stop
                stopped, own_finite = step, bool(torch.isfinite(loss))
                break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    finite = all(bool(torch.isfinite(p).all()) for p in ddp_model.parameters())
    return {"stopped at": stopped, "own loss finite": own_finite, "finite": finite}


def accumulation_syncs_rank(
    rank: int, world_size: int, model: nn.Module, X: torch.Tensor, how: str
) -> list[int]:
    """:func:`accumulation_syncs_n_rank` with 3 micro-batches per step (09b)."""
    return accumulation_syncs_n_rank(rank, world_size, model, X, how, 3)


def accumulation_syncs_n_rank(
    rank: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    how: str,
    micro_batches: int,
) -> list[int]:
    """Two optimizer steps of ``micro_batches`` each through
    :func:`multigpu.ddp.accumulate` ``how``; returns, for every micro-batch, how
    many gradient all-reduces its backward started (09b).

    A communication hook counts the buckets DDP reduces; this small model fits in
    one bucket, so a synced backward shows 1 and an unsynced one 0.
    """
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
        allreduce_hook,
    )

    ddp_model = wrap(copy.deepcopy(model))
    calls = [0]

    def counting_hook(state, bucket):  # no annotations: DDP checks them
        calls[0] += 1
        return allreduce_hook(state, bucket)

    ddp_model.register_comm_hook(None, counting_hook)
    y = torch.zeros(len(X), dtype=torch.long)
    counts: list[int] = []

    def record(micro_step: int) -> None:
        counts.append(calls[0] - sum(counts))

    size = 2 * micro_batches  # samples per step, 2 per micro-batch
    for step in range(2):
        starts = range(size * step, size * (step + 1), 2)
        micro = [(X[i : i + 2], y[i : i + 2]) for i in starts]
        accumulate(ddp_model, micro, how, after_backward=record)
    return counts


def step_times_rank(
    rank: int,
    world_size: int,
    per_rank_batch: int = 32,
    steps: int = 20,
    model: nn.Module | None = None,
    input_shape: tuple[int, ...] = (1, 8, 8),
) -> dict[str, float]:
    """Seconds of the fastest training step of ``model`` (ConvNet by default) on
    this rank, with DDP's gradient all-reduce and without it (inside ``no_sync``),
    taking turns; the slowest rank's time per step counts; and the number of buckets
    DDP all-reduced, from its logging data (bench/ddp_steps.py, 12). The fastest
    step is the one the rest of the machine disturbed least; a median moves with
    whatever else the cores run."""
    from multigpu.core.models import ConvNet

    torch.manual_seed(0)
    model = wrap(copy.deepcopy(model) if model is not None else ConvNet())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    X = torch.randn(per_rank_batch, *input_shape)
    y = torch.randint(0, 10, (per_rank_batch,))
    seconds: dict[str, list[float]] = {"synced": [], "no_sync": []}
    for step in range(steps + 1):
        for name in seconds:
            context = model.no_sync() if name == "no_sync" else contextlib.nullcontext()
            dist.barrier()
            start = time.perf_counter()
            with context:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(X), y).backward()
            optimizer.step()
            elapsed = torch.tensor([time.perf_counter() - start])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if step:  # step 0 warms up (and DDP rebuilds its buckets)
                seconds[name].append(elapsed.item())
    times = {name: min(values) for name, values in seconds.items()}
    sizes = str(model._get_ddp_logging_data().get("bucket_sizes", ""))
    times["buckets"] = float(len([size for size in sizes.split(",") if size.strip()]))
    return times

"""The ranks of notebook 13 and the launchers that start them (13).

Each stage of :mod:`multigpu.zero` on a rank (:func:`stages_rank`), PyTorch's DDP
with Adam (:func:`ddp_rank`), FSDP2 training and loading (:func:`fsdp2_rank`,
:func:`fsdp2_runs_rank`, :func:`fsdp2_load_rank`), 07's reduce-scatter and
all-gather checked against PyTorch's (:func:`collectives_rank`), and the ranks of
the exercises' checkers (:func:`zero2_exercise_rank`, :func:`fsdp2_exercise_rank`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from multigpu.collectives import all_gather, reduce_scatter
from multigpu.core.batches import epoch_means, run_batches
from multigpu.core.checks import check_choice, check_positive_int
from multigpu.core.train import History, TrainConfig, cpu_state_dict
from multigpu.costmodel import ZERO_STAGES
from multigpu.miniddp import copy_from_rank0
from multigpu.runtime.launch import SLOW_TIMEOUT_S, spawn
from multigpu.zero import (
    Batch,
    ShardedHistory,
    ShardedStep,
    check_checkpoint_dir,
    describe_shards,
    flatten_parameters,
    full_parameters,
    fully_shard_model,
    measure_ledger,
    train_stage,
)


def stages_rank(
    rank: int,
    world_size: int,
    runs: Sequence[tuple],
    step: ShardedStep | None = None,
) -> list[ShardedHistory]:
    """Rank function: :func:`~multigpu.zero.train_stage` for each (stage, model, X,
    y, config) of ``runs``, in order, in one launch (13). ``model`` may be a list,
    every rank's own model, by rank (rank 0's is broadcast); a run may add a sixth
    item, every rank's ``batches``, by rank: this rank trains on its own."""
    histories = []
    for stage, model, X, y, config, *by_rank in runs:
        model = model[rank] if isinstance(model, list) else model
        batches = by_rank[0][rank] if by_rank else None
        histories.append(train_stage(stage, model, X, y, config, step, batches))
    return histories


def compare_stages(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    world_size: int,
    stages: Sequence[str] = ZERO_STAGES,
    timeout: float = SLOW_TIMEOUT_S,
    batches: Sequence[Sequence[Batch]] | None = None,
) -> dict[str, list[ShardedHistory]]:
    """Train ``model`` with each of ``stages`` on ``world_size`` ranks, in one
    launch: {stage: each rank's history, by rank} (13). ``batches``: every rank's
    batches (as :func:`~multigpu.zero.train_stage` takes them), by rank."""
    check_positive_int("world_size", world_size)
    for stage in stages:
        check_choice("stage", stage, ZERO_STAGES)
    if batches is not None and len(batches) != world_size:
        raise ValueError(
            f"batches holds {len(batches)} ranks' batches for {world_size} ranks. "
            "Pass one list of batches per rank, by rank."
        )
    extra = () if batches is None else (batches,)
    runs = [(stage, model, X, y, config, *extra) for stage in stages]
    per_rank = spawn(stages_rank, world_size, runs, timeout=timeout)
    return {
        stage: [results[index] for results in per_rank]
        for index, stage in enumerate(stages)
    }


def ddp_rank(
    rank: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
) -> History:
    """Rank function: PyTorch's ``DistributedDataParallel`` with Adam on this rank's
    slices of notebook 08's batches; returns this rank's history (13)."""
    ddp = nn.parallel.DistributedDataParallel(copy.deepcopy(model))
    optimizer = torch.optim.Adam(ddp.parameters(), lr=config.lr)
    history = History(rank=rank, world_size=world_size)
    batches, steps_per_epoch = run_batches(len(X), config, world_size, rank)
    for indices in batches:
        optimizer.zero_grad()
        loss = F.cross_entropy(ddp(X[indices]), y[indices])
        loss.backward()  # DDP averages the gradients here
        optimizer.step()
        history.step_loss.append(loss.item())
    history.train_loss = epoch_means(history.step_loss, steps_per_epoch)
    history.parameters = cpu_state_dict(ddp.module)
    return history


def fsdp2_rank(
    rank: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    checkpoint_dir: str | None = None,
) -> ShardedHistory:
    """Rank function: FSDP2 (:func:`fully_shard_model`) trained with Adam;
    optionally saves a sharded checkpoint with ``torch.distributed.checkpoint``.
    Returns this rank's history with the full weights, its shards and ledger
    (13)."""
    import torch.distributed.checkpoint as dcp

    model = fully_shard_model(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    history = ShardedHistory(rank=rank, world_size=world_size)
    batches, steps_per_epoch = run_batches(len(X), config, world_size, rank)
    for indices in batches:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(X[indices]), y[indices])
        loss.backward()  # reduce-scatters (and averages) each layer's gradient
        optimizer.step()  # Adam on this rank's rows only
        history.step_loss.append(loss.item())
    history.train_loss = epoch_means(history.step_loss, steps_per_epoch)
    history.ledger = measure_ledger(list(model.parameters()), optimizer)
    if checkpoint_dir is not None:
        # Each rank writes its own rows; rank 0 adds the metadata that maps them.
        dcp.save({"model": model.state_dict()}, checkpoint_id=checkpoint_dir)
    history.parameters = full_parameters(model)
    history.shards = describe_shards(model)
    return history


def fsdp2_runs_rank(
    rank: int,
    world_size: int,
    runs: Sequence[tuple],
) -> list[ShardedHistory]:
    """Rank function: :func:`fsdp2_rank` for each (model, X, y, config) of ``runs``,
    in order, in one launch; ``model`` may be a list, every rank's own model, by
    rank (rank 0's is broadcast) (13)."""
    histories = []
    for model, X, y, config in runs:
        model = model[rank] if isinstance(model, list) else model
        histories.append(fsdp2_rank(rank, world_size, model, X, y, config))
    return histories


def train_fsdp2(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    world_size: int,
    checkpoint_dir: str | Path | None = None,
    timeout: float = SLOW_TIMEOUT_S,
) -> list[ShardedHistory]:
    """:func:`fsdp2_rank` on ``world_size`` ranks: each rank's history, by rank
    (13)."""
    check_positive_int("world_size", world_size)
    folder = None if checkpoint_dir is None else str(checkpoint_dir)
    return spawn(fsdp2_rank, world_size, model, X, y, config, folder, timeout=timeout)


def fsdp2_load_rank(
    rank: int, world_size: int, model: nn.Module, checkpoint_dir: str
) -> dict[str, Any]:
    """Rank function: shard ``model`` with FSDP2 over this launch's ranks, however
    many saved the checkpoint, and load the checkpoint into the shards. Returns
    {"parameters": the full weights, gathered; "shards": :func:`describe_shards`}
    (13)."""
    import torch.distributed.checkpoint as dcp

    model = fully_shard_model(model)
    state = {"model": model.state_dict()}  # DTensors: the rows this rank holds now
    # The .metadata file maps every saved piece to its rows in the full tensor, so
    # each rank reads, from whichever files hold them, exactly the rows it holds.
    dcp.load(state, checkpoint_id=checkpoint_dir)
    model.load_state_dict(state["model"])
    return {"parameters": full_parameters(model), "shards": describe_shards(model)}


def load_fsdp2_checkpoint(
    model: nn.Module,
    checkpoint_dir: str | Path,
    world_size: int,
    timeout: float = SLOW_TIMEOUT_S,
) -> list[dict[str, Any]]:
    """Load a checkpoint that :func:`train_fsdp2` saved on any number of ranks into
    FSDP2 on ``world_size`` ranks (:func:`fsdp2_load_rank`): each rank's
    {"parameters", "shards"}, by rank (13)."""
    check_positive_int("world_size", world_size)
    check_checkpoint_dir(checkpoint_dir)
    return spawn(
        fsdp2_load_rank, world_size, model, str(checkpoint_dir), timeout=timeout
    )


def collectives_rank(
    rank: int, world_size: int, numels: Sequence[int], dtype: torch.dtype
) -> list[dict[str, Any]]:
    """Rank function: for each size, :func:`~multigpu.collectives.reduce_scatter`
    and :func:`~multigpu.collectives.all_gather` of rank-dependent data, and
    PyTorch's ``reduce_scatter_single`` / ``all_gather_single`` where the size
    divides evenly (13)."""
    rows = []
    for numel in numels:
        generator = torch.Generator().manual_seed(100 + rank)
        full = (torch.randint(0, 100, (numel,), generator=generator) / 7).to(dtype)
        mine = full.tensor_split(world_size)[rank].clone()  # my input to all-gather
        scattered = torch.empty_like(mine)
        gathered = torch.empty_like(full)
        row = {
            "numel": numel,
            "input": full,
            "mine": mine,
            "reduce_scatter bytes": reduce_scatter(scattered, full),
            "all_gather bytes": all_gather(gathered, mine),
            "reduce_scatter": scattered,
            "all_gather": gathered,
        }
        if numel % world_size == 0:
            expected = torch.empty_like(mine)
            dist.reduce_scatter_single(expected, full.clone())
            row["dist.reduce_scatter_single"] = expected
            expected = torch.empty_like(full)
            dist.all_gather_single(expected, mine.clone())
            row["dist.all_gather_single"] = expected
        rows.append(row)
    return rows


def _refuse_default_mesh(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(
        "fully_shard was called without mesh=: it would pick a mesh of the "
        "machine's accelerator (CUDA where there is a GPU), not the CPU."
    )


def fsdp2_exercise_rank(
    rank: int,
    world_size: int,
    rank_function: Any,
    model: nn.Module,
    fresh: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    checkpoint_dir: str,
) -> dict[str, Any]:
    """Rank function of 13's FSDP2 checker: the learner's ``rank_function(rank,
    world_size, model, fresh, X, y, config, checkpoint_dir)``, with ``fully_shard``
    refusing to choose a mesh itself (torch's default would be the accelerator's).
    Returns, for "model" and "fresh": which Linears and whether the root are FSDP
    modules, and the full weights (gathered where sharded) (13)."""
    import importlib

    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    # torch 2.14: fully_shard(mesh=None) calls this module's _init_default_mesh.
    module = importlib.import_module("torch.distributed.fsdp._fully_shard._fully_shard")
    module._init_default_mesh = _refuse_default_mesh  # type: ignore[attr-defined]
    rank_function(rank, world_size, model, fresh, X, y, config, checkpoint_dir)
    report = {}
    for key, network in (("model", model), ("fresh", fresh)):
        report[key] = {
            "root sharded": isinstance(network, FSDPModule),
            "layers sharded": [
                isinstance(layer, FSDPModule)
                for layer in network.modules()
                if isinstance(layer, nn.Linear)
            ],
            "parameters": {
                name: (p.full_tensor() if isinstance(p, DTensor) else p)
                .detach()
                .clone()
                for name, p in network.named_parameters()
            },
        }
    return report


_COUNTED = ("all_reduce", "reduce_scatter_single", "reduce_scatter_tensor")
_COUNTED += ("reduce_scatter", "all_gather_single", "all_gather_into_tensor")


def chunk_range(numel: int, world_size: int, rank: int) -> range:
    """The elements of a flat buffer of ``numel`` that ``rank`` owns when it is cut
    as ``torch.chunk`` cuts (FSDP1's flat parameter): chunks of ceil(numel / n),
    the last ones shorter or empty (13)."""
    size = math.ceil(numel / world_size)
    return range(min(rank * size, numel), min((rank + 1) * size, numel))


def zero2_exercise_rank(
    rank: int,
    world_size: int,
    step: Callable[..., Any],
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
) -> dict[str, Any]:
    """Rank function of 13's ZeRO-2 checker: the learner's ``step(model, flat,
    shard, optimizer, X, y)`` on notebook 08's batches, Adam on ``shard``, this
    rank's :func:`chunk_range` of the flat buffer (a view). Returns the full
    weights, the ``torch.distributed`` collectives the step called (by name) and
    the most gradient bytes ``shard.grad`` held after a step (13)."""
    calls = dict.fromkeys(_COUNTED, 0)

    def counted(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return function(*args, **kwargs)

        return call

    model = copy_from_rank0(model)
    flat = flatten_parameters(model)  # (P,): every parameter a view of it
    owned = chunk_range(flat.numel(), world_size, rank)
    shard = nn.Parameter(flat[owned.start : owned.stop])  # a view: my chunk
    optimizer = torch.optim.Adam([shard], lr=config.lr)
    originals = {name: getattr(dist, name) for name in _COUNTED}
    kept = 0
    try:
        for name, function in originals.items():
            setattr(dist, name, counted(name, function))
        for indices in run_batches(len(X), config, world_size, rank)[0]:
            step(model, flat, shard, optimizer, X[indices], y[indices])
            if shard.grad is not None:
                kept = max(kept, shard.grad.untyped_storage().nbytes())
    finally:
        for name, function in originals.items():
            setattr(dist, name, function)
    return {
        "parameters": cpu_state_dict(model),
        "calls": {name: n for name, n in calls.items() if n},
        "gradient bytes": kept,
        "chunk bytes": math.ceil(flat.numel() / world_size) * flat.element_size(),
    }

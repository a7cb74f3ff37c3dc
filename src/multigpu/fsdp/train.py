"""Training with FSDP by hand on a rank, and the one-process references (14).

:func:`train_fsdp` follows 13's :func:`~multigpu.zero.train_stage`: notebook 08's
batches (:func:`~multigpu.core.batches.run_batches`), Adam with PyTorch's
defaults, every rank starting from rank 0's weights. Adam runs on the shards only
(the master weights, float32 or float64); the loss is computed in the master dtype
from the model's output, whatever the compute dtype.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from multigpu.core.batches import epoch_means, run_batches
from multigpu.core.train import TrainConfig
from multigpu.fsdp.checkpointing import SavedActivations
from multigpu.fsdp.hooks import HookedFSDP, MistakeFound, full_parameters
from multigpu.fsdp.sharded import FSDPByHand
from multigpu.miniddp import TimelineEvent, copy_from_rank0
from multigpu.zero import (
    ShardedHistory,
    check_same_step_counts,
    measure_ledger,
    shard_linears_and_root,
)


@dataclass
class FSDPHistory(ShardedHistory):
    """A rank's :class:`~multigpu.zero.ShardedHistory` with what FSDP by hand adds:
    the units' sizes, the forward order, the peak bytes of gathered parameters
    and, with ``record``, the last step's timeline (14)."""

    unit_numels: list[int] = field(default_factory=list)
    forward_order: list[int] = field(default_factory=list)
    peak_gathered_bytes: int = 0
    timeline: list[TimelineEvent] = field(default_factory=list)


def train_fsdp(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    count_activations: bool = False,
    **options,
) -> FSDPHistory:
    """Train a copy of ``model`` with :class:`~multigpu.fsdp.FSDPByHand` (its
    ``options``: units, depth, param_dtype, reshard_after_forward, record, prefetch,
    gather, reduce) on this rank; the history holds the full weights, gathered.
    With ``count_activations`` the ledger's "activations" is the peak of bytes
    saved for backward by the model over forward and backward, recomputation
    included (the loss's own left out) (14)."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    steps, steps_per_epoch = run_batches(len(X), config, world_size, rank)
    check_same_step_counts(len(steps))
    model = copy_from_rank0(model)
    fsdp = FSDPByHand(model, **options)
    optimizer = torch.optim.Adam(fsdp.shards, lr=config.lr)
    history = FSDPHistory(rank=rank, world_size=world_size)
    saved = SavedActivations(fsdp.holds_parameters)
    master = fsdp.units[0].shard.dtype
    try:
        for indices in steps:
            before = fsdp.meter.bytes_sent
            fsdp.reset_timeline()
            optimizer.zero_grad()
            with saved if count_activations else contextlib.nullcontext():
                output = fsdp(X[indices])  # what it saves for backward is counted
            loss = F.cross_entropy(output.to(master), y[indices])
            loss.backward()  # each unit reduce-scatters its gradient
            optimizer.step()  # Adam on this rank's shards only
            history.step_loss.append(loss.item())
            history.bytes_sent.append(fsdp.meter.bytes_sent - before)
        history.timeline = fsdp.timeline()
        history.ledger = measure_ledger(list(fsdp.shards), optimizer, fsdp.meter)
        history.ledger["activations"] = saved.peak_bytes
        history.peak_gathered_bytes = fsdp.meter.peak_gathered_bytes
        history.unit_numels = fsdp.unit_numels()
        history.forward_order = list(fsdp.forward_order)
        history.parameters = fsdp.full_state_dict()
    finally:
        fsdp.stream.close()
    history.train_loss = epoch_means(history.step_loss, steps_per_epoch)
    return history


def train_unit_hooks(
    model: nn.Module, X: torch.Tensor, y: torch.Tensor, config: TrainConfig, hooks
) -> dict:
    """Train a copy of ``model`` on this rank with each unit's life left to
    ``hooks`` (:class:`~multigpu.fsdp.hooks.HookedFSDP`); stop at the first
    mistake. Returns "mistake" (None, or the log entry of the hook at fault),
    "parameters" (the full weights, gathered, when training finished), "log" (the
    first step's hooks) and "peak gathered units" (14)."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    steps, _ = run_batches(len(X), config, world_size, rank)
    check_same_step_counts(len(steps))
    model = copy_from_rank0(model)
    wrapper = HookedFSDP(model, hooks)
    optimizer = torch.optim.Adam(wrapper.shards, lr=config.lr)
    report: dict = {"mistake": None, "parameters": None}
    try:
        for indices in steps:
            optimizer.zero_grad()
            output = wrapper(X[indices])
            F.cross_entropy(output, y[indices]).backward()
            optimizer.step()  # Adam on this rank's shards only
        report["parameters"] = full_parameters(wrapper)
    except MistakeFound:
        report["mistake"] = wrapper.mistake
    report["log"] = [entry for entry in wrapper.log if entry["step"] == 1]
    report["peak gathered units"] = wrapper.peak_gathered_units
    return report


def train_fsdp2_mixed(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    param_dtype: torch.dtype = torch.bfloat16,
) -> ShardedHistory:
    """The same training with PyTorch's FSDP2 under ``MixedPrecisionPolicy(
    param_dtype=param_dtype, reduce_dtype=torch.float32)``: ``fully_shard`` on each
    Linear (one tied to another is left to the root) and on the model, as 13's
    :func:`~multigpu.zero.fully_shard_model` does, on this rank (14)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    world_size, rank = dist.get_world_size(), dist.get_rank()
    steps, steps_per_epoch = run_batches(len(X), config, world_size, rank)
    check_same_step_counts(len(steps))
    mesh = init_device_mesh("cpu", (world_size,))  # CPU ranks on gloo
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    model = copy_from_rank0(model)
    shard_linears_and_root(model, mesh=mesh, mp_policy=policy)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    master = next(model.parameters()).dtype
    history = ShardedHistory(rank=rank, world_size=world_size)
    for indices in steps:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(X[indices]).to(master), y[indices])
        loss.backward()
        optimizer.step()
        history.step_loss.append(loss.item())
    history.parameters = {
        name: p.full_tensor().detach().clone() for name, p in model.named_parameters()
    }
    history.train_loss = epoch_means(history.step_loss, steps_per_epoch)
    return history


def train_ranks_arithmetic_adam(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    world_size: int,
) -> dict[str, torch.Tensor]:
    """NOT the one-process reference (that is the plain model on the global batch,
    :func:`~multigpu.zero.train_one_process_adam`): one process doing the ranks'
    arithmetic, each rank's mean gradient on its own batch, added in rank order and
    divided by ``world_size``, then Adam. It shows where a sharded run's float32
    difference from the reference comes from: the order of the additions (14)."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    schedules = [
        run_batches(len(X), config, world_size, r)[0] for r in range(world_size)
    ]
    for step in range(len(schedules[0])):
        total: list[torch.Tensor | None] = [None] * len(list(model.parameters()))
        for schedule in schedules:
            model.zero_grad()
            indices = schedule[step]
            F.cross_entropy(model(X[indices]), y[indices]).backward()
            for i, p in enumerate(model.parameters()):
                if p.grad is not None:
                    total[i] = p.grad if total[i] is None else total[i] + p.grad
        for p, grad in zip(model.parameters(), total):
            p.grad = None if grad is None else grad / world_size
        optimizer.step()
    return {name: t.detach().clone() for name, t in model.state_dict().items()}

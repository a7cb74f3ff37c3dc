"""Training: one process, and each ZeRO stage on a rank (13).

Training reads the series' :class:`~multigpu.core.train.TrainConfig` (``epochs``,
``batch_size`` (the global batch), ``lr``, ``seed``; ``momentum``, ``allreduce``
and ``reduction`` are not used) and follows notebook 08's batches
(:func:`~multigpu.core.batches.run_batches`). The optimizer is
``torch.optim.Adam(parameters, lr=config.lr)``: Adam's other hyper-parameters are
PyTorch's defaults, betas (0.9, 0.999), eps 1e-8, no weight decay. Every run
returns a :class:`~multigpu.core.train.History`; a rank of a sharded run returns a
:class:`ShardedHistory`, a History with what the rank measured.

The bytes a rank sends must equal ``costmodel.zero_bytes_sent_per_rank``. gloo has
no reduce-scatter of its own (it runs a full all-reduce and keeps a part), so timing
gloo says nothing about the volumes: they come from the hand-written collectives and
the formulas (``costmodel.zero_bytes_sent_theory``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from multigpu.core.batches import epoch_means, run_batches
from multigpu.core.checks import check_choice, check_positive_int
from multigpu.core.train import History, TrainConfig, cpu_state_dict
from multigpu.costmodel import ZERO_STAGES
from multigpu.miniddp import copy_from_rank0
from multigpu.zero.flat import (
    STEPS,
    ShardedStep,
    flatten_parameters,
    shard_of,
    trainable_parameters,
    watch_missing_gradients,
)
from multigpu.zero.ledger import measure_ledger
from multigpu.zero.zero3 import (
    Meter,
    check_shardable,
    gathered_state_dict,
    shard_model,
)


@dataclass
class ShardedHistory(History):
    """A :class:`~multigpu.core.train.History` of one rank of a sharded run, with what
    the rank measured: ``parameters`` are the full weights, gathered (13)."""

    bytes_sent: list[int] = field(default_factory=list)  # per step, by this rank
    ledger: dict[str, int] = field(default_factory=dict)  # bytes held after the run
    shards: list[dict[str, Any]] = field(default_factory=list)  # FSDP2's DTensors


def make_mlp(
    sizes: Sequence[int] = (10, 32, 32, 5), dtype: torch.dtype = torch.float64
) -> nn.Sequential:
    """Linear layers of the given widths with ReLU between them, (B, sizes[0]) ->
    (B, sizes[-1]); the default has 1,573 parameters, a prime: every world size
    above 1 cuts it into unequal shards (13)."""
    if len(sizes) < 2:
        raise ValueError(
            f"make_mlp needs at least two sizes (inputs and outputs), got {sizes!r}. "
            "Pass e.g. sizes=(10, 32, 5)."
        )
    for size in sizes:
        check_positive_int("each size", size)
    layers: list[nn.Module] = []
    for index, (inputs, outputs) in enumerate(zip(sizes[:-1], sizes[1:])):
        if index:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(inputs, outputs))
    return nn.Sequential(*layers).to(dtype)


def make_data(
    num_samples: int = 256,
    in_features: int = 10,
    num_classes: int = 5,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs X (num_samples, in_features) and labels y (num_samples,) that a
    linear map of X decides, so there is something to learn (13)."""
    generator = torch.Generator().manual_seed(seed)
    X = torch.randn(num_samples, in_features, generator=generator, dtype=dtype)
    mixing = torch.randn(in_features, num_classes, generator=generator, dtype=dtype)
    return X, (X @ mixing).argmax(dim=1)


Batch = torch.Tensor | tuple[torch.Tensor, torch.Tensor]
"""One step's batch: sample indices into X and y, or an (inputs, labels) pair."""


def _step_batches(
    X: torch.Tensor | None,
    y: torch.Tensor | None,
    config: TrainConfig,
    batches: Sequence[Batch] | None,
    world_size: int = 1,
    rank: int = 0,
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
    """(inputs, labels) per step, and the steps per epoch: ``batches`` as given, or
    notebook 08's (:func:`~multigpu.core.batches.run_batches`)."""
    if batches is None:
        indices, steps_per_epoch = run_batches(len(X), config, world_size, rank)
        return [(X[i], y[i]) for i in indices], steps_per_epoch
    pairs = []
    for number, batch in enumerate(batches):
        if isinstance(batch, torch.Tensor) and X is not None and y is not None:
            pairs.append((X[batch], y[batch]))
        elif isinstance(batch, (tuple, list)) and len(batch) == 2:
            pairs.append((batch[0], batch[1]))
        else:
            raise TypeError(
                f"Batch {number} is a {type(batch).__name__}: each batch must be a "
                "tensor of sample indices into X and y, or an (inputs, labels) pair. "
                "Pass e.g. batches=[torch.arange(8), ...] or [(X[:8], y[:8]), ...]."
            )
    return pairs, max(len(pairs), 1)


def train_one_process_adam(
    model: nn.Module,
    X: torch.Tensor | None,
    y: torch.Tensor | None,
    config: TrainConfig,
    batches: Sequence[Batch] | None = None,
) -> History:
    """The reference: Adam on the global batch in this process, notebook 08's
    batches or the global ``batches`` given (as :func:`train_stage` takes them);
    ``model`` is not changed (13)."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    history = History()
    steps, steps_per_epoch = _step_batches(X, y, config, batches)
    for inputs, labels in steps:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        history.step_loss.append(loss.item())
    history.train_loss = epoch_means(history.step_loss, steps_per_epoch)
    history.parameters = cpu_state_dict(model)
    return history


def check_same_step_counts(steps: int) -> None:
    """Raise ValueError on every rank unless every rank takes ``steps`` steps: each
    step is a collective, so a rank with fewer would leave the others waiting (13)."""
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, torch.tensor([steps]))
    if len({int(count) for count in counts}) > 1:
        per_rank = ", ".join(str(int(count)) for count in counts)
        raise ValueError(
            f"The ranks got different numbers of batches ({per_rank}, by rank): each "
            "step is a collective, so every rank must take as many steps. Give every "
            "rank the same number of batches."
        )


def train_stage(
    stage: str,
    model: nn.Module,
    X: torch.Tensor | None,
    y: torch.Tensor | None,
    config: TrainConfig,
    step: ShardedStep | None = None,
    batches: Sequence[Batch] | None = None,
) -> ShardedHistory:
    """Train a copy of ``model`` with ``stage`` on this rank (inside a process
    group): its history with the full weights (gathered), the bytes sent per step
    and the ledger after the last step (13).

    Every rank starts from rank 0's weights and buffers (broadcast, as DDP does). DDP,
    ZeRO-1 and ZeRO-2 take any module (frozen parameters stay frozen and out of the
    optimizer, tied weights stay tied) but refuse a parameter that gets a gradient in
    some steps and none in others (:func:`watch_missing_gradients`); ZeRO-3 what
    :func:`~multigpu.zero.zero3.shard_model` shards. ``batches``: this rank's batches,
    one per step, each sample indices into ``X`` and ``y`` or an (inputs, labels) pair;
    by default notebook 08's. Every rank passes as many; the stages average the ranks'
    mean gradients, so equal-sized batches train like one process on their union. With
    ``batches``, ``config`` gives ``lr`` only and ``train_loss`` is one mean over all
    steps. ``step`` replaces the stage's own step function (DDP, ZeRO-1, ZeRO-2 only).
    """
    check_choice("stage", stage, ZERO_STAGES)
    world_size, rank = dist.get_world_size(), dist.get_rank()
    if stage == "ZeRO-3":
        check_shardable(model)  # refused on every rank, before anything is sent
    steps, steps_per_epoch = _step_batches(X, y, config, batches, world_size, rank)
    check_same_step_counts(len(steps))
    model = copy_from_rank0(model)
    history = ShardedHistory(rank=rank, world_size=world_size)
    if stage == "ZeRO-3":
        meter = Meter()
        model = shard_model(model, meter)
        optimizer = torch.optim.Adam(trainable_parameters(model), lr=config.lr)
        for inputs, labels in steps:
            before = meter.bytes_sent
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs), labels)
            loss.backward()  # each layer reduce-scatters its gradient
            optimizer.step()  # Adam on this rank's chunks only
            history.step_loss.append(loss.item())
            history.bytes_sent.append(meter.bytes_sent - before)
        history.ledger = measure_ledger(list(model.parameters()), optimizer, meter)
        history.parameters = gathered_state_dict(model)
    else:
        step = step or STEPS[stage]
        flat = flatten_parameters(model)  # (P,): the trainable parameters only
        if stage == "DDP":
            shard = nn.Parameter(flat)  # all of it: every rank updates everything
        else:
            shard = nn.Parameter(shard_of(flat, rank, world_size))  # my chunk, a view
        optimizer = torch.optim.Adam([shard], lr=config.lr)
        check_missing = watch_missing_gradients(model, stage)
        for number, (inputs, labels) in enumerate(steps, start=1):
            loss, sent = step(model, flat, shard, optimizer, inputs, labels)
            check_missing(number)  # refused on every rank at once
            history.step_loss.append(float(loss))
            history.bytes_sent.append(sent)
        history.ledger = measure_ledger([*model.parameters(), shard], optimizer)
        history.parameters = cpu_state_dict(model)
    history.train_loss = epoch_means(history.step_loss, steps_per_epoch)
    return history

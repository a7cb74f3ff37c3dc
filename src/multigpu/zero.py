"""Sharding the model: ZeRO-1, -2 and -3 by hand, then FSDP2 (13).

Taught in ``notebooks/13_sharding_zero_fsdp.ipynb``. Data parallelism (08, 09) keeps
a whole copy of the training state on every rank. With Adam that is, per parameter,
its value, its gradient and two moments: 4 + 4 + 8 = 16 bytes in float32. ZeRO
("Zero Redundancy Optimizer", Rajbhandari et al., 2020) removes the copies step by
step: ZeRO-1 shards the optimizer state over the N ranks, ZeRO-2 the gradients too,
ZeRO-3 the parameters too (4 + 4 + 8/N, 4 + 12/N and 16/N bytes per parameter in
float32). These formulas, the table behind them and the bytes each stage sends are
in :mod:`multigpu.costmodel`
(``zero_bytes_per_parameter``, ``zero_memory_ledger``, ``zero_bytes_sent_theory``,
``zero_bytes_sent_per_rank``).

How the stages work here, all with Adam, all built from the hand-written collectives
of :mod:`multigpu.collectives`:

- **DDP, ZeRO-1, ZeRO-2** (:func:`ddp_flat_step`, :func:`zero1_step`,
  :func:`zero2_step`) keep the whole model on every rank, its parameters moved into
  one flat buffer (:func:`flatten_parameters`). The buffer is cut into N chunks as
  ``tensor_split(N)`` cuts it, so the parameter count need not divide by N. Adam
  updates ``shard``: the whole buffer (DDP) or this rank's chunk of it (ZeRO-1, -2),
  a view into the buffer. ZeRO-1 all-reduces the gradient like DDP and then uses
  only its chunk; ZeRO-2 reduce-scatters it, so a rank only ever receives its chunk.
  Both then all-gather the updated chunks into every rank's buffer.
- **ZeRO-3** (:class:`ShardedLinear`) keeps only this rank's chunk of each layer's
  parameters. The layer all-gathers its full weight just before its forward, frees
  it right after, all-gathers it again in backward and reduce-scatters the gradient:
  a ``torch.autograd.Function`` (:class:`AllGatherLinear`) makes each of these
  steps one visible line. This is what FSDP does with hooks.
- **FSDP2** (:func:`fsdp2_worker`): PyTorch's ``fully_shard`` on each layer, on an
  explicit CPU device mesh; its parameters are ``DTensor`` s whose rows are split
  over the ranks (:func:`describe_shards`), and ``torch.distributed.checkpoint``
  saves one file per rank, which :func:`load_sharded_checkpoint` reads back into an
  ordinary model in one process, and :func:`load_fsdp2_checkpoint` into FSDP2
  on any number of ranks.

Training reads the series' :class:`~multigpu.core.train.TrainConfig` (``epochs``,
``batch_size`` (the global batch), ``lr``, ``seed``; ``momentum``, ``allreduce``
and ``reduction`` are not used) and follows notebook 08's batches
(:func:`~multigpu.allreduce_sgd.run_batches`). The optimizer is
``torch.optim.Adam(parameters, lr=config.lr)``: Adam's other hyper-parameters are
PyTorch's defaults, betas (0.9, 0.999), eps 1e-8, no weight decay. Every run
returns a :class:`~multigpu.core.train.History`; a rank of a sharded run returns a
:class:`ShardedHistory`, a History with what the rank measured.

Every rank measures what it holds after a step (:func:`measure_ledger`, on the
tensors themselves: the memory behind each one, a buffer counted once) and the
bytes it sent (``costmodel.zero_bytes_sent_per_rank`` gives the count it must
equal). gloo has no reduce-scatter of its own (it runs a full all-reduce and keeps a
part), so timing gloo says nothing about the volumes: they come from the
hand-written collectives and the formulas (``costmodel.zero_bytes_sent_theory``).
The figure of the ledgers is :func:`multigpu.plots.plot_zero_ledgers`.

The rank functions that ``multigpu.runtime.launch.spawn`` runs live in this module:
:func:`stages_worker`, :func:`ddp_worker`, :func:`fsdp2_worker`,
:func:`fsdp2_load_worker` and :func:`collectives_worker`. PyTorch's files:
https://github.com/pytorch/pytorch/tree/main/torch/distributed/fsdp/_fully_shard and
https://github.com/pytorch/pytorch/tree/main/torch/distributed/checkpoint.
"""

from __future__ import annotations

import copy
import importlib
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from multigpu.allreduce_sgd import epoch_means, run_batches
from multigpu.collectives import (
    all_gather,
    reduce_scatter,
    ring_all_reduce,
    ring_chunk_sizes,
)
from multigpu.core.checks import check_choice, check_positive_int
from multigpu.core.train import History, TrainConfig, cpu_state_dict
from multigpu.costmodel import LEDGER_CATEGORIES, ZERO_STAGES, zero_bytes_sent_per_rank
from multigpu.runtime.launch import WorkerNotImportableError, spawn

STAGES = ZERO_STAGES  # "DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3": what each keeps whole
CATEGORIES = LEDGER_CATEGORIES  # a ledger's rows: parameters, gradients, ...

# A step of DDP, ZeRO-1 or ZeRO-2:
# step(model, flat, shard, optimizer, X, y) -> (this rank's mean loss, bytes sent)
Step = Callable[
    [nn.Module, torch.Tensor, nn.Parameter, torch.optim.Optimizer, torch.Tensor, Any],
    tuple[float, int],
]


@dataclass
class ShardedHistory(History):
    """A :class:`~multigpu.core.train.History` of one rank of a sharded run, with what
    the rank measured: ``parameters`` are the full weights, gathered (13)."""

    bytes_sent: list[int] = field(default_factory=list)  # per step, by this rank
    ledger: dict[str, int] = field(default_factory=dict)  # bytes held after the run
    shards: list[dict[str, Any]] = field(default_factory=list)  # FSDP2's DTensors


# ----------------------------------------------------------------------------------
# The model and the data: a small MLP, parameter counts that few world sizes divide


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


# ----------------------------------------------------------------------------------
# The flat buffer of DDP, ZeRO-1 and ZeRO-2


def flatten_parameters(model: nn.Module) -> torch.Tensor:
    """Move ``model``'s parameters into one flat buffer (P,) and return it: each
    parameter becomes a view of its slice, so writing into the buffer changes the
    model (13)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    offset = 0
    for p in model.parameters():
        p.data = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


def pop_flat_gradients(model: nn.Module) -> torch.Tensor:
    """Take this rank's gradients out of ``model``: one new flat tensor (P,), in
    parameter order; the parameters' own ``.grad`` are dropped (13)."""
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return flat


def shard_of(flat: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s chunk of ``flat``: a view, cut as ``tensor_split`` cuts (13)."""
    return flat.tensor_split(world_size)[rank]


def ddp_flat_step(model, flat, shard, optimizer, X, y) -> tuple[float, int]:
    """DDP by hand with Adam: all-reduce the gradient, every rank updates every
    parameter. ``shard`` is all of ``flat``; returns (loss, bytes sent) (13)."""
    loss = F.cross_entropy(model(X), y)  # mean over this rank's batch
    loss.backward()
    gradients = pop_flat_gradients(model)  # (P,)
    sent = ring_all_reduce(gradients)  # every rank: the sum over the ranks
    shard.grad = gradients / dist.get_world_size()  # the mean gradient, (P,)
    optimizer.step()  # Adam on all P parameters: 2P numbers of state
    return loss.item(), sent


def zero1_step(model, flat, shard, optimizer, X, y) -> tuple[float, int]:
    """ZeRO-1: all-reduce the gradient as DDP does, update only this rank's chunk
    (its moments are the only ones it keeps), all-gather the chunks (13)."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    gradients = pop_flat_gradients(model)  # (P,)
    sent = ring_all_reduce(gradients)  # every rank receives the whole sum
    gradients /= world_size
    shard.grad = shard_of(gradients, rank, world_size)  # a view: all P stay alive
    optimizer.step()  # Adam on this rank's chunk: 2P/N numbers of state
    sent += all_gather(flat, shard.detach())  # everyone's updated chunk, (P,)
    return loss.item(), sent


def zero2_step(model, flat, shard, optimizer, X, y) -> tuple[float, int]:
    """ZeRO-2: reduce-scatter the gradient, so each rank receives (and keeps) only
    its chunk of the sum; update the chunk; all-gather the chunks (13)."""
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    gradients = pop_flat_gradients(model)  # (P,), dropped when this function returns
    shard.grad = torch.empty_like(shard)  # (P/N,)
    sent = reduce_scatter(shard.grad, gradients)  # my chunk of the sum
    shard.grad /= dist.get_world_size()
    optimizer.step()
    sent += all_gather(flat, shard.detach())
    return loss.item(), sent


STEPS: dict[str, Step] = {
    "DDP": ddp_flat_step,
    "ZeRO-1": zero1_step,
    "ZeRO-2": zero2_step,
}


# ----------------------------------------------------------------------------------
# ZeRO-3: a Linear layer that keeps only its chunk


class Meter:
    """What one rank counts while it trains: bytes sent, and the bytes of gathered
    parameters alive now and at most (13)."""

    def __init__(self) -> None:
        self.bytes_sent = 0
        self.gathered_bytes = 0
        self.peak_gathered_bytes = 0

    def gathered(self, tensor: torch.Tensor) -> None:
        self.gathered_bytes += tensor.numel() * tensor.element_size()
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes)

    def freed(self, tensor: torch.Tensor) -> None:
        self.gathered_bytes -= tensor.numel() * tensor.element_size()


class ShardedLinear(nn.Module):
    """An ``nn.Linear`` whose weight and bias, flattened into one buffer of
    out·in + out numbers, are cut over the ranks: this rank keeps only its chunk,
    the parameter ``shard`` (13)."""

    def __init__(self, linear: nn.Linear, meter: Meter) -> None:
        super().__init__()
        world_size, rank = dist.get_world_size(), dist.get_rank()
        full = torch.cat([linear.weight.detach().reshape(-1), linear.bias.detach()])
        self.weight_shape = linear.weight.shape  # (out, in)
        self.numel = full.numel()
        self.shard = nn.Parameter(shard_of(full, rank, world_size).clone())
        self.meter = meter

    def gather(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """All-gather the full buffer: (it, the weight (out, in), the bias (out,))."""
        full = torch.empty(self.numel, dtype=self.shard.dtype)
        self.meter.bytes_sent += all_gather(full, self.shard.detach())
        self.meter.gathered(full)
        weight = full[: self.weight_shape.numel()].view(self.weight_shape)
        return full, weight, full[self.weight_shape.numel() :]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return AllGatherLinear.apply(x, self.shard, self)  # (B, in) -> (B, out)


class AllGatherLinear(torch.autograd.Function):
    """ZeRO-3's forward and backward of one layer: gather, compute, free; the
    gradient leaves reduce-scattered, as this rank's chunk only (13)."""

    @staticmethod
    def forward(ctx, x, shard, layer):
        full, weight, bias = layer.gather()  # all-gather just before use
        out = F.linear(x, weight, bias)  # (B, out)
        layer.meter.freed(full)  # freed right after: only x is kept for backward
        ctx.save_for_backward(x)
        ctx.layer = layer
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        layer = ctx.layer
        full, weight, _ = layer.gather()  # all-gather again, for grad_x
        grad_x = grad_out @ weight  # (B, in)
        layer.meter.freed(full)
        grad_full = torch.cat([(grad_out.T @ x).reshape(-1), grad_out.sum(0)])
        grad_shard = torch.empty_like(layer.shard)
        layer.meter.bytes_sent += reduce_scatter(grad_shard, grad_full)  # my chunk
        grad_shard /= dist.get_world_size()  # the mean over the ranks
        return grad_x, grad_shard, None


def shard_model(model: nn.Sequential, meter: Meter) -> nn.Sequential:
    """A copy of ``model`` with every ``nn.Linear`` replaced by a
    :class:`ShardedLinear` holding this rank's chunk (13)."""
    for index, layer in enumerate(model):  # check everything before sharding
        shardable = isinstance(layer, nn.Linear) and layer.bias is not None
        if not shardable and next(layer.parameters(), None) is not None:
            raise ValueError(
                f"Layer {index} ({type(layer).__name__}) has parameters that ZeRO-3 "
                "by hand cannot shard: it shards nn.Linear layers with a bias only. "
                "Build the model from nn.Linear layers and activations, e.g. with "
                "make_mlp()."
            )
    return nn.Sequential(
        *(
            ShardedLinear(layer, meter) if isinstance(layer, nn.Linear) else layer
            for layer in model
        )
    )


def gathered_state_dict(model: nn.Sequential) -> dict[str, torch.Tensor]:
    """The full weights of a ZeRO-3 model under the original model's names, gathered
    on every rank (a collective) (13)."""
    state = {}
    for index, layer in enumerate(model):
        if isinstance(layer, ShardedLinear):
            full, weight, bias = layer.gather()
            layer.meter.freed(full)
            state[f"{index}.weight"], state[f"{index}.bias"] = weight, bias
    return state


# ----------------------------------------------------------------------------------
# What a rank holds: the ledger, measured


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of memory behind ``tensors``, each buffer counted once: a view keeps
    its whole buffer alive, so it counts as the whole buffer (13)."""
    buffers = {}
    for tensor in tensors:
        if tensor is not None:
            storage = tensor.untyped_storage()
            buffers[storage.data_ptr()] = storage.nbytes()
    return sum(buffers.values())


def measure_ledger(
    parameters: Sequence[torch.Tensor],
    optimizer: torch.optim.Optimizer,
    meter: Meter | None = None,
) -> dict[str, int]:
    """Bytes this rank holds, by category: ``parameters`` (and their ``.grad``),
    Adam's moments, and the peak of gathered full layers (13).

    Adam's step counter (one number per tensor) is left out, as the paper leaves
    it out. For DTensors (FSDP2) the local shard is measured.
    """

    def local(tensor):
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor

    moments = [
        local(value)
        for state in optimizer.state.values()
        for name, value in state.items()
        if name in ("exp_avg", "exp_avg_sq")
    ]
    return {
        "parameters": storage_bytes(local(p) for p in parameters),
        "gradients": storage_bytes(
            local(p.grad) for p in parameters if p.grad is not None
        ),
        "optimizer": storage_bytes(moments),
        "gathered": meter.peak_gathered_bytes if meter else 0,
    }


def layer_numels(model: nn.Module) -> list[int]:
    """Parameters per layer that has any, in order: how ZeRO-3 groups them (13)."""
    return [
        sum(p.numel() for p in layer.parameters(recurse=False))
        for layer in model.modules()
        if next(layer.parameters(recurse=False), None) is not None
    ]


# ----------------------------------------------------------------------------------
# Training: one process, and each stage on a rank


def train_single_process(
    model: nn.Module, X: torch.Tensor, y: torch.Tensor, config: TrainConfig
) -> History:
    """The reference: Adam on the global batch in this process, notebook 08's
    batches; ``model`` is not changed (13)."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    history = History()
    batches, steps_per_epoch = run_batches(len(X), config)
    for indices in batches:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(X[indices]), y[indices])
        loss.backward()
        optimizer.step()
        history.step_loss.append(loss.item())
    history.train_loss = epoch_means(history.step_loss, steps_per_epoch)
    history.parameters = cpu_state_dict(model)
    return history


def train_stage(
    stage: str,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    step: Step | None = None,
) -> ShardedHistory:
    """Train a copy of ``model`` with ``stage`` on this rank (inside a process
    group): its history with the full weights (gathered), the bytes sent per step
    and the ledger after the last step (13). ``step`` replaces the stage's own
    step function (DDP, ZeRO-1, ZeRO-2 only)."""
    check_choice("stage", stage, STAGES)
    world_size, rank = dist.get_world_size(), dist.get_rank()
    model = copy.deepcopy(model)
    history = ShardedHistory(rank=rank, world_size=world_size)
    batches, steps_per_epoch = run_batches(len(X), config, world_size, rank)
    if stage == "ZeRO-3":
        meter = Meter()
        model = shard_model(model, meter)
        optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
        for indices in batches:
            before = meter.bytes_sent
            optimizer.zero_grad()
            loss = F.cross_entropy(model(X[indices]), y[indices])
            loss.backward()  # each layer reduce-scatters its gradient
            optimizer.step()  # Adam on this rank's chunks only
            history.step_loss.append(loss.item())
            history.bytes_sent.append(meter.bytes_sent - before)
        history.ledger = measure_ledger(list(model.parameters()), optimizer, meter)
        history.parameters = gathered_state_dict(model)
    else:
        step = step or STEPS[stage]
        flat = flatten_parameters(model)  # (P,)
        if stage == "DDP":
            shard = nn.Parameter(flat)  # all of it: every rank updates everything
        else:
            shard = nn.Parameter(shard_of(flat, rank, world_size))  # my chunk, a view
        optimizer = torch.optim.Adam([shard], lr=config.lr)
        for indices in batches:
            loss, sent = step(model, flat, shard, optimizer, X[indices], y[indices])
            history.step_loss.append(float(loss))
            history.bytes_sent.append(sent)
        history.ledger = measure_ledger([*model.parameters(), shard], optimizer)
        history.parameters = cpu_state_dict(model)
    history.train_loss = epoch_means(history.step_loss, steps_per_epoch)
    return history


def stages_worker(
    rank: int,
    world_size: int,
    runs: Sequence[tuple[str, nn.Module, torch.Tensor, torch.Tensor, TrainConfig]],
    step: Step | None = None,
) -> list[ShardedHistory]:
    """Rank function: :func:`train_stage` for each (stage, model, X, y, config) of
    ``runs``, in order, in one launch (13)."""
    return [train_stage(*run, step=step) for run in runs]


def compare_stages(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    world_size: int,
    stages: Sequence[str] = STAGES,
    timeout: float = 60.0,
) -> dict[str, list[ShardedHistory]]:
    """Train ``model`` with each of ``stages`` on ``world_size`` ranks, in one
    launch: {stage: each rank's history, by rank} (13)."""
    check_positive_int("world_size", world_size)
    for stage in stages:
        check_choice("stage", stage, STAGES)
    runs = [(stage, model, X, y, config) for stage in stages]
    per_rank = spawn(stages_worker, world_size, runs, timeout=timeout)
    return {
        stage: [results[index] for results in per_rank]
        for index, stage in enumerate(stages)
    }


def ddp_worker(
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


# ----------------------------------------------------------------------------------
# FSDP2: the library's ZeRO-3, and its sharded checkpoints


def describe_shards(model: nn.Module) -> list[dict[str, Any]]:
    """For each FSDP2 parameter (a DTensor): its name, global and local shape,
    placement, and the rows this rank holds, checked against the full tensor
    (gathered: a collective) (13)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    rows = []
    for name, parameter in model.named_parameters():
        full = parameter.full_tensor()  # all-gathered from every rank
        local = parameter.to_local()  # what this rank stores
        held = torch.arange(full.shape[0]).chunk(world_size)  # FSDP2: torch.chunk
        mine = held[rank] if rank < len(held) else torch.arange(0)
        rows.append(
            {
                "rank": rank,
                "name": name,
                "global shape": tuple(full.shape),
                "local shape": tuple(local.shape),
                "placement": str(parameter.placements[0]),
                "rows": (int(mine[0]), int(mine[-1]) + 1) if len(mine) else None,
                "rows match": torch.equal(local, full[mine]),
            }
        )
    return rows


def full_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """An FSDP2 model's full weights by name, all-gathered on every rank (a
    collective) (13)."""
    return {
        name: p.full_tensor().detach().clone() for name, p in model.named_parameters()
    }


def fully_shard_model(model: nn.Sequential) -> nn.Sequential:
    """A copy of ``model`` with ``fully_shard`` on every Linear and on the whole
    model, over an explicit CPU device mesh of all the ranks (13)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # An explicit CPU mesh: without it, a machine with GPUs would move the model to
    # CUDA even though the process group is gloo.
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = copy.deepcopy(model)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)  # one all-gather unit per layer
    fully_shard(model, mesh=mesh)
    return model


def fsdp2_worker(
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


def train_fsdp2(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    world_size: int,
    checkpoint_dir: str | Path | None = None,
    timeout: float = 60.0,
) -> list[ShardedHistory]:
    """:func:`fsdp2_worker` on ``world_size`` ranks: each rank's history, by rank
    (13)."""
    check_positive_int("world_size", world_size)
    folder = None if checkpoint_dir is None else str(checkpoint_dir)
    return spawn(fsdp2_worker, world_size, model, X, y, config, folder, timeout=timeout)


def _check_checkpoint_dir(checkpoint_dir: str | Path) -> None:
    if not (Path(checkpoint_dir) / ".metadata").is_file():
        raise FileNotFoundError(
            f"{Path(checkpoint_dir).name} holds no torch.distributed.checkpoint "
            "checkpoint (its .metadata file is missing). Pass the folder given to "
            "train_fsdp2(checkpoint_dir=...) after training finished."
        )


def load_sharded_checkpoint(model: nn.Module, checkpoint_dir: str | Path) -> nn.Module:
    """Load a checkpoint that :func:`fsdp2_worker` saved sharded over several ranks
    into ``model``, an ordinary model in this one process; returns ``model`` (13)."""
    import torch.distributed.checkpoint as dcp

    _check_checkpoint_dir(checkpoint_dir)
    state = {"model": model.state_dict()}  # the tensors to fill in place
    with warnings.catch_warnings():  # loading in one process is what we mean here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(checkpoint_dir), no_dist=True)
    model.load_state_dict(state["model"])
    return model


def fsdp2_load_worker(
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
    timeout: float = 60.0,
) -> list[dict[str, Any]]:
    """Load a checkpoint that :func:`train_fsdp2` saved on any number of ranks into
    FSDP2 on ``world_size`` ranks (:func:`fsdp2_load_worker`): each rank's
    {"parameters", "shards"}, by rank (13)."""
    check_positive_int("world_size", world_size)
    _check_checkpoint_dir(checkpoint_dir)
    return spawn(
        fsdp2_load_worker, world_size, model, str(checkpoint_dir), timeout=timeout
    )


# ----------------------------------------------------------------------------------
# The collectives of 07's ring, checked against PyTorch's (tests and notebook 13)


def collectives_worker(
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


# ----------------------------------------------------------------------------------
# The exercise: write a ZeRO-2 step, check it against one process


def check_step(
    step: Step,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    world_size: int = 2,
    tolerance: float = 1e-10,
) -> tuple[bool, str]:
    """Does ``step`` (ZeRO-2's signature, from an importable module) train like one
    process on the global batch, keep only its chunk of the gradient and send what
    a reduce-scatter and an all-gather send? (passed, what to fix) (13)."""
    check_positive_int("world_size", world_size)
    module = getattr(step, "__module__", None)
    name = getattr(step, "__qualname__", repr(step))
    found = None
    if module not in (None, "__main__", "__mp_main__"):
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            found = None
    if found is not step:
        raise WorkerNotImportableError(
            f"The step {name!r} cannot be imported by the ranks. Write it in a "
            "module (in a notebook, a %%module cell), import it from there and pass "
            "the imported function."
        )
    reference = train_single_process(model, X, y, config)
    steps = len(reference.step_loss)
    results = spawn(
        stages_worker, world_size, [("ZeRO-2", model, X, y, config)], step, timeout=60
    )
    results = [per_rank[0] for per_rank in results]
    distance = max(
        (result.parameters[key] - value).abs().max().item()
        for result in results
        for key, value in reference.parameters.items()
    )
    if distance > tolerance:
        return False, (
            f"FAIL: after {steps} steps the weights are {distance:.1e} away "
            "from one process on the global batch. Reduce-scatter the flat gradient "
            "into shard.grad, divide it by the world size, call optimizer.step(), "
            "then all-gather shard into flat."
        )
    numel = sum(value.numel() for value in reference.parameters.values())
    element_size = X.element_size()
    for rank, result in enumerate(results):
        expected = zero_bytes_sent_per_rank(
            "ZeRO-2", [numel], element_size, world_size, rank
        )
        if result.bytes_sent != [expected] * steps:
            return False, (
                f"FAIL: the weights are right, but rank {rank} reported sending "
                f"{result.bytes_sent[0]} bytes per step, not the {expected} of "
                "one reduce-scatter and one all-gather. Return the sum of the byte "
                "counts that reduce_scatter and all_gather return."
            )
        kept = result.ledger["gradients"]
        chunk = ring_chunk_sizes(numel, world_size)[rank] * element_size
        if kept != chunk:
            return False, (
                f"FAIL: the weights are right, but rank {rank} keeps {kept} bytes of "
                f"gradient instead of its chunk's {chunk}. Give shard.grad a tensor "
                "of its own (torch.empty_like(shard)), not a view of the full "
                "gradient."
            )
    return True, (
        f"PASS: on {world_size} ranks your step trains like one process (weights "
        f"within {tolerance:.0e} after {steps} steps), keeps only its chunk "
        "of the gradient and sends what ZeRO-2 sends."
    )

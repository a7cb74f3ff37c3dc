"""The ranks of notebook 15 (15).

:func:`block_rank` runs a :class:`~multigpu.tensor_parallel.TensorParallelBlock`
(with or without sequence parallelism) forward and backward and returns what a
test compares with one process; :func:`lm_rank` does the same for the tiny
language model with vocabulary-parallel embedding and cross-entropy;
:func:`dtensor_block_rank`, :func:`dtensor_lm_rank` and :func:`two_d_rank` run the
same with PyTorch's DTensor API, the last on a 2-D (dp, tp) mesh with FSDP2;
:func:`cross_entropy_rank` runs one loss on given logits. The exercises' checkers
start :func:`mlp_exercise_rank`, :func:`loss_exercise_rank` and
:func:`plan_exercise_rank`.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from multigpu.tensor_parallel import (
    TensorParallelBlock,
    TensorParallelLM,
    column_shard,
    count_communication,
    record_collectives,
    row_shard,
    saved_activation_bytes,
    sequence_chunk,
    sync_sequence_parallel_grads,
    vocab_parallel_cross_entropy,
    vocab_start,
)


def _grads(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in module.named_parameters()}


def block_rank(
    rank: int,
    world_size: int,
    block: nn.Module,
    x: torch.Tensor,
    grad_out: torch.Tensor,
    sequence_parallel: bool = False,
    seed: int = 0,
) -> dict[str, Any]:
    """Forward and backward of this rank's part of ``block`` on ``x`` (b, s, h),
    with the upstream gradient ``grad_out``; returns this rank's output, input
    gradient and parameter gradients (its shards), the collectives it ran and the
    bytes of activations it saved (15)."""
    part = TensorParallelBlock(block, rank, world_size, sequence_parallel)
    if sequence_parallel:
        x, grad_out = (sequence_chunk(t, rank, world_size) for t in (x, grad_out))
    x = x.clone().requires_grad_(True)
    with record_collectives() as ledger:
        with saved_activation_bytes(part) as saved:
            out = part(x, seed)
        out.backward(grad_out)
        sync_sequence_parallel_grads(part)
    return {
        "out": out.detach(),
        "x_grad": x.grad,
        "grads": _grads(part),
        "ledger": list(ledger),
        "activation_bytes": sum(saved.values()),
    }


def lm_rank(
    rank: int,
    world_size: int,
    lm: nn.Module,
    tokens: torch.Tensor,
    target: torch.Tensor,
) -> dict[str, Any]:
    """Loss and gradients of this rank's part of a
    :class:`~multigpu.tensor_parallel.model.TinyLM` with vocabulary-parallel
    embedding and cross-entropy; also the shape of the logits it held (15)."""
    part = TensorParallelLM(lm, rank, world_size)
    with record_collectives() as ledger:
        logits = part(tokens)  # (b, s, V/n): this rank's vocabulary only
        loss = vocab_parallel_cross_entropy(logits, target, part.start)
        loss.backward()
    return {
        "loss": loss.detach(),
        "logits_shape": tuple(logits.shape),
        "grads": _grads(part),
        "ledger": list(ledger),
    }


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (a collective), a plain tensor unchanged."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def dtensor_block_rank(
    rank: int,
    world_size: int,
    block: nn.Module,
    x: torch.Tensor,
    grad_out: torch.Tensor,
    sequence_parallel: bool = False,
) -> dict[str, Any]:
    """:func:`block_rank` with PyTorch's ``parallelize_module`` instead of the
    hand-built layers; gradients are whole (``full_tensor``) (15)."""
    from torch.distributed.device_mesh import init_device_mesh  # only these ranks

    from multigpu.tensor_parallel.dtensor import parallelize_block

    block = parallelize_block(
        copy.deepcopy(block), init_device_mesh("cpu", (world_size,)), sequence_parallel
    )
    if sequence_parallel:
        x, grad_out = (sequence_chunk(t, rank, world_size) for t in (x, grad_out))
    x = x.clone().requires_grad_(True)
    out = block(x)
    out.backward(grad_out)
    return {
        "out": out.detach(),
        "x_grad": x.grad,
        "grads": {n: _full(p.grad) for n, p in block.named_parameters()},
        "placements": {
            n: str(getattr(p.grad, "placements", "plain tensor"))
            for n, p in block.named_parameters()
        },
    }


def dtensor_lm_rank(
    rank: int,
    world_size: int,
    lm: nn.Module,
    tokens: torch.Tensor,
    target: torch.Tensor,
) -> dict[str, Any]:
    """The tiny LM split by :func:`~multigpu.tensor_parallel.dtensor.parallelize_lm`
    and its loss under ``loss_parallel``: the loss, the logits' placements and the
    whole gradients (15)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel

    from multigpu.tensor_parallel.dtensor import parallelize_lm

    lm = parallelize_lm(copy.deepcopy(lm), init_device_mesh("cpu", (world_size,)))
    logits = lm(tokens)  # a DTensor sharded on the vocabulary
    with loss_parallel():
        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten())
        loss.backward()
    return {
        "loss": _full(loss).detach(),
        "placements": str(logits.placements),
        "local_shape": tuple(logits.to_local().shape),
        "grads": {n: _full(p.grad) for n, p in lm.named_parameters()},
    }


def two_d_rank(
    rank: int,
    world_size: int,
    block: nn.Module,
    X: torch.Tensor,
    Y: torch.Tensor,
    steps: int,
    lr: float,
) -> dict[str, Any]:
    """SGD on the mean squared error for ``steps`` steps on a (dp, tp) = (2,
    world_size/2) mesh: TP inside each data-parallel replica, FSDP2 across them;
    each dp rank takes its half of the batch. Returns the whole parameters (15)."""
    from torch.distributed.device_mesh import init_device_mesh

    from multigpu.tensor_parallel.dtensor import parallelize_2d

    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    mesh = init_device_mesh("cpu", (2, world_size // 2), mesh_dim_names=("dp", "tp"))
    block = parallelize_2d(copy.deepcopy(block), mesh)
    dp = mesh["dp"].get_local_rank()
    x, y = X.chunk(2)[dp], Y.chunk(2)[dp]
    optimizer = torch.optim.SGD(block.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        ((block(x) - y) ** 2).mean().backward()
        optimizer.step()
    return {
        "coordinates": (dp, mesh["tp"].get_local_rank()),
        "placements": str(block.attn.q.weight.placements),
        "parameters": {n: _full(p.detach()) for n, p in block.named_parameters()},
    }


def cross_entropy_rank(
    rank: int,
    world_size: int,
    logits: torch.Tensor,
    target: torch.Tensor,
    loss_function: Callable[..., torch.Tensor] = vocab_parallel_cross_entropy,
) -> dict[str, Any]:
    """``loss_function(local_logits, target, start)`` on this rank's vocabulary
    columns of ``logits`` (N, V); its loss, its logits' gradient if it has one,
    and the collectives it ran (15)."""
    start = vocab_start(logits.shape[-1], rank, world_size)
    local = logits.tensor_split(world_size, dim=-1)[rank].clone().requires_grad_(True)
    with record_collectives() as ledger:
        loss = loss_function(local, target, start)
        if loss.requires_grad:
            loss.backward()
    return {"loss": loss.detach(), "grad": local.grad, "ledger": list(ledger)}


def mlp_exercise_rank(
    rank: int,
    world_size: int,
    copy_to: type[torch.autograd.Function],
    reduce_from: type[torch.autograd.Function],
    row_parallel_linear: Callable[..., torch.Tensor],
    mlp: nn.Module,
    x: torch.Tensor,
    grad_out: torch.Tensor,
) -> dict[str, Any]:
    """A tensor-parallel MLP made of the learner's f (``copy_to``), g
    (``reduce_from``, used by their ``row_parallel_linear(x_shard, weight_shard,
    bias)``): fc1 column-parallel, fc2 row-parallel. Returns the output, and if it
    has the right shape, the gradients of the input and of this rank's shards
    (15's exercise 1)."""
    w1 = column_shard(mlp.fc1.weight.detach(), rank, world_size).requires_grad_()
    b1 = column_shard(mlp.fc1.bias.detach(), rank, world_size).requires_grad_()
    w2 = row_shard(mlp.fc2.weight.detach(), rank, world_size).requires_grad_()
    b2 = mlp.fc2.bias.detach().clone().requires_grad_()
    x = x.clone().requires_grad_(True)
    hidden = F.gelu(F.linear(copy_to.apply(x), w1, b1))  # (b, s, ffn/n)
    out = row_parallel_linear(hidden, w2, b2)
    result: dict[str, Any] = {"out": out.detach()}
    if out.shape == grad_out.shape:
        out.backward(grad_out)
        result["x_grad"] = x.grad
        result["grads"] = {"fc1.weight": w1.grad, "fc1.bias": b1.grad}
        result["grads"] |= {"fc2.weight": w2.grad, "fc2.bias": b2.grad}
    return result


def loss_exercise_rank(
    rank: int,
    world_size: int,
    loss_function: Callable[..., torch.Tensor],
    cases: list[tuple[torch.Tensor, torch.Tensor]],
) -> dict[str, list]:
    """The learner's per-token ``loss_function(local_logits, target, start)`` on
    this rank's vocabulary columns of each (logits, target) of ``cases``: the
    losses, and the elements its collectives moved for each case (15's exercise
    2)."""
    losses, communicated = [], []
    for logits, target in cases:
        start = vocab_start(logits.shape[-1], rank, world_size)
        local = logits.tensor_split(world_size, dim=-1)[rank].clone()
        with torch.no_grad(), count_communication() as counter:
            losses.append(loss_function(local, target, start).detach().clone())
        communicated.append(counter.elements)
    return {"losses": losses, "communicated": communicated}


@contextlib.contextmanager
def _recorded_styles(block: nn.Module) -> Iterator[dict[str, tuple[str, tuple]]]:
    """{submodule name: (style, mesh dimension names)} for every ColwiseParallel
    and RowwiseParallel that ``parallelize_module`` applies to ``block`` inside."""
    from torch.distributed.tensor import parallel

    names = {id(module): name for name, module in block.named_modules()}
    applied: dict[str, tuple[str, tuple]] = {}
    originals = {}
    for style in (parallel.ColwiseParallel, parallel.RowwiseParallel):
        originals[style] = style.__dict__["_apply"]

        def spy(self, module, device_mesh, _original=originals[style]):
            dims = tuple(device_mesh.mesh_dim_names or ())
            applied[names.get(id(module), "?")] = (type(self).__name__, dims)
            return _original(self, module, device_mesh)

        style._apply = spy
    try:
        yield applied
    finally:
        for style, original in originals.items():
            style._apply = original


def _mesh_of(tensor: torch.Tensor) -> tuple:
    """The mesh dimension names a DTensor lives on; () for a plain tensor."""
    mesh = getattr(tensor, "device_mesh", None)
    return () if mesh is None else tuple(mesh.mesh_dim_names or ())


def plan_exercise_rank(
    rank: int,
    world_size: int,
    parallelize: Callable[..., Any],
    block: nn.Module,
    X: torch.Tensor,
    Y: torch.Tensor,
) -> dict[str, Any]:
    """The learner's ``parallelize(block, mesh)`` on a (dp, tp) = (2,
    world_size/2) mesh, then one forward and backward of the mean squared error on
    this dp group's half of the batch. Returns the styles applied, the heads the
    attention counts, the mesh of the LayerNorm weight, any error, the output and
    the whole gradients (15's exercise 4)."""
    from torch.distributed.device_mesh import init_device_mesh

    for noisy in ("torch.distributed.tensor._redistribute", "torch._subclasses"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    # FSDP2 on a submodule whose output is a view warns; the learner need not care.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    mesh = init_device_mesh("cpu", (2, world_size // 2), mesh_dim_names=("dp", "tp"))
    block = copy.deepcopy(block)
    result: dict[str, Any] = {"error": None, "stage": "parallelize"}
    with _recorded_styles(block) as applied:
        try:
            parallelize(block, mesh)
        except Exception as error:  # the learner's code: report it, do not raise
            result["error"] = f"{type(error).__name__}: {error}".splitlines()[0]
    result |= {
        "applied": applied,
        "heads": getattr(getattr(block, "attn", None), "heads", None),
        "layer_norm_mesh": _mesh_of(block.ln1.weight),
    }
    if result["error"]:
        return result
    dp = mesh["dp"].get_local_rank()
    x, y = X.chunk(2)[dp], Y.chunk(2)[dp]
    result["stage"] = "forward or backward"
    try:
        out = _full(block(x))
        ((out - y) ** 2).mean().backward()
        grads = {
            name: None if p.grad is None else _full(p.grad)
            for name, p in block.named_parameters()
        }
    except Exception as error:
        result["error"] = f"{type(error).__name__}: {error}".splitlines()[0]
        return result
    return result | {"dp": dp, "out": out.detach(), "grads": grads}

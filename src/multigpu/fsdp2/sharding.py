"""FSDP2's knobs, one call each, on an explicit CPU mesh (14b).

:func:`shard_layers` is 13's :func:`~multigpu.zero.fully_shard_model` with the knobs
passed through (``reshard_after_forward``, ``mp_policy``, a 2-D mesh for HSDP);
:func:`set_prefetch` sets explicit forward and backward prefetching to a depth;
:func:`build_on_meta` builds a model with no storage, shards it, then allocates
only this rank's shards (``to_empty``) and initialises them
(``reset_parameters``). PyTorch's files:
``torch/distributed/fsdp/_fully_shard/_fully_shard.py`` (``fully_shard``,
``FSDPModule.set_modules_to_forward_prefetch``, ``set_requires_gradient_sync``)
and ``torch/distributed/tensor/_random.py`` (random initialisation of DTensors,
correct on CUDA-like meshes only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from multigpu.miniddp import copy_from_rank0
from multigpu.zero import shard_linears_and_root


def cpu_mesh(shape: Sequence[int] | None = None, names: Sequence[str] | None = None):
    """A CPU device mesh over all the ranks: 1-D by default, or ``shape`` (e.g.
    (2, 2) with names ("replicate", "shard") for HSDP) (14b)."""
    from torch.distributed.device_mesh import init_device_mesh

    shape = tuple(shape or (dist.get_world_size(),))
    return init_device_mesh(
        "cpu", shape, mesh_dim_names=tuple(names) if names else None
    )


def shard_layers(
    model: nn.Module,
    mesh: Any = None,
    copy_first: bool = True,
    **knobs: Any,
) -> nn.Module:
    """13's :func:`~multigpu.zero.shard_linears_and_root` (``fully_shard`` on every
    layer of :func:`layers_to_shard`, then on the whole model) over ``mesh``
    (default: :func:`cpu_mesh`), with ``knobs`` passed to each call
    (``reshard_after_forward``, ``mp_policy``). A copy of ``model`` from rank 0's
    weights and buffers unless ``copy_first`` is False (14b)."""
    mesh = mesh if mesh is not None else cpu_mesh()
    if copy_first:
        model = copy_from_rank0(model)
    return shard_linears_and_root(model, mesh=mesh, **knobs)


def set_prefetch(units: Sequence[nn.Module], depth: int) -> None:
    """Explicit prefetching: unit i all-gathers units i+1..i+depth right after its
    own all-gather in forward, and units i-1..i-depth in backward; ``units`` in
    forward order. Depth 0 sets nothing and leaves FSDP2's defaults: no forward
    prefetching, and in backward the unit before this one (``_backward_prefetch``
    in ``_fsdp_param_group.py``) (14b)."""
    if depth < 0:
        raise ValueError(f"depth must be 0 or more, got {depth}. Pass e.g. depth=1.")
    if depth == 0:
        return
    for index, unit in enumerate(units):
        unit.set_modules_to_forward_prefetch(list(units[index + 1 : index + 1 + depth]))
        unit.set_modules_to_backward_prefetch(
            list(reversed(units[max(index - depth, 0) : index]))
        )


def build_on_meta(
    build: Callable[[], nn.Module],
    mesh: Any = None,
    init: Callable[[nn.Module], None] | None = None,
    **knobs: Any,
) -> nn.Module:
    """Build ``build()`` on the meta device (shapes, no storage), shard it with
    :func:`shard_layers`, allocate only this rank's shards (``to_empty``) and fill
    them: ``init(model)`` if given, else ``reset_parameters()`` of every module
    that has one. Buffers are left for ``init``: ``to_empty`` allocates them
    uninitialised (14b)."""
    with torch.device("meta"):
        model = build()
    model = shard_layers(model, mesh, copy_first=False, **knobs)
    model.to_empty(device="cpu")
    if init is not None:
        init(model)
    else:
        for module in model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
    return model


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole, unsharded state dict of an FSDP2 model, on rank 0 only (an empty
    dict elsewhere), in CPU memory: ``get_model_state_dict`` with
    ``full_state_dict=True, cpu_offload=True``; a collective (14b)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def load_full_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Fill an FSDP2 model's shards from a whole state dict that only rank 0 holds
    (``set_model_state_dict`` with ``broadcast_from_rank0=True``): how a model
    built on the meta device gets the weights of a model built in one process;
    a collective (14b)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, state, options=options)

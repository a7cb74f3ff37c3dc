"""FSDP2: the library's ZeRO-3, and its sharded checkpoints (13).

PyTorch's ``fully_shard`` on each layer (:func:`fully_shard_model`), on an explicit
CPU device mesh; its parameters are ``DTensor`` s whose rows are split over the
ranks (:func:`describe_shards`), and ``torch.distributed.checkpoint`` (DCP) saves
one file per rank, which :func:`load_sharded_checkpoint` reads back into an ordinary
model in one process. The ranks that train and load FSDP2, and their launchers, are
in :mod:`multigpu.ranks.zero`. PyTorch's files:
https://github.com/pytorch/pytorch/tree/main/torch/distributed/fsdp/_fully_shard and
https://github.com/pytorch/pytorch/tree/main/torch/distributed/checkpoint.
"""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from multigpu.miniddp import copy_from_rank0


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
    """An FSDP2 model's full weights by name on every rank: DTensors all-gathered (a
    collective), plain tensors copied (13, 14b)."""
    return {
        name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
        for name, p in model.named_parameters()
    }


def fully_shard_model(model: nn.Module) -> nn.Module:
    """A copy of ``model``, from rank 0's weights and buffers (broadcast, as DDP
    does), with ``fully_shard`` on every Linear and on the whole model, over an
    explicit CPU device mesh of all the ranks (13). A Linear holding a weight tied
    to another layer is left to the whole model's unit, which shards it once."""
    from torch.distributed.device_mesh import init_device_mesh

    # An explicit CPU mesh: without it, a machine with GPUs would move the model to
    # CUDA even though the process group is gloo.
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = copy_from_rank0(model)
    return shard_linears_and_root(model, mesh=mesh)


def layers_to_shard(model: nn.Module) -> list[nn.Module]:
    """The Linear layers that become units of their own, in ``modules()`` order: a
    Linear whose weight is tied to another layer's stays in the root's unit
    (FSDP2 refuses a tied weight split between two units) (13, 14b)."""
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    return [
        layer
        for layer in model.modules()
        if isinstance(layer, nn.Linear)
        and layer is not model
        and not any(uses[id(p)] > 1 for p in layer.parameters())
    ]


def shard_linears_and_root(model: nn.Module, **fully_shard_kwargs) -> nn.Module:
    """``fully_shard(layer, **fully_shard_kwargs)`` on every layer of
    :func:`layers_to_shard`, then on ``model`` itself; returns ``model`` (13, 14)."""
    from torch.distributed.fsdp import fully_shard

    for layer in layers_to_shard(model):
        fully_shard(layer, **fully_shard_kwargs)  # one all-gather unit per layer
    fully_shard(model, **fully_shard_kwargs)
    return model


def check_checkpoint_dir(checkpoint_dir: str | Path) -> None:
    """Raise FileNotFoundError unless ``checkpoint_dir`` holds a DCP checkpoint
    (its ``.metadata`` file) (13)."""
    if not (Path(checkpoint_dir) / ".metadata").is_file():
        raise FileNotFoundError(
            f"{Path(checkpoint_dir).name} holds no torch.distributed.checkpoint "
            "checkpoint (its .metadata file is missing). Pass the folder given to "
            "train_fsdp2(checkpoint_dir=...) after training finished."
        )


def load_sharded_checkpoint(model: nn.Module, checkpoint_dir: str | Path) -> nn.Module:
    """Load a checkpoint that :func:`~multigpu.ranks.zero.fsdp2_rank` saved sharded
    over several ranks into ``model``, an ordinary model in this one process;
    returns ``model`` (13)."""
    import torch.distributed.checkpoint as dcp

    check_checkpoint_dir(checkpoint_dir)
    state = {"model": model.state_dict()}  # the tensors to fill in place
    with warnings.catch_warnings():  # loading in one process is what we mean here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(checkpoint_dir), no_dist=True)
    model.load_state_dict(state["model"])
    return model

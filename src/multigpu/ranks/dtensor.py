"""The ranks of notebook 13's DTensor primer (13).

A tensor placed on a 1-D mesh with ``Shard(0)`` and ``Replicate()`` and
redistributed from one to the other (:func:`placements_rank`), a ``Partial()`` made
by a matmul whose inner dimension is split (:func:`partial_rank`), and a 2-D mesh's
rows and columns (:func:`mesh_2d_rank`). Each returns plain lists and strings, and
the collectives that each ``redistribute`` ran, counted by DTensor's own
``CommDebugMode`` (``torch/distributed/tensor/debug/_comm_mode.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode


def _collectives(comm: CommDebugMode) -> dict[str, int]:
    """{collective's name: calls}, e.g. {"all_gather_into_tensor": 1}."""
    return {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()}


def placements_rank(rank: int, world_size: int, numel: int) -> dict[str, Any]:
    """Rank function: ``torch.arange(numel)`` on a 1-D CPU mesh of all the ranks,
    sharded by rows and replicated; what this rank's ``to_local()`` holds for each,
    and for ``redistribute`` from Shard(0) to Replicate() and back, with the
    collectives each ran, and ``full_tensor()`` of the sharded one (13)."""
    mesh = init_device_mesh("cpu", (world_size,))
    tensor = torch.arange(float(numel))  # (numel,)
    sharded = distribute_tensor(tensor, mesh, [Shard(0)])
    replicated = distribute_tensor(tensor, mesh, [Replicate()])
    with CommDebugMode() as to_replicate:
        gathered = sharded.redistribute(mesh, [Replicate()])
    with CommDebugMode() as to_shard:
        cut = gathered.redistribute(mesh, [Shard(0)])
    return {
        "mesh": str(mesh),
        "global shape": tuple(sharded.shape),
        "placements": {
            "Shard(0)": str(sharded.placements[0]),
            "Replicate()": str(replicated.placements[0]),
        },
        "local": {
            "Shard(0)": sharded.to_local().tolist(),
            "Replicate()": replicated.to_local().tolist(),
            "S(0) -> R": gathered.to_local().tolist(),
            "R -> S(0)": cut.to_local().tolist(),
            "full_tensor()": sharded.full_tensor().tolist(),  # the whole tensor
        },
        "collectives": {
            "S(0) -> R": _collectives(to_replicate),
            "R -> S(0)": _collectives(to_shard),
        },
    }


def partial_rank(rank: int, world_size: int) -> dict[str, Any]:
    """Rank function: x (1, n) split by columns times w (n, n) split by rows, with n
    the world size: each rank multiplies its column of x by its row of w, so the
    product is Partial(); redistributed to Replicate() and to Shard(1), with the
    collectives each ran (13)."""
    mesh = init_device_mesh("cpu", (world_size,))
    x = torch.arange(1.0, world_size + 1).reshape(1, world_size)  # (1, n)
    w = torch.arange(float(world_size * world_size)).reshape(world_size, world_size)
    x_columns = distribute_tensor(x, mesh, [Shard(1)])  # each rank: 1 column of x
    w_rows = distribute_tensor(w, mesh, [Shard(0)])  # each rank: 1 row of w
    with CommDebugMode() as multiply:
        product = x_columns @ w_rows  # (1, n): this rank's part of the sum
    with CommDebugMode() as to_replicate:
        total = product.redistribute(mesh, [Replicate()])
    with CommDebugMode() as to_shard:
        cut = product.redistribute(mesh, [Shard(1)])
    return {
        "placement": str(product.placements[0]),
        "local": {
            "x": x_columns.to_local().tolist(),
            "w": w_rows.to_local().tolist(),
            "Partial()": product.to_local().tolist(),
            "P -> R": total.to_local().tolist(),
            "P -> S(1)": cut.to_local().tolist(),
        },
        "x @ w": (x @ w).tolist(),
        "collectives": {
            "x @ w": _collectives(multiply),
            "P -> R": _collectives(to_replicate),
            "P -> S(1)": _collectives(to_shard),
        },
    }


def mesh_2d_rank(
    rank: int, world_size: int, shape: Sequence[int], dim_names: Sequence[str]
) -> dict[str, Any]:
    """Rank function: a 2-D CPU mesh of ``shape`` named ``dim_names``; this rank's
    coordinate, the ranks of its group along each dim (``mesh[name]``), and what it
    holds of ``torch.arange(8)`` placed (Replicate(), Shard(0)) (13)."""
    mesh = init_device_mesh("cpu", tuple(shape), mesh_dim_names=tuple(dim_names))
    placed = distribute_tensor(torch.arange(8.0), mesh, [Replicate(), Shard(0)])
    return {
        "mesh": mesh.mesh.tolist(),
        "coordinate": tuple(mesh.get_coordinate()),
        "groups": {name: mesh[name].mesh.tolist() for name in dim_names},
        "placements": [str(p) for p in placed.placements],
        "local": placed.to_local().tolist(),
    }

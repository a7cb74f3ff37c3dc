"""What each way of pretending to be many ranks supports, found by running it (20).

:func:`support_table` runs the same probes on 4 ranks of each: the fake process
group (:mod:`multigpu.cluster.fake`), the threaded one
(:mod:`multigpu.cluster.threaded`) and LocalTensor (:mod:`multigpu.cluster.local`),
and reports what rank 0 sees, or the first line of the real error. The probes:
an all-reduce of rank + 1 (the right sum on 4 ranks is 10), an all-to-all, a
send from rank 0 to rank 1, and one FSDP2 step.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

from multigpu.cluster.fake import TwoLayerMLP, fake_world
from multigpu.cluster.threaded import run_threaded

PROBES = ("all_reduce", "all_to_all_single", "send/recv", "FSDP2 step")
WAYS = ("fake", "threaded", "LocalTensor")


def _error(error: BaseException) -> str:
    lines = str(error).strip().splitlines() or [""]
    return f"error: {type(error).__name__}: {lines[0][:70]}"


def _fsdp2_step(world_size: int) -> str:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world_size,))
    model = fully_shard(TwoLayerMLP(), mesh=mesh)
    model(torch.ones(2, 8)).sum().backward()
    return "runs"


def _rank_values(rank: int, world_size: int, made) -> dict[str, str]:
    """The probes on ``rank``; ``made(f)`` builds a tensor holding f(r) on rank r."""
    found = {}
    try:
        values = made(lambda r: torch.full((1,), float(r + 1)))
        dist.all_reduce(values)
        found["all_reduce"] = f"sum = {_seen(values):g}"
    except Exception as error:  # the probe reports the error instead
        found["all_reduce"] = _error(error)
    try:
        sent = made(lambda r: torch.arange(world_size, dtype=torch.float32) + 10 * r)
        received = made(lambda r: torch.zeros(world_size))
        dist.all_to_all_single(received, sent)
        found["all_to_all_single"] = f"rank 0 got {_seen(received, all_values=True)}"
    except Exception as error:
        found["all_to_all_single"] = _error(error)
    try:
        message = made(lambda r: torch.full((1,), 7.0 if r == 0 else 0.0))
        if rank == 0:
            dist.send(message, dst=1)
        elif rank == 1:
            dist.recv(message, src=0)
        found["send/recv"] = "returns"
    except Exception as error:
        found["send/recv"] = _error(error)
    try:
        found["FSDP2 step"] = _fsdp2_step(world_size)
    except Exception as error:
        found["FSDP2 step"] = _error(error)
    return found


def _seen(tensor: torch.Tensor, all_values: bool = False):
    local = getattr(tensor, "_local_tensors", {0: tensor})[0]
    return [round(v) for v in local.tolist()] if all_values else local.item()


def _threaded_rank(rank: int, world_size: int) -> dict[str, str]:
    return _rank_values(rank, world_size, lambda f: f(rank))


def support_table(world_size: int = 4) -> dict[str, dict[str, str]]:
    """{way: {probe: what rank 0 saw, or "error: ..."}} for the fake group, the
    threaded group and LocalTensor on ``world_size`` ranks (20)."""
    from torch.distributed._local_tensor import LocalTensorMode, rank_map

    table = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fake_world(world_size):
            table["fake"] = _rank_values(0, world_size, lambda f: f(0))
        table["threaded"] = run_threaded(_threaded_rank, world_size)[0]
        with fake_world(world_size), LocalTensorMode(world_size):
            table["LocalTensor"] = _rank_values(0, world_size, rank_map)
    return table

"""Who this process is under torchrun or spawn, its device, values over all ranks (09).

Support code: :func:`setup` joins the process group torchrun prepared,
:func:`rank_device` is this rank's GPU under nccl, else the CPU;
:func:`is_main_process` and :func:`reduce_value` are what every training loop uses.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from multigpu.core.checks import check_choice
from multigpu.core.devices import choose_backend

# The example command that error messages give (the torchrun script of 09).
COMMAND = "torchrun --standalone --nproc-per-node=2 -m multigpu.ddp --epochs 2"
ENV_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE")  # what torchrun sets in every rank


class NotLaunchedByTorchrunError(RuntimeError):
    """The script was started without torchrun: RANK etc. are not set (09)."""


class NotEnoughGPUsError(RuntimeError):
    """nccl with more ranks on this machine than it has GPUs (09)."""


@dataclass(frozen=True)
class RankEnv:
    """Who this process is, as torchrun tells it through the environment (09)."""

    rank: int  # 0 .. world_size - 1, over all machines
    local_rank: int  # 0 .. processes on this machine - 1: the GPU to use
    world_size: int  # processes in all


def read_rank_env(environ: Mapping[str, str] | None = None) -> RankEnv:
    """``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` from the environment (09)."""
    environ = os.environ if environ is None else environ
    missing = [name for name in ENV_NAMES if name not in environ]
    if missing:
        raise NotLaunchedByTorchrunError(
            f"{', '.join(missing)} not set: this script runs one process per rank "
            "and must be started by torchrun, which starts them and sets these "
            f"variables. Run it as: {COMMAND}"
        )
    return RankEnv(*(int(environ[name]) for name in ENV_NAMES))


TABLE_NAMES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE")


def rank_table() -> list[dict[str, str]]:
    """What torchrun told each rank (``RANK``, ``LOCAL_RANK``, ``GROUP_RANK``: the
    node's number, ``LOCAL_WORLD_SIZE``, ``WORLD_SIZE``), gathered from every rank
    and sorted by rank; a collective (11)."""
    mine = {name: os.environ.get(name, "-") for name in TABLE_NAMES}
    rows: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rows, mine)
    return sorted(rows, key=lambda row: int(row["RANK"]))


def setup(
    backend: str = "auto", timeout: timedelta | None = None
) -> tuple[RankEnv, torch.device]:
    """Join the process group torchrun prepared; return (who I am, my device) (09).

    ``backend="auto"``: gloo on CPU, nccl when GPUs are visible (one per rank, chosen
    by ``LOCAL_RANK`` and set with ``torch.cuda.set_device`` before anything else
    touches CUDA, so that no rank creates a context on GPU 0). ``timeout`` bounds
    the meeting and every collective (None: PyTorch's default).
    """
    env = read_rank_env()
    backend = choose_backend() if backend == "auto" else backend
    check_choice("backend", backend, ("gloo", "nccl"))
    device = torch.device("cpu")
    if backend == "nccl":
        gpus = torch.cuda.device_count()
        if env.local_rank >= gpus:
            raise NotEnoughGPUsError(
                f"nccl needs one GPU per rank, but this is local rank "
                f"{env.local_rank} on a machine with {gpus} GPU(s) visible. Start at "
                f"most {gpus} processes per node (torchrun --nproc-per-node={gpus}), "
                "or pass --backend gloo."
            )
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():  # reads MASTER_ADDR/PORT, RANK, WORLD_SIZE
        dist.init_process_group(backend, timeout=timeout)
    return env, device


def rank_device() -> torch.device:
    """This rank's device in a running group: its GPU under nccl, else the CPU (09)."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def is_main_process() -> bool:
    """True on rank 0, or without a process group: the rank that prints and saves."""
    return not dist.is_initialized() or dist.get_rank() == 0


def reduce_value(value: torch.Tensor, average: bool = True) -> torch.Tensor:
    """``value`` summed (or averaged) over the ranks, as a new tensor; every rank
    gets the same result. The original is not changed (09)."""
    result = value.detach().clone()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(result, op=dist.ReduceOp.SUM)
        if average:
            result /= dist.get_world_size()
    return result

"""Joining and leaving the process group, and asking it who this process is:
``hvd.init()``, ``hvd.rank()``, ``hvd.size()``, ``hvd.local_rank()``,
``hvd.local_size()``, ``hvd.shutdown()`` (12)."""

from __future__ import annotations

import os

import torch.distributed as dist

from multigpu.horovod_api._state import _require_init, _state
from multigpu.runtime.rank import ENV_NAMES, NotLaunchedByTorchrunError, setup


def init() -> None:
    """Join the process group: create it from torchrun's environment if it does
    not exist yet, else use it (as in a worker of :func:`multigpu.runtime.launch.spawn`)
    (12)."""
    if not dist.is_initialized():
        missing = [name for name in ENV_NAMES if name not in os.environ]
        if missing:
            raise NotLaunchedByTorchrunError(
                f"hvd.init() found no process group, and {', '.join(missing)} are "
                "not set: the ranks were not started by torchrun, which plays "
                "horovodrun's part here. Start the script with `torchrun "
                "--nproc-per-node=N train.py` (for `horovodrun -np N python "
                "train.py`), or call hvd.init() in a worker started by "
                "multigpu.runtime.launch.spawn."
            )
        setup()  # gloo on CPU, nccl with one GPU per rank
        _state.owns_group = True
    _state.initialized = True


def is_initialized() -> bool:
    """Whether :func:`init` was called and its process group still exists (12)."""
    return _state.initialized and dist.is_initialized()


def shutdown() -> None:
    """Undo :func:`init`: destroy the process group if init created it (a group
    made by spawn stays for spawn to end) (12)."""
    if _state.owns_group and dist.is_initialized():
        dist.destroy_process_group()
    _state.initialized = _state.owns_group = False


def rank() -> int:
    """This process's rank, 0 to size() - 1 over all machines (12)."""
    _require_init("rank")
    return dist.get_rank()


def size() -> int:
    """The number of processes over all machines (12)."""
    _require_init("size")
    return dist.get_world_size()


def local_rank() -> int:
    """This process's number on its machine, the GPU it uses: torchrun's
    ``LOCAL_RANK``, else :func:`rank` (all ranks on one machine) (12)."""
    _require_init("local_rank")
    return int(os.environ.get("LOCAL_RANK", dist.get_rank()))


def local_size() -> int:
    """The number of processes on this machine: torchrun's ``LOCAL_WORLD_SIZE``,
    else :func:`size` (12)."""
    _require_init("local_size")
    return int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))

"""Small workers for :mod:`multigpu.launch`: its tests and notebook 07 use them.

Workers must live in an importable module (not a notebook), so they live here. Run
as a module it is also the torchrun example of ``launch.run_torchrun``::

    torchrun --standalone --nproc-per-node=2 -m multigpu._launch_examples
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist


def whoami(rank: int, world_size: int) -> dict:
    """What one rank sees: its rank, the group size, backend and thread limits (07)."""
    return {
        "rank": rank,
        "world_size": world_size,
        "dist_rank": dist.get_rank(),
        "backend": dist.get_backend(),
        "threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
    }


def sum_of_ranks(rank: int, world_size: int, offset: int = 1) -> int:
    """all_reduce (rank + offset) over the group; every rank returns the sum (07)."""
    value = torch.tensor([rank + offset])
    dist.all_reduce(value)
    return int(value.item())


def environment_value(rank: int, world_size: int, name: str) -> str | None:
    """The value of environment variable ``name`` in this rank."""
    return os.environ.get(name)


def fail_on_rank(rank: int, world_size: int, bad_rank: int) -> int:
    """Rank ``bad_rank`` raises ValueError; the others wait in a collective (07)."""
    dist.barrier()  # every rank has finished joining: the failure comes later
    if rank == bad_rank:
        raise ValueError(f"rank {rank} found a bad batch")
    return sum_of_ranks(rank, world_size)


def kill_rank(rank: int, world_size: int, bad_rank: int) -> int:
    """Rank ``bad_rank`` dies from SIGKILL (like the out-of-memory killer) (07)."""
    dist.barrier()
    if rank == bad_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    return sum_of_ranks(rank, world_size)


def skip_collective(
    rank: int, world_size: int, absent_rank: int, sleep_s: float
) -> int:
    """Rank ``absent_rank`` sleeps instead of joining the all_reduce (07)."""
    if rank == absent_rank:
        time.sleep(sleep_s)
        return -1
    return sum_of_ranks(rank, world_size)


def wait_for_each_other(rank: int, world_size: int) -> int:
    """Every rank waits to receive from its neighbour and none sends: all time out."""
    incoming = torch.zeros(1)
    dist.recv(incoming, src=(rank + 1) % world_size)
    return int(incoming.item())


def start_sleeper_then_fail(rank: int, world_size: int, pid_file: str) -> None:
    """Start a long-sleeping subprocess, record its pid in ``pid_file``, then raise."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(f"{pid_file}.{rank}", "w") as handle:
        handle.write(str(sleeper.pid))
    raise RuntimeError(f"rank {rank} failed after starting a subprocess")


def unpicklable_result(rank: int, world_size: int):
    """Returns something that cannot be sent back to the parent (a generator)."""
    return (i for i in range(3))


def main() -> None:
    """torchrun entry: every rank adds rank + 1; rank 0 prints the sum."""
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    total = sum_of_ranks(rank, world_size)
    if rank == 0:
        print(f"world_size={world_size} sum={total} threads={torch.get_num_threads()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""The torchrun example of :func:`multigpu.runtime.launch.run_torchrun`: what each rank
of ``torchrun --standalone --nproc-per-node=2 -m multigpu.ranks.torchrun_example``
runs (``__main__.py`` is the entry point).

With ``ddp-exit [return|exit_rank]`` it is the demonstration of why a torchrun
script ends with :func:`multigpu.runtime.launch.exit_rank` (:func:`ddp_exit_demo`).
"""

from __future__ import annotations

import gc
import os

import torch
import torch.distributed as dist

from multigpu.ranks.collectives import sum_of_ranks_rank


def print_sum_of_ranks() -> None:
    """torchrun entry: every rank adds rank + 1; rank 0 prints the sum (tests of
    launch.run_torchrun)."""
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    total = sum_of_ranks_rank(rank, world_size)
    if rank == 0:
        print(f"world_size={world_size} sum={total} threads={torch.get_num_threads()}")
    dist.destroy_process_group()


def native_threads() -> int | None:
    """The threads of this process, C++ ones included (Linux), else None."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def ddp_exit_demo() -> None:
    """torchrun entry (``-m multigpu.ranks.torchrun_example ddp-exit
    return|exit_rank``): build a DDP model, train one step, drop it and collect
    garbage, all_gather, then ``destroy_process_group()`` and end at once, as a
    training script does. Rank 0 prints the process's native threads before
    joining, in the group, and after destroying it: once DDP was built, the gloo
    threads outlive the group, which is why a torchrun script ends with
    :func:`multigpu.runtime.launch.exit_rank` (tests and ``bench/exit_abort.py``)."""
    from torch.nn.parallel import DistributedDataParallel

    torch.ones(2).sum()  # start torch's own threads before the first count
    before = native_threads()
    dist.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Linear(8, 4))
    model(torch.randn(4, 8)).sum().backward()
    del model
    gc.collect()
    mine = torch.ones(2, dtype=torch.float64)
    gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    during = native_threads()
    rank = dist.get_rank()
    dist.destroy_process_group()
    if rank == 0:
        print(
            f"native threads: {before} before, {during} in the group, "
            f"{native_threads()} after destroy_process_group",
            flush=True,
        )
